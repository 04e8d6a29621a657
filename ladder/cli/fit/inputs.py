"""What the `ladder fit` subcommands (and `ladder extrapolate`) share: their input (a CSV or an MLflow
experiment), the flags of the fits they make, their errors as the CLI's one-paragraph message, and
their ending (--save, and the fit logged back to MLflow)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from fits.floors import DEFAULT_FLOOR, FLOOR_RULES
from ladder.errors import LadderInputError
from rungs.tracking_uri import default_tracking_uri
from ladder.run.mlflow_runs import (check_domain_bpb, describe_rows, domains_of, fit_table, log_fit_run, long_by_domain,
                                    missing_bpb, read_runs)


def add_floor_arg(q: argparse.ArgumentParser) -> None:
    q.add_argument("--floor", choices=sorted(FLOOR_RULES), default=DEFAULT_FLOOR,
                   help="what the loss floor E becomes where the rungs show none: 'fit' (default) fit E and refuse a "
                        "law whose E runs to zero; 'auto' fall back there to the nested law A·x^(−α), reported as "
                        "E = 0 and flagged (what `ladder demo` fits); 'zero' fix E = 0 for every group")


NO_FLOOR_HINT = ("hint: --floor auto fits the nested law A·x^(−α) where the rungs show no loss floor (reported as "
                 "E = 0 and flagged, as `ladder demo` does); --floor zero fixes E = 0 for every group")

SMALL_LADDER_HINT = ("hint: too few rungs for intervals: --bootstrap 0 fits the law without them (no parameter "
                     "intervals, no prediction interval), and --holdout-top 0 skips the backtest (holding out a rung "
                     "of 3 leaves 2, too few to fit, so there is no backtest to show); from 5 rungs a ladder has both")


def is_no_floor(err: Exception) -> bool:
    """The refusal `--floor auto` answers: E ran to its lower bound (fits.power_law.check_bounds)."""
    from fits.errors import FitBoundaryError

    return isinstance(err, FitBoundaryError) and err.parameter == "log E"


def add_ci_level_and_seed(q: argparse.ArgumentParser) -> None:
    q.add_argument("--ci-level", type=float, default=0.95,
                   help="coverage of every interval printed, in (0, 1) (default 0.95: percentiles 2.5 and 97.5 of the "
                        "bootstrap draws)")
    q.add_argument("--seed", type=seed_arg, default=0,
                   help="seed of the bootstrap resamples, a whole number ≥ 0 (default 0): the same seed and runs give "
                        "the same intervals")


def seed_arg(text: str) -> int:
    """--seed: a whole number ≥ 0 (numpy's generators take no negative seed)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number ≥ 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"a whole number ≥ 0, got {text!r}")
    return value


def per_domain_rows(df: pd.DataFrame, group: str | None, y: str, *, where: str | None,
                    x: str | None = None) -> pd.DataFrame:
    """The table a grouped fit reads: as given, or, for `--group domain` on a runs table with per-domain
    `bpb_<domain>` columns and no `domain` column (an MLflow experiment's, the demo fixture), one row per
    (run, domain) with the domain's BPB in `bpb`. A group column that is not there is refused.

    The wide table is checked before it is reshaped, so an error names the file's line and the column as
    the file has them: a `bpb_<domain>` cell that is not a positive finite number is refused
    (`check_domain_bpb`), and so is a bad value of the compute column `x` where the caller names it (one
    cell, not one per domain). An empty `bpb_<domain>` cell is a run with no BPB on that domain (it
    diverged, or was not evaluated there): it is left out of that domain's law and said so on stderr, with
    the lines (or runs); a domain with no BPB in any run is reported as not fitted, with that reason."""
    if group is None or group in df.columns:
        return df
    if group == "domain" and y == "bpb" and domains_of(df):
        try:
            check_domain_bpb(df)
        except LadderInputError as err:
            raise LadderInputError(err.detail, where=where, field=err.field) from None
        if x is not None and x in df.columns:
            from fits.errors import FitInputError
            from fits.validate import numeric_column

            try:
                numeric_column(df, x, positive=True)
            except FitInputError as err:
                raise LadderInputError(err.detail, where=where, field=x) from None
        _note_missing_bpb(df, where)
        return long_by_domain(df)
    raise LadderInputError(f"no such column; the table has {sorted(map(str, df.columns))}", where=where, field=group)


def _note_missing_bpb(df: pd.DataFrame, where: str | None) -> None:
    """Say on stderr which runs each domain's law leaves out for want of a BPB (domains missing the same
    runs in one line), and which domains have none at all; refuse a table with no BPB anywhere."""
    missing = missing_bpb(df)
    if not missing:
        return
    empty = [d for d, rows in missing.items() if len(rows) == len(df)]
    if len(empty) == len(domains_of(df)):
        raise LadderInputError(f"every bpb_<domain> column is empty ({len(df)} runs): no BPB to fit", where=where,
                               field="bpb_<domain>")
    for d in empty:
        print(f"{d}: not fitted: bpb_{d} is empty in all {len(df)} runs (no run has a BPB on this domain)",
              file=sys.stderr)
    by_rows: dict[tuple, list[str]] = {}
    for d, rows in missing.items():
        if d not in empty:
            by_rows.setdefault(tuple(rows), []).append(d)
    diverged = df["diverged"].astype(str).str.lower().eq("true") if "diverged" in df.columns else None
    for rows, domains in by_rows.items():
        n = len(rows)
        why = ""
        if diverged is not None and (k := int(diverged.loc[list(rows)].sum())):
            why = f"; {k} of them diverged"
        print(f"{', '.join(domains)}: {n} run{'s' if n > 1 else ''} with no BPB (an empty bpb_<domain> cell) left out "
              f"of {'its law' if len(domains) == 1 else 'their laws'} ({describe_rows(df, list(rows))}{why})",
              file=sys.stderr)


def delta_arg(text: str) -> float | str:
    if text == "auto":
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a positive number or 'auto', got {text!r}") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"a positive number or 'auto', got {text!r}")
    return value


def load_input(args: argparse.Namespace) -> tuple[pd.DataFrame, dict[str, Any]]:
    if bool(args.csv) == bool(args.experiment):
        raise LadderInputError("give exactly one of --csv FILE or --experiment NAME", field="--csv/--experiment")
    if args.csv:
        path = Path(args.csv)
        if not path.is_file():
            raise LadderInputError("file not found; give a CSV with a header row", where=str(path))
        try:
            df = pd.read_csv(path)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
            raise LadderInputError(f"not a readable CSV: {err}", where=str(path)) from None
        df.index = pd.RangeIndex(2, len(df) + 2, name="line")  # rows named by their line in the file (1: header)
        return df, {"csv": str(path), "n_rows": len(df)}
    args.tracking_uri = default_tracking_uri(args.tracking_uri)  # as `ladder sweep run` chose the store it wrote
    runs = fit_table(read_runs(args.experiment, args.tracking_uri))
    return runs, {"experiment": args.experiment, "tracking_uri": args.tracking_uri, "n_runs": len(runs)}


def input_error(err: Exception, source: dict[str, Any]) -> LadderInputError:
    """A fits error as the CLI's one-paragraph message: where (file or experiment), field, what."""
    from fits.errors import FitInputError

    where = source.get("csv") or f"experiment {source.get('experiment')}"
    if isinstance(err, FitInputError):
        return LadderInputError(err.detail, where=where, field=err.column)
    return LadderInputError(f"{err} (the fit was refused rather than reported)", where=where)


def finish(args: argparse.Namespace, payload: dict[str, Any], source: dict[str, Any], runs: pd.DataFrame,
           saved: dict[str, Any] | None, metrics: dict[str, Any]) -> None:
    if args.save and saved is not None:
        Path(args.save).write_text(json.dumps(saved, indent=2) + "\n")
        payload["saved"] = args.save
    if args.experiment and not args.no_log:
        options = {k: v for k, v in vars(args).items() if k not in ("handler", "json") and not callable(v)}
        payload["mlflow_fit_run_id"] = log_fit_run(
            args.tracking_uri, args.experiment, command=args.fit_command, payload=payload,
            source_run_ids=list(dict.fromkeys(runs["run_id"].astype(str))) if "run_id" in runs else [], options=options,
            metrics=metrics)


def column_arg(args: argparse.Namespace, name: str, default: str) -> str:
    value = getattr(args, name)
    if value:
        return value
    if args.experiment:
        return default
    raise LadderInputError(f"required with --csv: name the column, e.g. --{name} {default}", field=f"--{name}")


def check_counts_and_level(args: argparse.Namespace) -> None:
    """--bootstrap and --holdout-top are counts (≥ 0), --ci-level a level in (0, 1): each refused by its own name
    and value (one message named --bootstrap for a bad --ci-level)."""
    for flag, value in (("--bootstrap", args.bootstrap), ("--holdout-top", args.holdout_top)):
        if value < 0:
            raise LadderInputError(f"must be ≥ 0, got {value}", field=flag)
    if not 0 < args.ci_level < 1:
        raise LadderInputError(f"must lie in (0, 1) (0.95 for a 95% interval), got {args.ci_level}", field="--ci-level")
