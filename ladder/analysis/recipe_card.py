"""The recipe card of one target rung: the plan's numbers (architecture, tokens, compute) plus what
the given laws predict (hyperparameters, BPB). Library code: `ladder extrapolate` renders it, the
demo puts it in its report."""

from __future__ import annotations

from typing import Any

from ladder.plan.compute import plan_compute
from ladder.plan.generator import plan_rung
from ladder.plan.recipe import load_recipe


def build_card(recipe_name: str, rung: int, laws: dict[str, Any], tpp: float | None = None) -> dict[str, Any]:
    """The recipe card of one target rung: the plan's numbers plus what the given laws predict."""
    from fits.extrapolate import recipe_card  # the fitting stack loads only when a card is built

    recipe = load_recipe(recipe_name)
    spec = plan_rung(recipe, rung, tpp)
    pool = recipe.gpu_pool
    compute = plan_compute(spec.train_flops, gpus=pool.default_gpus, peak_flops_per_gpu=pool.peak_bf16_flops_per_gpu,
                           mfu=pool.default_mfu, goodput=pool.default_goodput)
    plan = spec.to_dict()
    target = {k: plan[k] for k in ("recipe", "L", "n_layers", "d_model", "n_heads", "head_dim", "n_kv_heads_global",
                                   "n_kv_heads_local", "n_experts", "top_k", "n_shared_experts", "latent_dim",
                                   "expert_hidden", "vocab_size", "params_total", "params_active", "tokens", "tpp",
                                   "batch_tokens", "steps", "flops_per_token", "train_flops") if k in plan}
    target["compute"] = {"pool": pool.name, "gpus": pool.default_gpus, "mfu": pool.default_mfu,
                         "goodput": pool.default_goodput, "wall_clock_days": compute.wall_clock_days,
                         "gpu_hours": compute.gpu_hours}
    provenance = {"laws_files": laws.get("files", []), "experiment": laws.get("experiment"),
                  "hparam_laws": "fitted" if (laws.get("hparams") or {}).get("selected")
                  else f"recipe fallback: {recipe.hparam_laws.source}",
                  "dropout_law": "fitted" if (laws.get("hparams") or {}).get("dropout") else "recipe's fixed dropout",
                  "power_laws": {d: {"n_points": f.n_points, "rows_used": f.rows_used, "code_version": f.code_version}
                                 for d, f in laws.get("power_law", {}).items()}}
    return recipe_card(target, power_laws=laws.get("power_law", {}), hparams=laws.get("hparams"),
                       dropout=(laws.get("hparams") or {}).get("dropout"),
                       report_laws=recipe.hparam_laws.model_dump(exclude={"source"}), report_source=recipe.hparam_laws.source,
                       recipe_dropout=recipe.dropout, provenance=provenance)
