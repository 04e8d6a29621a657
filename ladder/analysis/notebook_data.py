"""Where the analysis notebooks get their runs: an MLflow experiment (the demo's by default), or
the small committed fixtures in `notebooks/fixtures/` (real runs exported from this platform).

`LADDER_NOTEBOOK_SOURCE=fixture` forces the fixtures (the test suite does this); `mlflow` forces
the experiment; unset, the experiment is used when it holds runs of the sweep's current plan and
the fixture otherwise; any other value is refused. An experiment accumulates runs of earlier recipe
versions (a sweep reruns only what its trial keys say changed), so with `spec` both readers keep only
that sweep spec's current-plan runs: a notebook shows one recipe version, as the fixture does.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from fits.compute_laws import DEFAULT_SELECT, PowerLawSet, fit_power_laws
from fits.floors import DEFAULT_FLOOR
from ladder.errors import LadderInputError
from ladder.run.mlflow_runs import DEFAULT_TRACKING_URI, fit_table, long_by_domain, read_runs

FIXTURES = Path(__file__).resolve().parents[2] / "notebooks" / "fixtures"
# `make demo`'s store (DEFAULT_TRACKING_URI, relative to the working directory it ran in: the repository's root),
# named from the repository: a Jupyter kernel starts in notebooks/, where the relative path finds no store.
DEMO_STORE = f"sqlite:///{FIXTURES.parents[1] / DEFAULT_TRACKING_URI.removeprefix('sqlite:///')}"
SOURCES = ("auto", "fixture", "mlflow")  # LADDER_NOTEBOOK_SOURCE's values
KEEP = ["run_id", "rung", "block", "arm", "seed", "data_seed", "data_order", "lr", "wd", "dropout", "steps", "tpp", "params_active", "train_flops",
        "wall_seconds", "tokens", "final_loss", "diverged", "bpb"]


def load_runs(experiment: str, fixture: str, *, spec: str | None = None,
              tracking_uri: str | None = None) -> tuple[pd.DataFrame, str]:
    """(runs table with canonical columns, a sentence saying where they came from)."""
    mode = os.environ.get("LADDER_NOTEBOOK_SOURCE") or "auto"
    if mode not in SOURCES:  # a misspelt choice must not fall back to the other source unnoticed
        raise LadderInputError(f"must be one of {', '.join(SOURCES)} (unset: auto), got {mode!r}",
                               field="LADDER_NOTEBOOK_SOURCE")
    uri = tracking_uri or os.environ.get("LADDER_TRACKING_URI", DEMO_STORE)
    if mode != "fixture":
        try:
            table = fit_table(read_runs(experiment, uri))
            where = f"MLflow experiment {experiment!r} at {uri}"
            if spec is not None:
                table = current_plan_runs(table, spec, experiment)
                where += f" ({len(table)} runs, the current plan of sweep {spec!r})"
            return table, where
        except LadderInputError:
            if mode == "mlflow":
                raise
        except Exception as err:  # no store at all on a fresh machine
            if mode == "mlflow":
                raise LadderInputError(f"cannot read {uri}: {err}", field="LADDER_TRACKING_URI") from None
    path = FIXTURES / fixture
    if not path.is_file():
        shipped = sorted(p.name for p in FIXTURES.glob("*.csv"))
        raise LadderInputError(f"no fixture {fixture!r} (shipped: {', '.join(shipped)})", field="fixture")
    return pd.read_csv(path), f"fixture {path.name} (real runs exported from this platform)"


def compute_laws(runs: pd.DataFrame, *, bootstrap: int, select: str = DEFAULT_SELECT, floor: str = DEFAULT_FLOOR,
                 **fit_options) -> PowerLawSet:
    """Each domain's BPB-vs-FLOPs law from a runs table (`bpb_<domain>` columns), through the one step
    `ladder fit`, `extrapolate` and `demo` take (`fits.compute_laws.fit_power_laws`: the runs `select`
    keeps, the floor rule `floor`; the demo fits with floor "auto"); `.rows` are those runs, one row per
    run and domain."""
    return fit_power_laws(long_by_domain(runs), "train_flops", "bpb", group="domain", select=select, floor=floor,
                          bootstrap=bootstrap, **fit_options)


def current_plan_runs(table: pd.DataFrame, spec: str, experiment: str) -> pd.DataFrame:
    """The rows of `table` whose trial key is in sweep `spec`'s current plan; an error when none are."""
    from sweeps.plan import plan_sweep
    from sweeps.spec import load_spec

    keys = {p.key for p in plan_sweep(load_spec(spec))}
    kept = table[table["trial_key"].isin(keys)] if "trial_key" in table.columns else table.iloc[:0]
    if kept.empty:
        raise LadderInputError(f"experiment {experiment!r} has no runs of sweep {spec!r}'s current plan "
                               f"({len(keys)} trial keys)", field="spec")
    return kept


def export_fixture(experiment: str, fixture: str, *, tracking_uri: str = DEFAULT_TRACKING_URI,
                   spec: str | None = None, out_dir: Path = FIXTURES) -> Path:
    """Write an experiment's runs as a small CSV fixture (the canonical columns and per-domain BPB).

    With `spec`, only the runs of that sweep spec's current plan are kept (its trial keys): an
    experiment accumulates runs of earlier recipe versions, and a fixture should show one."""
    table = fit_table(read_runs(experiment, tracking_uri))
    if spec is not None:
        table = current_plan_runs(table, spec, experiment)
    cols = [c for c in KEEP if c in table.columns] + sorted(c for c in table.columns if c.startswith("bpb_"))
    path = out_dir / fixture
    path.parent.mkdir(parents=True, exist_ok=True)
    table[cols].to_csv(path, index=False, float_format="%.10g")
    return path
