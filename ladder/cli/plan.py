"""`ladder plan RECIPE`: the dry run of a ladder (architecture, counts, tokens, compute, data), and with
`--gpu-memory` the smallest GPU layout each rung fits in, with its per-rank memory (`ladder.plan.memory`)."""

from __future__ import annotations

import argparse

from ladder.plan.compute import plan_compute
from ladder.errors import LadderInputError
from ladder.analysis.recipe_card import human_count
from ladder.cli.output import make_table, print_json, stdout_console
from ladder.plan.generator import RungSpec, plan_ladder
from ladder.plan.memory import CHECKPOINTING, DEFAULT_HEADROOM, DEFAULT_MAX_GPUS, PRECISIONS, choose_layout, \
    format_bytes, parse_bytes
from ladder.plan.recipe import Recipe, load_recipe


def parse_rungs(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        rungs = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise LadderInputError(f"expected comma-separated layer counts like 18,24,30, got {text!r}", field="--rungs") from None
    if not rungs or any(r <= 0 for r in rungs):
        raise LadderInputError(f"expected positive layer counts, got {text!r}", field="--rungs")
    return rungs


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="plan a ladder: architecture, exact params/FLOPs, tokens, data, compute")
    p.add_argument("recipe", help="recipe name (mai-base-2, cpu-demo) or path to a YAML recipe")
    p.add_argument("--rungs", help="comma-separated L values (default: the recipe's ladder)")
    p.add_argument("--data", help="corpus manifest or prepared directory (`ladder data prepare`'s output) to learn the "
                                  "mixture from, or check the recipe's against; replaces the recipe's `data:`")
    p.add_argument("--tpp", type=float, help="tokens per active parameter (default: the recipe's)")
    p.add_argument("--gpus", type=int, help="pool size; adds wall_clock_days and gpu_hours")
    p.add_argument("--mfu", type=float, help="model FLOPs utilisation (default: the recipe pool's)")
    p.add_argument("--goodput", type=float, help="fraction of wall time making progress (default: the pool's)")
    p.add_argument("--gpu-memory", help="memory of one GPU, e.g. 141GB or 80GiB; adds each rung's smallest layout "
                   "that fits and its per-rank memory")
    p.add_argument("--gpus-per-node", type=int, help="GPUs per node for --gpu-memory (default 8)")
    p.add_argument("--precision", choices=PRECISIONS, help="for --gpu-memory: bf16 compute over fp32 master "
                   "weights (default) or fp32")
    p.add_argument("--checkpointing", choices=CHECKPOINTING, help="for --gpu-memory: only this activation "
                   "checkpointing (default: the least recompute that fits)")
    p.add_argument("--headroom", type=float, help=f"for --gpu-memory: fraction of each GPU kept free for the CUDA "
                   f"context, NCCL and fragmentation (default {DEFAULT_HEADROOM:g})")
    p.add_argument("--max-gpus", type=int, help=f"for --gpu-memory: the largest layout tried (default {DEFAULT_MAX_GPUS})")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


MEMORY_ONLY_FLAGS = ("gpus_per_node", "precision", "checkpointing", "headroom", "max_gpus")


def _memory_settings(args: argparse.Namespace) -> dict | None:
    """The --gpu-memory settings, validated; None without --gpu-memory (then its companions are errors)."""
    given = [f for f in MEMORY_ONLY_FLAGS if getattr(args, f, None) is not None]
    if getattr(args, "gpu_memory", None) is None:
        if given:
            raise LadderInputError("needs --gpu-memory (the memory of one GPU, e.g. 141GB)",
                                   field="--" + given[0].replace("_", "-"))
        return None
    settings = {"gpu_memory_bytes": parse_bytes(args.gpu_memory),
                "gpus_per_node": 8 if args.gpus_per_node is None else args.gpus_per_node,
                "precision": args.precision or "bf16",
                "headroom": DEFAULT_HEADROOM if args.headroom is None else args.headroom,
                "max_gpus": DEFAULT_MAX_GPUS if args.max_gpus is None else args.max_gpus}
    for flag in ("gpus_per_node", "max_gpus"):
        if settings[flag] < 1:
            raise LadderInputError(f"must be a positive integer, got {settings[flag]}", field="--" + flag.replace("_", "-"))
    if not 0 <= settings["headroom"] < 1:
        raise LadderInputError(f"must be a fraction in [0, 1), got {settings['headroom']:g}", field="--headroom")
    if args.checkpointing is not None:
        settings["checkpointing"] = (args.checkpointing,)
    return settings


def plan_payload(recipe: Recipe, rungs: list[RungSpec], args: argparse.Namespace) -> dict:
    if args.gpus is None:  # they only set the days and GPU-hours --gpus adds: alone, they would do nothing
        for flag in ("mfu", "goodput"):
            if getattr(args, flag, None) is not None:
                raise LadderInputError("needs --gpus (the pool size the wall-clock days and GPU-hours are for)",
                                       field=f"--{flag}")
    memory = _memory_settings(args)
    out = []
    for spec in rungs:
        row = spec.to_dict()
        if args.gpus is not None:
            compute = plan_compute(
                spec.train_flops,
                gpus=args.gpus,
                peak_flops_per_gpu=recipe.gpu_pool.peak_bf16_flops_per_gpu,
                mfu=args.mfu if args.mfu is not None else recipe.gpu_pool.default_mfu,
                goodput=args.goodput if args.goodput is not None else recipe.gpu_pool.default_goodput,
            )
            row["wall_clock_days"] = compute.wall_clock_days
            row["gpu_hours"] = compute.gpu_hours
            # The 6·N·D convention, for comparison with reports that use it.
            row["wall_clock_days_6nd"] = 6.0 * spec.params_active * spec.tokens / compute.effective_flops_per_second / 86_400
        if memory is not None:
            try:
                choice = choose_layout(spec.arch, batch_sequences=spec.batch_sequences, **memory)
            except LadderInputError as err:
                raise LadderInputError(f"L{spec.L}: {err.detail}", field=err.field) from None
            row["layout"] = choice.to_dict()
            row["memory"] = choice.memory.to_dict()
        out.append(row)
    payload = {"recipe": recipe.name, "rungs": out}
    if recipe.data is not None:  # the corpus the mixture came from or was checked against, and what the checks found
        payload["data"] = {"path": recipe.data, "warnings": list(recipe.data_warnings)}
    return payload


def run(args: argparse.Namespace) -> int:
    recipe = load_recipe(args.recipe, data=getattr(args, "data", None))
    rungs = plan_ladder(recipe, parse_rungs(args.rungs), args.tpp)
    payload = plan_payload(recipe, rungs, args)
    if args.json:
        print_json(payload)
        return 0
    render_plan(payload)
    return 0


def render_plan(payload: dict) -> None:
    rows = payload["rungs"]
    with_days = any("wall_clock_days" in r for r in rows)
    columns = ["L", "d_model", "heads", "kv g/l", "experts", "latent", "hidden", "params", "active", "tokens",
               "batch", "steps", "FLOPs", "lr", "wd"] + (["days", "GPU-h"] if with_days else [])
    table_rows = []
    for r in rows:
        row = [r["L"], r["d_model"], r["n_heads"], f"{r['n_kv_heads_global']}/{r['n_kv_heads_local']}",
               f"{r['n_experts']}×top{r['top_k']}+{r['n_shared_experts']}", r["latent_dim"], r["expert_hidden"],
               human_count(r["params_total"]), human_count(r["params_active"]), human_count(r["tokens"]),
               human_count(r["batch_tokens"]), r["steps"], f"{r['train_flops']:.3e}", f"{r['lr']:.3g}",
               f"{r['weight_decay']:.3g}"]
        if with_days:
            row += [f"{r['wall_clock_days']:.2f}", human_count(r["gpu_hours"])]
        table_rows.append(row)
    stdout_console.print(make_table(f"ladder plan: {payload['recipe']} (TPP {rows[0]['tpp']:g})", columns, table_rows))
    if any("layout" in r for r in rows):
        render_memory(rows)
    sources = rows[-1]["sources"]
    if "data" in payload:
        stdout_console.print(f"mixture from {payload['data']['path']}", markup=False, highlight=False, soft_wrap=True)
    src_rows = [[name, f"{s['share']:.0%}", human_count(s["tokens"]), human_count(s["unique_tokens"]), f"{s['epochs']:.2f}"]
                for name, s in sources.items()]
    stdout_console.print(make_table(
        f"source scaling at L{rows[-1]['L']} (epochs are the same at every rung; unique data shrinks "
        f"to {next(iter(sources.values()))['unique_fraction']:.3g} of full scale)",
        ["source", "share", "tokens", "unique", "epochs"], src_rows))


def render_memory(rows: list[dict]) -> None:
    """The chosen layout of each rung and its per-rank memory (decimal GB, as GPU specs state them)."""
    first = rows[0]["layout"]
    title = (f"memory plan: smallest layout per rung ({format_bytes(first['gpu_memory_bytes'])} per GPU, "
             f"{first['headroom']:.0%} kept free, {first['gpus_per_node']} GPUs per node, {first['precision']}); "
             f"per-rank bytes")
    # cap×: the MoE capacity factor (capacity per round / balanced load; "-": one round always fits)
    columns = ["L", "GPUs", "nodes", "dp", "ep", "micro", "accum", "AC", "cap×", "params", "grads", "optim", "activ",
               "buffers", "peak", "usable"]
    table_rows = []
    for r in rows:
        lay, mem = r["layout"], r["memory"]
        factor = lay["capacity_factor"]
        table_rows.append([r["L"], lay["gpus"], lay["nodes"], lay["dp"], lay["ep"], lay["micro_batch_sequences"],
                           lay["accumulation_steps"], lay["checkpointing"], "-" if factor is None else f"{factor:g}",
                           *(format_bytes(mem[k]) for k in ("params", "grads", "optimizer", "activations", "buffers",
                                                            "total")),
                           format_bytes(lay["usable_bytes"])])
    stdout_console.print(make_table(title, columns, table_rows))
