"""The recipe card of one target rung: the plan's numbers (architecture, tokens, compute) plus what
the given laws predict (hyperparameters, BPB). Library code: `ladder extrapolate` renders it, the
demo puts it in its report; both show the same rows (`card_rows`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ladder.errors import LadderInputError
from ladder.plan.compute import plan_compute
from ladder.plan.generator import plan_rung
from ladder.plan.recipe import load_recipe
from ladder.plan.values import finite_real

CARD_CI_LEVEL = 0.95  # every interval on the card (fits.extrapolate's interval95)


def build_card(recipe_ref: str | Path, rung: int, laws: dict[str, Any], tpp: float | None = None) -> dict[str, Any]:
    """The recipe card of one target rung of a recipe (a shipped name or a path to a recipe file): the
    plan's numbers plus what the given laws predict."""
    from fits.errors import FitInputError
    from fits.extrapolate import recipe_card  # the fitting stack loads only when a card is built

    recipe = load_recipe(recipe_ref)
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
                  **({"runs": laws["runs"]} if laws.get("runs") else {}),
                  "hparam_laws": "fitted" if (laws.get("hparams") or {}).get("selected")
                  else f"recipe fallback: {recipe.hparam_laws.source}",
                  "dropout_law": "fitted" if (laws.get("hparams") or {}).get("dropout") else "recipe's fixed dropout",
                  "power_laws": {d: {"n_points": f.n_points, "rows_used": f.rows_used, "code_version": f.code_version}
                                 for d, f in laws.get("power_law", {}).items()}}
    try:
        card = recipe_card(target, power_laws=laws.get("power_law", {}), hparams=laws.get("hparams"),
                           dropout=(laws.get("hparams") or {}).get("dropout"),
                           report_laws=recipe.hparam_laws.model_dump(exclude={"source"}),
                           report_source=recipe.hparam_laws.source, recipe_dropout=recipe.dropout, provenance=provenance)
    except FitInputError as err:  # laws that give no usable value at this target (e.g. an LR of e^1000)
        raise LadderInputError(f"at L{spec.L}: {err.detail}", where=", ".join(laws.get("files", [])) or None,
                               field="--laws") from None
    for domain, b in card["predicted_bpb"].items():
        x_range = laws["power_law"][domain].extra.get("x_range")
        if x_range:
            b.update(data_position(spec.train_flops, x_range))
    if laws.get("arms"):
        card["data_arms"] = data_arms(laws["arms"], spec.train_flops)
        card["warnings"] += card["data_arms"]["warnings"]
        card["provenance"]["arms_files"] = {b: s.get("files", []) for b, s in laws["arms"].items()}
    return card


def data_arms(sections: dict[str, dict[str, Any]], train_flops: float, level: float = CARD_CI_LEVEL) -> dict[str, Any]:
    """The card's "data arms": each arm's EG against its baseline, per domain, carried to the target's
    compute along its trend (`fits.eg_extrapolate`), with where the target lies against the arm's rungs."""
    from fits.eg_extrapolate import arms_at, arms_warnings
    from fits.results import jsonable

    per_baseline = arms_at(sections, train_flops, level)
    for baseline, per_arm in per_baseline.items():
        for arm, per_domain in per_arm.items():
            for domain, cell in per_domain.items():
                cell.update(data_position(train_flops, sections[baseline]["arms"][arm][domain]["train_flops_range"]))
    return jsonable({"ci_level": level, "baselines": per_baseline, "warnings": arms_warnings(per_baseline)})


SAME_FLOPS_RTOL = 1e-6  # relative: compute values this close are one rung's


def data_position(train_flops: float, x_range: list[float]) -> dict[str, Any]:
    """Where the target's compute lies against the FLOPs a law was fitted on: "beyond" the largest,
    "below" the smallest, or "inside" (a prediction inside is an interpolation, not an extrapolation)."""
    # A NaN compares false either way, so a NaN range or compute would read "inside": refused instead.
    if not (finite_real(train_flops) and train_flops > 0):
        raise LadderInputError(f"the target's training FLOPs must be a positive, finite number, got {train_flops!r}",
                               field="train_flops")
    bounds = None if isinstance(x_range, (str, bytes)) or not hasattr(x_range, "__iter__") else list(x_range)
    if (bounds is None or len(bounds) != 2
            or not all(finite_real(v) and v > 0 for v in bounds) or bounds[0] > bounds[1]):
        raise LadderInputError(f"the fitted FLOPs range is [smallest, largest], two positive finite numbers, got "
                               f"{x_range!r}", field="x_range")
    lo, hi = float(bounds[0]), float(bounds[1])
    # equal up to the digits a table keeps (a CSV's 1.325465468e+13 is the plan's 13254654680064): inside
    where = ("beyond" if train_flops > hi * (1 + SAME_FLOPS_RTOL) else
             "below" if train_flops < lo * (1 - SAME_FLOPS_RTOL) else "inside")
    return {"data_flops_range": [lo, hi], "data_position": where}


def _position_note(b: dict[str, Any]) -> str:
    where, factor = b.get("data_position"), b.get("extrapolation_factor")
    if where == "inside":
        return " (inside the data)"
    if where == "below":
        return " (below the data)"
    return f" (×{factor:.3g} beyond the data)" if factor else ""


def human_count(n: float) -> str:
    """A count in three significant digits with its unit: 1_234_567 → "1.23M". The unit is chosen on the
    value as rounded, so 999_950 is "1M", not "1e+03k"."""
    if not math.isfinite(n):
        return f"{n}"
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(float(f"{n:.3g}")) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.3g}"


def _interval(iv) -> str:
    return f"[{iv[0]:.4g}, {iv[1]:.4g}]" if iv else "-"


def card_rows(card: dict[str, Any]) -> list[list[str]]:
    """The card as (name, value, interval) rows of text, built once for every place that shows a card
    (`ladder extrapolate`'s table, the demo report's)."""
    t, hp = card["target"], card["hyperparameters"]
    rows = [["architecture", f"L{t['L']}: d_model {t['d_model']}, {t['n_heads']} heads × {t['head_dim']}, kv "
             f"{t['n_kv_heads_global']}/{t['n_kv_heads_local']}, {t['n_experts']} experts top-{t['top_k']} "
             f"+{t['n_shared_experts']} shared, latent {t['latent_dim']}", ""],
            ["parameters", f"{human_count(t['params_total'])} total / {human_count(t['params_active'])} active", ""],
            ["tokens / TPP", f"{human_count(t['tokens'])} / {t['tpp']:g}", ""],
            ["batch / steps", f"{human_count(t['batch_tokens'])} tokens / {t['steps']:,}", ""],
            ["training FLOPs", f"{t['train_flops']:.3e}", ""],
            ["compute", f"{t['compute']['wall_clock_days']:.1f} days on {t['compute']['gpus']:,} {t['compute']['pool']} "
             f"(MFU {t['compute']['mfu']:.0%}, goodput {t['compute']['goodput']:.0%})", ""]]
    for name, label in (("lr", "LR*"), ("wd", "WD*"), ("lr_wd_product", "LR*·WD*"), ("dropout", "dropout*")):
        if name in hp:
            rows.append([label, f"{hp[name]['value']:.4g}", _interval(hp[name].get("interval95"))])
    for domain, b in card["predicted_bpb"].items():
        ext = _position_note(b)
        ext += " (E = 0: no floor seen)" if b.get("floor_at_zero") else ""
        # The one interval rule (fits: FitResult.interval_note): a law without an interval shows "n/a".
        interval = "n/a" if b.get("interval") is None and b.get("interval_note") else _interval(b.get("interval"))
        if b.get("interval_shares"):  # what the interval is made of (fits.prediction): what would narrow it
            from fits.prediction import describe_shares

            interval += f" ({describe_shares(b['interval_shares'])})"
        if b.get("heldout_sampling_common"):  # the BPB is on the ladder's held-out set; the domain's own differs
            interval += f"; held-out set ±{b['heldout_sampling_common']:.1%} common to every rung, not in it"
        rows.append([f"BPB {domain}", f"{b['value']:.4f}{ext}", interval])
    return rows


def eg_pct(value: float) -> str:
    """An efficiency gain as the percentage it saves or costs: 1.13 → "+13.0%"."""
    return f"{value - 1:+.1%}"


def arms_rows(card: dict[str, Any]) -> list[list[str]]:
    """The card's data arms as (baseline, arm, domain, EG − 1, interval, reading, trend) rows of text; none
    when the card has no arms."""
    rows = []
    for baseline, per_arm in (card.get("data_arms") or {}).get("baselines", {}).items():
        for arm, per_domain in per_arm.items():
            for domain, c in per_domain.items():
                iv = c.get("interval")
                interval = f"[{eg_pct(iv[0])}, {eg_pct(iv[1])}]" if iv and None not in iv else "n/a"
                slope = c.get("trend_slope")
                trend = f"{slope:+.3f} ({c.get('trend_verdict')})" if slope is not None else "-"
                value = eg_pct(c["eg"]) + _position_note(c) if c.get("eg") is not None else "-"
                rows.append([baseline, arm, domain, value, interval, c["verdict"], trend])
    return rows
