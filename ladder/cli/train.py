"""`ladder train RECIPE --rung L`: one training job from a resolved config, no orchestrator.

Prepares the corpus on first use (cached under runs/data), trains in `runs/train/<recipe>-L<L>-<key>`
(a rerun of the same config resumes or returns the finished result), tracks in MLflow.
JSON (docs/architecture.md): {run_id, final_loss, bpb: {DOMAIN: value}, tokens, train_flops, wall_seconds,
tokens_per_second, mfu}, plus bpb_se: {DOMAIN: the final BPB's standard error from the held-out
documents' sampling}, achieved_tflops_per_device, peak_flops_per_device and mfu_capped (MFU
is against the device's specification peak, rungs.metrics). A damaged or unsafe checkpoint, another
config's checkpoint or result, a checkpoint of other training data, a full disk or a file where the run
directory would be exits 2 with one line naming the file. A run directory in use by another job is
waited for (the holder is logged), then resumed or its result returned. A finished job whose MLflow run
is not in the store named is refused (exit 2), or with --reregister recorded there as a new run.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from ladder.errors import LadderInputError
from ladder.cli.output import make_table, print_json, stdout_console
from ladder.plan.resolve import resolve_train_config
from rungs.tracking_uri import TRACKING_URI_ENV

DEFAULT_RUNS_ROOT = Path("runs") / "train"
log = logging.getLogger(__name__)
CONTRACT_KEYS = ("run_id", "final_loss", "bpb", "tokens", "train_flops", "wall_seconds", "tokens_per_second", "mfu")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train one rung of a recipe (prepares data, tracks in MLflow)")
    p.add_argument("recipe", help="recipe name (cpu-demo, mai-base-2) or path to a YAML recipe")
    p.add_argument("--rung", type=int, required=True, help="layer count L of the rung")
    p.add_argument("--data", help="corpus manifest or prepared directory (`ladder data prepare`'s output) to learn the "
                                  "mixture from, or check the recipe's against; replaces the recipe's `data:`")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (repeatable), e.g. --set lr=0.01 --set dropout=0.1")
    p.add_argument("--max-steps", type=int, help="stop after N steps (the LR schedule spans these N)")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI if set, else "
                                          "sqlite:///runs/mlflow.db; --set tracking_uri= trains without tracking)")
    p.add_argument("--run-dir", type=Path, help="job directory (default runs/train/<recipe>-L<L>-<config key>)")
    p.add_argument("--fresh", action="store_true", help="ignore an existing checkpoint in the run directory")
    p.add_argument("--reregister", action="store_true",
                   help="a job that finished earlier but whose MLflow run is not in the store (another store, a "
                        "replaced one): record its stored result there as a new run (without it: refused)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def default_run_dir(config: dict) -> Path:
    """runs/train/<recipe>-L<L>-<config key>; or the directory older versions named by the config's
    legacy key (`TrainConfig.legacy_key`) when that one exists and the current one does not, so a
    rerun of the same config resumes it."""
    from rungs.config import parse_config

    cfg = parse_config(config)
    current, legacy = (DEFAULT_RUNS_ROOT / f"{cfg.recipe}-L{cfg.L}-{key}" for key in (cfg.key(), cfg.legacy_key()))
    return legacy if legacy.is_dir() and not current.exists() else current


def record_finished_run(config: dict, run_dir: Path, *, reregister: bool) -> None:
    """A job that finished earlier returns its stored result without training; if its MLflow run is not
    in this store (the store was replaced, or --tracking-uri names another), the fits reading the store
    would miss it while the command printed its numbers. As `ladder sweep run` does: refused, or with
    `reregister` recorded in the store as a new run (ladder.run.sweep_runs.reregister)."""
    from ladder.run.sweep_runs import TAG_KEY
    from ladder.run.sweep_runs import reregister as register_result
    from rungs.config import parse_config
    from rungs.loop import RESULT_FILE, finished_result
    from rungs.tracking import run_status

    cfg = parse_config(config)
    done = finished_result(Path(run_dir), cfg.run_steps, cfg.resume_keys())
    if done is None or (done.run_id and run_status(cfg.tracking_uri, done.run_id) is not None):
        return
    if not reregister:
        # A job trained without tracking (tracking_uri empty) shares its run directory with the tracked command:
        # tracking is not part of the job's key, so the rerun found the result and recorded nothing.
        why = (f"its MLflow run {done.run_id} is not in {cfg.tracking_uri}: the store was replaced, or --tracking-uri "
               "names another one. Point --tracking-uri at the store it was recorded in; or" if done.run_id else
               f"it ran without tracking, so {cfg.tracking_uri} has no run of it. Rerun")
        raise LadderInputError(
            f"this job finished earlier (its result is {Path(run_dir) / RESULT_FILE}) but {why} with --reregister to "
            "record its finished result in this store; or --fresh to train it again", field="--tracking-uri")
    run_id = register_result(cfg.tracking_uri, cfg.experiment_name, Path(run_dir),
                             {TAG_KEY: cfg.trial_key or cfg.key(), "config_key": cfg.key()})
    log.info("re-registered %s: %s → %s", run_dir,
             f"run {done.run_id} (not in the store)" if done.run_id else "trained without tracking", run_id)


def run(args: argparse.Namespace) -> int:
    from rungs.checkpoint import CheckpointError, DiskFullError, RunDirError
    from rungs.config import TrainConfigError
    from rungs.data.errors import DataInputError
    from rungs.train import train

    if args.max_steps is not None and args.max_steps <= 0:
        raise LadderInputError(f"--max-steps must be positive, got {args.max_steps}", field="--max-steps")
    overrides = list(args.overrides)
    if args.tracking_uri is not None:
        if not args.tracking_uri.strip():  # it fell back to the default store: say how to mean either
            raise LadderInputError("empty tracking URI; leave the flag out for the default store "
                                   "(sqlite:///runs/mlflow.db), or --set tracking_uri= to train without tracking",
                                   field="--tracking-uri")
        overrides.append(f"tracking_uri={args.tracking_uri}")
    elif os.environ.get(TRACKING_URI_ENV) and not any(o.partition("=")[0].strip() == "tracking_uri" for o in overrides):
        overrides.insert(0, f"tracking_uri={os.environ[TRACKING_URI_ENV]}")  # as every command reads it
    config = resolve_train_config(args.recipe, args.rung, overrides, max_steps=args.max_steps, data=args.data)
    if config.get("tracking_uri"):
        from ladder.run.stores import check_store

        # As `ladder sweep run` does, before data is prepared or the run directory written: a server that
        # is down, a damaged store or a scheme MLflow cannot read fails here in one line. A job creates
        # its SQLite store (or store directory) on first use, so a missing one is allowed.
        check_store(config["tracking_uri"], create=True)
        from rungs.tracking import deleted_experiment

        deleted = deleted_experiment(config["tracking_uri"], config["experiment_name"])
        if deleted is not None:  # MLflow cannot create a run in it: refused before any data or model work
            raise LadderInputError(
                f"the MLflow experiment {config['experiment_name']!r} (id {deleted}) was deleted in "
                f"{config['tracking_uri']}; restore it (MLFLOW_TRACKING_URI={config['tracking_uri']} mlflow "
                f"experiments restore --experiment-id {deleted}) or name another with --set experiment_name=NAME",
                field="experiment_name")
    run_dir = args.run_dir or default_run_dir(config)
    try:
        if config.get("tracking_uri") and not args.fresh:
            record_finished_run(config, run_dir, reregister=args.reregister)
        result = train(config, run_dir=run_dir, resume=not args.fresh, progress=True)
    except (TrainConfigError, DataInputError, CheckpointError, RunDirError) as err:
        raise LadderInputError(str(err), where=f"ladder train {args.recipe} --rung {args.rung}") from None
    except DiskFullError as err:  # not bad input, but one line that says what to do beats a traceback
        raise LadderInputError(err.strerror, where=f"ladder train {args.recipe} --rung {args.rung}") from None
    payload = {k: getattr(result, k) for k in CONTRACT_KEYS}
    payload |= {"bpb_se": result.bpb_se, "diverged": result.diverged, "steps": result.steps,
                "unigram_bpb": result.unigram_bpb,
                "run_dir": str(run_dir), "achieved_tflops_per_device": result.achieved_tflops_per_device,
                "peak_flops_per_device": result.peak_flops_per_device, "mfu_capped": result.mfu_capped}
    if args.json:
        print_json(payload)
    else:
        rows = [[d, v, result.bpb_se.get(d), result.unigram_bpb.get(d)] for d, v in result.bpb.items()]
        stdout_console.print(make_table(f"ladder train {config['recipe']} L{args.rung}",
                                        ["domain", "bpb", "bpb se", "unigram bpb"], rows))
        stdout_console.print(
            f"{result.steps} steps  loss {result.final_loss:.4f}{'  DIVERGED: ' + str(result.diverged_reason) if result.diverged else ''}\n"
            f"run {result.run_id}  tokens {result.tokens:,}  FLOPs {result.train_flops:.3e}  "
            f"wall {result.wall_seconds:.1f}s  {result.tokens_per_second:,.0f} tok/s  MFU {result.mfu:.2%}"
            f"{' (capped: the peak is wrong)' if result.mfu_capped else ''}  "
            f"{result.achieved_tflops_per_device:.3g} TFLOP/s per device")
    return 0
