"""What every `ladder fit` subcommand shares: its input (a CSV or an MLflow experiment), its errors as
the CLI's one-paragraph message, and its ending (--save, and the fit logged back to MLflow)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pandas as pd

from ladder.errors import LadderInputError
from ladder.run.mlflow_runs import fit_table, log_fit_run, read_runs


def delta_arg(text: str) -> float | str:
    if text == "auto":
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a positive number or 'auto', got {text!r}") from None
    if not value > 0:
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
        return df, {"csv": str(path), "n_rows": len(df)}
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
