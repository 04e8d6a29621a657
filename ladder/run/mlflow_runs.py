"""MLflow runs ↔ the tables the fits take.

`read_runs` turns an experiment's runs into a DataFrame with `params.X`, `metrics.X` and `tags.X`
columns (params converted to numbers where they are numbers). `fit_table` adds the canonical
columns the fits use, from the names the training job logs (`rungs/train.py`): lr, wd (param
weight_decay), dropout, steps, tpp, params_active, train_flops (metric total_train_flops),
wall_seconds, rung (tag), arm (tag), diverged (tag), `bpb_<domain>` (metric final_bpb/<domain>)
and bpb (their mean), and `bpb_se_<domain>` (metric final_bpb_se/<domain>: the final BPB's standard
error from the held-out documents' sampling; absent for runs logged before it existed).
A trial key read twice (a job rerun with `--fresh`, or the same config trained in another run
directory) is one measurement: `read_runs` keeps its latest finished run, as `ladder sweep status` shows it.
`long_by_domain` stacks the domains for one law per domain (with a `bpb_se` column when known);
`check_domain_bpb` and `missing_bpb` say, before that, which `bpb_<domain>` cells are wrong or empty.
`log_fit_run` records a fit as an MLflow run of its own (tag kind=fit) in the same experiment,
with the source run ids, the options, the numeric results as metrics and the full JSON as an
artifact; `read_runs` leaves such runs out.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ladder.errors import LadderInputError
from ladder.run.stores import check_store
from ladder.run.sweep_runs import TAG_KEY, is_true_tag
from rungs.tracking_uri import DEFAULT_TRACKING_URI

log = logging.getLogger(__name__)

FIT_KIND_TAG = "kind"
CANONICAL = {  # canonical column ← candidates in order of preference
    "lr": ["params.lr"], "wd": ["params.weight_decay", "params.wd"], "dropout": ["params.dropout"],
    "steps": ["params.steps"], "tpp": ["params.tpp"], "params_active": ["params.params_active"],
    "train_flops": ["metrics.total_train_flops", "metrics.train_flops"], "wall_seconds": ["metrics.wall_seconds"],
    "final_loss": ["metrics.final_loss"], "tokens": ["metrics.total_tokens", "params.tokens"], "rung": ["tags.rung", "params.L"], "arm": ["tags.arm", "params.arm", "tags.coord.arm"], "seed": ["tags.coord.seed", "params.seed"],
    "block": ["tags.coord.block"],
    "recipe": ["tags.recipe"], "trial_key": ["tags.trial_key"],
}
BPB_PREFIX = "metrics.final_bpb/"
BPB_SE_PREFIX = "metrics.final_bpb_se/"
SE_COLUMN_PREFIX = "bpb_se_"  # `bpb_se_<domain>`: a standard error, not a domain's BPB




def _client(tracking_uri: str):
    """An MlflowClient for a store `check_store` has accepted (it refuses an unknown scheme or a missing
    database driver before MLflow would raise)."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def _number(value: str, name: str = "") -> Any:
    """A param's text as the number it was logged from, else the text. A key (`trial_key`, `data_key`,
    `config_key`) is a hex hash and stays text even where its digits read as a number ("0123…", "12e45…");
    text that overflows a float ("1e999") is not a number either."""
    if name.endswith("_key"):
        return value
    try:
        f = float(value)
    except (TypeError, ValueError):
        return value
    if math.isinf(f) and "inf" not in value.lower():
        return value
    return int(value) if f.is_integer() and "." not in value and "e" not in value.lower() else f


# MLflow's SQL stores cannot hold an infinity and keep ±(largest float) instead: read back, that is ±inf
# again, so a run that logged an infinite BPB is refused as one rather than fitted as 1.8e308.
_SQL_INF = sys.float_info.max


def _metric(value: float) -> float:
    return math.copysign(math.inf, value) if abs(value) == _SQL_INF else value


def read_runs(experiment: str, tracking_uri: str = DEFAULT_TRACKING_URI, *, finished_only: bool = True) -> pd.DataFrame:
    """The runs of `experiment` as one row each: FINISHED runs only unless `finished_only` is False, fit
    runs excluded, and one run per trial key (`latest_per_trial`). A store that is missing, damaged
    or locked, or a server that does not answer, is refused first (`ladder.run.stores.check_store`):
    reading must not create an empty store, nor wait on MLflow's retries."""
    check_store(tracking_uri, create=False)
    client = _client(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        names = [e.name for e in client.search_experiments()]
        raise LadderInputError(f"no experiment named {experiment!r} in {tracking_uri}; experiments there: {names}",
                               field="--experiment")
    rows, token = [], None
    while True:
        page = client.search_runs([exp.experiment_id], max_results=1000, page_token=token)
        for run in page:
            tags = run.data.tags
            if tags.get(FIT_KIND_TAG) == "fit" or (finished_only and run.info.status != "FINISHED"):
                continue
            row = {"run_id": run.info.run_id, "status": run.info.status, "run_name": run.info.run_name,
                   "start_time": run.info.start_time, "end_time": run.info.end_time}
            row |= {f"params.{k}": _number(v, k) for k, v in run.data.params.items()}
            row |= {f"metrics.{k}": _metric(v) for k, v in run.data.metrics.items()}
            row |= {f"tags.{k}": v for k, v in tags.items()}
            rows.append(row)
        token = page.token
        if not token:
            break
    if not rows:
        raise LadderInputError(f"experiment {experiment!r} in {tracking_uri} has no {'finished ' if finished_only else ''}"
                               "runs to fit", field="--experiment")
    return latest_per_trial(pd.DataFrame(rows))


def latest_per_trial(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per trial key: its latest FINISHED run (by start time), else its latest run. A key is a
    hash of the resolved config, so its runs measure one thing; counted twice, a rung would weigh double
    in a fit. Rows without a trial key (runs logged by other tools) are all kept; the order is kept."""
    column = f"tags.{TAG_KEY}"
    if column not in runs.columns or not runs[column].notna().any():
        return runs
    keyed = runs[runs[column].notna()]
    rank = keyed.assign(_finished=keyed["status"].eq("FINISHED"), _start=keyed["start_time"].fillna(-1),
                        _end=keyed["end_time"].fillna(-1))
    keep = rank.sort_values(["_finished", "_start", "_end"], kind="stable").groupby(column, sort=False).tail(1).index
    dropped = len(keyed) - len(keep)
    if dropped:
        log.info("%d run(s) of trial keys with a later run left out (reruns of the same config)", dropped)
    return runs[runs[column].isna() | runs.index.isin(keep)].reset_index(drop=True)


def _order_seed(table: pd.DataFrame) -> None:
    """A `data_seed` column where a run set one (rungs.config: the data order's seed apart from the weights'):
    the order each run read, its `seed` where it set none. Without a run that set one, no column."""
    if "data_seed" in table.columns or "params.data_seed" not in table.columns or "seed" not in table.columns:
        return
    chosen = pd.to_numeric(table["params.data_seed"], errors="coerce")  # "None": the order followed the seed
    if chosen.isna().all():
        return
    order = chosen.fillna(pd.to_numeric(table["seed"], errors="coerce"))
    table["data_seed"] = order.astype("int64") if order.notna().all() else order


def _data_order(table: pd.DataFrame) -> None:
    """A `data_order` column where a run read its passes in another order than the seeded shuffle (rungs.config:
    "keyed"): each run's rule, "permutation" where it set none. Without such a run, no column."""
    if "data_order" in table.columns or "params.data_order" not in table.columns:
        return
    rule = table["params.data_order"]
    if not rule.notna().any() or rule.dropna().eq("permutation").all():
        return
    table["data_order"] = rule.fillna("permutation")


def fit_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Add the canonical columns; diverged runs get NaN BPB (the fits drop and count them)."""
    out = runs.copy()
    for name, candidates in CANONICAL.items():
        present = [c for c in candidates if c in out.columns]
        if name in out.columns or not present:
            continue
        column = out[present[0]]
        for c in present[1:]:  # run by run: a run without the first (a run no sweep started has no coord tags)
            column = column.where(column.notna(), out[c])
        out[name] = column
    for c in ("lr", "wd", "dropout", "steps", "tpp", "params_active", "train_flops", "wall_seconds", "final_loss", "tokens"):
        if c in out.columns:
            out[c] = pd.to_numeric(out[c], errors="coerce")
    for c in ("rung", "seed"):  # tags are text: "10" sorted before "9", and a CSV of the same runs gives numbers
        if c in out.columns:
            as_number = pd.to_numeric(out[c], errors="coerce")
            if as_number.notna().all() and (as_number % 1 == 0).all():
                out[c] = as_number.astype("int64")
    _order_seed(out)
    _data_order(out)
    _steps_actually_run(out)
    domains = sorted(c[len(BPB_PREFIX):] for c in out.columns if c.startswith(BPB_PREFIX))
    for d in domains:
        out[f"bpb_{d}"] = pd.to_numeric(out[BPB_PREFIX + d], errors="coerce")
    for d in sorted(c[len(BPB_SE_PREFIX):] for c in out.columns if c.startswith(BPB_SE_PREFIX)):
        out[SE_COLUMN_PREFIX + d] = pd.to_numeric(out[BPB_SE_PREFIX + d], errors="coerce")
    if domains and "bpb" not in out.columns:  # a mean over fewer domains is another quantity: empty instead
        out["bpb"] = out[[f"bpb_{d}" for d in domains]].mean(axis=1, skipna=False)
    out["diverged"] = out.get("tags.diverged", pd.Series("false", index=out.index)).map(is_true_tag).astype(bool)
    bpb_cols = [c for c in out.columns if c == "bpb" or c.startswith("bpb_")]
    out.loc[out["diverged"], bpb_cols] = np.nan
    return out.copy()  # one block per dtype: the column-by-column inserts above leave it fragmented


def _steps_actually_run(out: pd.DataFrame) -> None:
    """A run capped by `max_steps` trained min(steps, max_steps) steps and proportionally fewer tokens
    per parameter than planned: the laws must see what was run (`steps`, `tpp`); the plan stays in
    `steps_planned`, `tpp_planned`."""
    if "steps" not in out.columns or "params.max_steps" not in out.columns:
        return
    cap = pd.to_numeric(out["params.max_steps"], errors="coerce")
    planned = out["steps"]
    run = planned.where(~(cap < planned), cap)
    out["steps_planned"] = planned
    out["steps"] = run
    if "tpp" in out.columns:
        out["tpp_planned"] = out["tpp"]
        out["tpp"] = out["tpp"] * run / planned


def domains_of(table: pd.DataFrame) -> list[str]:
    return sorted(c[4:] for c in table.columns if c.startswith("bpb_") and not c.startswith(SE_COLUMN_PREFIX))


def describe_rows(table: pd.DataFrame, labels: list, limit: int = 6) -> str:
    """Rows of a runs table as a user finds them: "lines 4, 9" where the index names the file's lines (the
    CLI's CSVs), else "runs <run_id>, ..." where there are run ids, else "rows 3, 7"; the first `limit`."""
    if table.index.name:
        kind, names = table.index.name, [str(label) for label in labels]
    elif "run_id" in table.columns:
        kind, names = "run", [str(table.at[label, "run_id"]) for label in labels]
    else:
        kind, names = "row", [str(label) for label in labels]
    more = f", … ({len(names) - limit} more)" if len(names) > limit else ""
    return f"{kind}{'s' if len(names) > 1 else ''} {', '.join(names[:limit])}{more}"


def check_domain_bpb(table: pd.DataFrame) -> None:
    """Refuse a `bpb_<domain>` cell that is neither a positive finite number nor empty (an empty cell is a run
    with no BPB on that domain: `missing_bpb`), naming the column and the row (`describe_rows`)."""
    for d in domains_of(table):
        column = f"bpb_{d}"
        raw = table[column]
        values = pd.to_numeric(raw, errors="coerce")
        text = values.isna() & raw.notna()
        if text.any():
            first = raw.index[text.to_numpy()][0]
            raise LadderInputError(f"has a non-numeric value {raw[first]!r} ({describe_rows(table, [first])}); a BPB "
                                   "is a positive number, or an empty cell for a run with none on this domain",
                                   field=column)
        bad = values.notna() & ~(np.isfinite(values) & (values > 0))
        if bad.any():
            labels = list(values.index[bad.to_numpy()])
            raise LadderInputError(f"has {len(labels)} value(s) that are not a positive finite BPB (first "
                                   f"{values[labels[0]]:g}, {describe_rows(table, labels[:1])}); a BPB is a positive "
                                   "number, or an empty cell for a run with none on this domain", field=column)


def missing_bpb(table: pd.DataFrame) -> dict[str, list]:
    """Per domain with any, the index labels of the runs whose `bpb_<domain>` is empty (NaN): a run that
    diverged (`fit_table` blanks its BPB) or was not evaluated on that domain. `long_by_domain` leaves them
    out of that domain's rows."""
    out = {}
    for d in domains_of(table):
        empty = table[f"bpb_{d}"].isna().to_numpy()
        if empty.any():
            out[d] = list(table.index[empty])
    return out


def long_by_domain(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, domain) with columns `domain` and `bpb` (runs with no BPB on a domain left out of
    its rows: `missing_bpb` lists them), and `bpb_se` where the runs logged it. Where the table's index names
    its rows (the CLI's CSVs: their lines in the file), each row keeps it with its domain, "15 (code)", so
    an error about a row of the long table names the file's line."""
    domains = domains_of(table)
    if not domains:
        raise LadderInputError("the runs have no final_bpb/<domain> metrics to fit", field="--experiment")
    keep = [c for c in table.columns if not (c == "bpb" or c.startswith("bpb_"))]
    parts = [table[keep].assign(domain=d, bpb=table[f"bpb_{d}"]) for d in domains]
    if any(SE_COLUMN_PREFIX + d in table.columns for d in domains):
        parts = [part.assign(bpb_se=table.get(SE_COLUMN_PREFIX + d, np.nan)) for part, d in zip(parts, domains)]
    name = table.index.name
    if name:  # unique labels (one row of the file per domain) that still name the line
        parts = [part.set_axis(pd.Index([f"{label} ({d})" for label in part.index], name=name), axis=0)
                 for part, d in zip(parts, domains)]
    return pd.concat(parts, ignore_index=not name).dropna(subset=["bpb"])


def _flat_numbers(obj: Any, prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out |= _flat_numbers(v, f"{prefix}{k}." if prefix or k else "")
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool) and np.isfinite(obj):
        out[prefix.rstrip(".")] = float(obj)
    return out


def log_fit_run(tracking_uri: str, experiment: str, *, command: str, payload: dict[str, Any], source_run_ids: list[str],
                options: dict[str, Any], metrics: dict[str, Any]) -> str:
    """Record a fit as its own MLflow run; returns its run id."""
    from mlflow.entities import Metric, Param

    from rungs.tracking import EXPERIMENT_KIND_TAGS, log_artifact

    client = _client(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    exp_id = exp.experiment_id if exp else client.create_experiment(experiment, tags=EXPERIMENT_KIND_TAGS)
    run = client.create_run(exp_id, run_name=f"fit {command}",
                            tags={FIT_KIND_TAG: "fit", "fit_command": command, "n_source_runs": str(len(source_run_ids)),
                                  "source_runs": ",".join(source_run_ids)[:4900]})
    params = [Param(k, str(v)[:500]) for k, v in options.items() if v is not None][:100]
    numbers = list(_flat_numbers(metrics).items())
    for i in range(0, max(len(numbers), 1), 900):
        client.log_batch(run.info.run_id, params=params if i == 0 else [],
                         metrics=[Metric(k[:250], v, 0, 0) for k, v in numbers[i:i + 900]])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fit.json"
        path.write_text(json.dumps(payload, indent=2))
        log_artifact(client, tracking_uri, run.info.run_id, path)
    client.set_terminated(run.info.run_id, "FINISHED")
    log.info("logged fit %s as MLflow run %s", command, run.info.run_id)
    return run.info.run_id


def final_doc_bits(tracking_uri: str, run_ids: list[str]) -> dict[str, dict[str, list[float]] | None]:
    """Each run's final eval per-document bits (eval.json's final entry `doc_bits`: domain → bits per held-out
    document), from its MLflow artifact; None for a run without them (logged before they were kept, or with
    no final eval)."""
    from mlflow.exceptions import MlflowException

    from rungs.tracking import fetch_artifact

    client = _client(tracking_uri)
    out: dict[str, dict[str, list[float]] | None] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for run_id in run_ids:
            try:
                path = fetch_artifact(client, tracking_uri, run_id, "eval.json", Path(tmp) / run_id)
                evals = json.loads(path.read_text()).get("evals", [])
            except (OSError, ValueError, MlflowException) as err:  # no such artifact, or a damaged one
                log.debug("run %s: no readable eval.json (%s)", run_id, err)
                out[run_id] = None
                continue
            final = [e for e in evals if e.get("final") and e.get("doc_bits")]
            out[run_id] = final[-1]["doc_bits"] if final else None
    return out
