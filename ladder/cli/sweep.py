"""`ladder sweep run SPEC`, `ladder sweep status SPEC` and `ladder sweep plan SPEC` (docs/architecture.md contract)."""

from __future__ import annotations

import argparse
import sys

from ladder.errors import LadderInputError
from ladder.analysis.recipe_card import human_count
from ladder.cli.output import make_table, print_json, progress_line, stdout_console
from ladder.plan.byte_sizes import format_bytes
from rungs.tracking_uri import is_embedded_default
from sweeps.spec import load_spec, resolve_spec_path

# Exit codes of `ladder sweep run`: 0 every trial finished or diverged (a divergence is a result),
# 1 at least one trial failed all its attempts, 2 bad input (the spec, a flag, the store).
EXIT_TRIAL_FAILED = 1


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="run a sweep spec on Ray, tracked in MLflow; or show its status")
    ss = p.add_subparsers(dest="sweep_command", required=True, parser_class=type(p))
    r = ss.add_parser("run", help="run every trial not yet finished (finished trials are skipped)")
    r.add_argument("spec", help="sweep spec: a name (smoke, demo, ...) or a path to a YAML file")
    r.add_argument("--address", help="Ray cluster address (default: a private local Ray)")
    r.add_argument("--tracking-uri", help="MLflow store or server (default: $MLFLOW_TRACKING_URI if set, else "
                                          "sqlite:///runs/mlflow.db behind a local tracking server)")
    r.add_argument("--max-concurrent", type=int, help="trials at once (default: the spec's, else what fits)")
    r.add_argument("--new-store", action="store_true",
                   help="create the --tracking-uri store when it does not exist (without it a missing store is "
                        "refused: a mistyped path would show every trial pending)")
    r.add_argument("--reregister", action="store_true",
                   help="record trials whose finished result.json names a run the store lacks (a replaced or lost "
                        "store) as new finished runs, instead of refusing")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.set_defaults(handler=run)
    r.epilog = "exit status: 0 all trials finished or diverged; 1 a trial failed; 2 bad input"
    s = ss.add_parser("status", help="pending / running / finished / failed / diverged per trial")
    s.add_argument("spec", help="sweep spec: a name or a path")
    s.add_argument("--tracking-uri", help="MLflow store or server (default: $MLFLOW_TRACKING_URI if set, else "
                                          "sqlite:///runs/mlflow.db)")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(handler=status)
    q = ss.add_parser("plan", help="what a sweep will run and cost, before it runs: its trials, training FLOPs and "
                                   "GPU-hours (no Ray, no store)")
    q.add_argument("spec", help="sweep spec: a name or a path")
    q.add_argument("--mfu", type=float, help="model FLOPs utilisation the GPU-hours assume (default: the recipe "
                                            "pool's)")
    q.add_argument("--goodput", type=float, help="fraction of wall time making progress (default: the recipe pool's)")
    q.add_argument("--target-width", type=_width_arg, default=None,
                   help="the ± (95%%) wanted of the top rung's prediction, e.g. 2%% or 0.02: the plan names the seeds "
                        "or rungs that reach it (default 2%%)")
    q.add_argument("--json", action="store_true", help="print one JSON object")
    q.set_defaults(handler=plan)


def _width_arg(text: str) -> float:
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a width like 2% or 0.02, got {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"a width in (0, 100%), got {text!r}")
    return value


def _load(name: str):
    path = resolve_spec_path(name)
    return load_spec(path), str(path)


def run(args: argparse.Namespace) -> int:
    if args.max_concurrent is not None and args.max_concurrent < 1:
        raise LadderInputError(f"must be at least 1, got {args.max_concurrent}", field="--max-concurrent")
    from ladder.run.orchestrate import run_sweep

    spec, where = _load(args.spec)
    outcome = run_sweep(spec, where=where, address=args.address, tracking_uri=args.tracking_uri,
                        max_concurrent=args.max_concurrent, progress=progress_line,
                        create_store=args.new_store or is_embedded_default(args.tracking_uri), reregister=args.reregister)
    counts = outcome.counts()
    if args.json:
        print_json({**counts, "sweep": outcome.sweep, "experiment": outcome.experiment,
                    "tracking_uri": outcome.tracking_uri, "results": [_row_json(r) for r in outcome.rows]})
    else:
        _render(outcome, f"sweep {outcome.sweep}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    if counts["failed"]:
        sys.stderr.write(f"ladder sweep run: {counts['failed']} trial(s) failed; `ladder sweep status "
                         f"{args.spec}` shows why, and a rerun retries them\n")
        return EXIT_TRIAL_FAILED
    return 0


def status(args: argparse.Namespace) -> int:
    from ladder.run.orchestrate import sweep_status

    spec, where = _load(args.spec)
    outcome = sweep_status(spec, where=where, tracking_uri=args.tracking_uri)
    by_state: dict[str, int] = {}
    for r in outcome.rows:
        by_state[r.state] = by_state.get(r.state, 0) + 1
    if args.json:
        print_json({"sweep": outcome.sweep, "experiment": outcome.experiment, "tracking_uri": outcome.tracking_uri,
                    "counts": by_state, "trials": [_row_json(r) for r in outcome.rows]})
    else:
        _render(outcome, f"sweep {outcome.sweep}: " + ", ".join(f"{k} {v}" for k, v in sorted(by_state.items())))
    return 0


def plan(args: argparse.Namespace) -> int:
    from sweeps.cost import check_fits_memory, cost_sweep
    from sweeps.plan import plan_sweep, spec_recipe

    for flag in ("mfu", "goodput"):
        value = getattr(args, flag)
        if value is not None and not 0 < value <= 1:
            raise LadderInputError(f"must be a fraction in (0, 1], got {value:g}", field=f"--{flag}")
    spec, where = _load(args.spec)
    planned = plan_sweep(spec, where=where)
    cost = cost_sweep(planned, spec_recipe(spec, where=where), mfu=args.mfu, goodput=args.goodput)
    check_fits_memory(cost, where=where)
    resolution = _resolution(spec, planned, cost, args.target_width)
    if args.json:
        print_json({"sweep": spec.name, "spec": where, "recipe": spec.recipe, "experiment": spec.experiment_name,
                    **cost.to_dict(), "resolution": resolution})
        return 0
    totals = cost.totals()
    with_memory = any(t.peak_bytes is not None for t in cost.trials)
    columns = ["name", "key", "L", "lr", "wd", "steps", "tokens", "FLOPs", "GPUs", "GPU-h", "days"]
    rows = []
    for t in cost.trials:
        row = [t.trial, t.key, t.L, f"{t.lr:.3g}", f"{t.weight_decay:.3g}", t.steps, human_count(t.tokens),
               f"{t.train_flops:.3e}", f"{t.gpus:g}", human_count(t.gpu_hours),
               "-" if t.wall_clock_days is None else f"{t.wall_clock_days:.2f}"]
        if with_memory:
            row.append("-" if t.peak_bytes is None else f"{format_bytes(t.peak_bytes)} / {format_bytes(t.usable_bytes)}")
        rows.append(row)
    title = (f"sweep plan {spec.name}: {totals['trials']} trials, {totals['train_flops']:.3e} training FLOPs, "
             f"{human_count(totals['gpu_hours'])} GPU-hours on {cost.pool} ({cost.peak_flops_per_gpu:.3g} FLOP/s "
             f"per GPU) at MFU {cost.mfu:.0%} and goodput {cost.goodput:.0%}")
    stdout_console.print(make_table(title, columns + (["peak / usable"] if with_memory else []), rows))
    if resolution is not None:
        from ladder.analysis.resolution import describe

        stdout_console.print(f"resolution: {describe(resolution)}", markup=False, highlight=False, soft_wrap=True)
    return 0


def _resolution(spec, planned, cost, target: float | None) -> dict | None:
    """The ladder's expected top-rung ± (ladder.analysis.resolution); None for a sweep of fewer than 4 rungs.
    A trial is at the law where it runs the law's LR and WD (sweeps.expand.at_law): not a grid neighbour,
    not around an explicit `lr_wd.centre`, not an arm or override that pins lr or weight_decay. A sweep none of
    whose trials is at the law (a ladder at a fixed LR) is read at its blocks' centres instead."""
    from ladder.analysis.resolution import DEFAULT_TARGET_WIDTH, ladder_resolution
    from sweeps.expand import at_law

    flops = {t.key: t.train_flops for t in cost.trials}
    law = {p.key: at_law(spec, p.trial) for p in planned}
    if not any(law.values()):
        law = {p.key: p.trial.log_lr_offset == 0 and p.trial.log_lr_wd_offset == 0 for p in planned}
    return ladder_resolution([{"key": p.key, "block": p.trial.block, "L": p.trial.L, "train_flops": flops[p.key],
                               "tpp": p.trial.tpp, "arm": p.trial.arm, "at_law": law[p.key]} for p in planned],
                             target=target or DEFAULT_TARGET_WIDTH)


def _row_json(r) -> dict:
    return {"key": r.key, "trial": r.label, "state": r.state, "run_id": r.run_id, "attempts": r.attempts,
            "ran_now": r.ran_now, "bpb_mean": r.bpb_mean, "wall_seconds": r.wall_seconds,
            "train_wall_seconds": r.train_wall_seconds, "train_loop_seconds": r.train_loop_seconds, "train_call_seconds": r.train_call_seconds,
            "error": r.error, "progress": r.progress}


def _render(outcome, title: str) -> None:
    def shown(value):  # a trial not run here has no driver-observed seconds, one not finished no BPB
        return "-" if value is None else value

    rows = [[r.label, r.key, r.state if not r.progress else f"{r.state}: {r.progress}", r.attempts, shown(r.bpb_mean),
             shown(r.wall_seconds), r.run_id or "-"] for r in outcome.rows]
    stdout_console.print(make_table(title, ["name", "key", "state", "attempts", "bpb", "seconds", "run"], rows))
    failed = [r for r in outcome.rows if r.error]
    if failed:  # one line each, under the table: an error is too long for a column
        stdout_console.print("\n".join(f"{r.state} {r.label} ({r.key}): {r.error}" for r in failed),
                             markup=False, highlight=False, soft_wrap=True)
    sys.stdout.flush()
