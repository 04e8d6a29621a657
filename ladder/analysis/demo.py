"""`ladder demo`: the whole flow on embedded defaults, the first thing a new user runs.

Prepare the demo corpus → run `sweeps/demo.yaml` on local Ray (finished trials are reused) →
fit BPB vs FLOPs per held-out domain with bootstrap intervals and backtest the top rung → fit the
LR/WD surfaces of the rungs that swept them → recipe cards for the cpu-demo rung two steps above
the ladder and for mai-base-2 L102 (with the report's laws, labelled so) → `runs/demo/report.html`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from fits.results import jsonable
from ladder.analysis.demo_result import DemoResult
from ladder.analysis.recipe_card import build_card
from ladder.analysis.sweep_eta import SweepEta
from ladder.errors import LadderInputError
from ladder.run.mlflow_runs import domains_of, fit_table, long_by_domain, read_runs

if TYPE_CHECKING:
    from fits.compute_laws import PowerLawSet

log = logging.getLogger(__name__)

DEMO_SPEC = "demo"
STEPS_ABOVE_LADDER = 2
DEMO_FLOOR = "auto"  # the floor rule of the demo's compute laws (fit_compute_laws says why)
SURFACE_COLUMNS = ("bpb", "lr", "wd", "train_flops", "params_active", "steps", "tpp")


def current_runs(runs: pd.DataFrame, spec) -> pd.DataFrame:
    """The runs of the sweep's current plan (an experiment keeps runs of earlier recipe versions: another
    corpus, another LR law), each with its `block`: the ladder's where the ladder block asked for its key,
    whichever block the plan lists first (the LR/WD grid's centre is the ladder's rung, trained once)."""
    from fits.compute_laws import LADDER_BLOCK
    from sweeps.plan import plan_sweep

    block_of = {p.key: LADDER_BLOCK if LADDER_BLOCK in p.blocks else p.trial.block for p in plan_sweep(spec)}
    current = runs[runs["trial_key"].isin(block_of)] if "trial_key" in runs.columns else runs.iloc[:0]
    return current.assign(block=current["trial_key"].map(block_of)) if len(current) else current


def ladder_runs(current: pd.DataFrame) -> pd.DataFrame:
    """The runs a compute law is fitted on: of the sweep's current plan (`current_runs`' table), those the
    one selection rule keeps (`fits.compute_laws`: the ladder block, one run per rung at the recipe's TPP
    and the law's LR/WD); refused when every one of them diverged."""
    from fits.compute_laws import select_runs
    from fits.errors import FitInputError

    try:
        chosen, _ = select_runs(current, "train_flops", "bpb")
    except FitInputError as err:
        raise LadderInputError(f"no finished ladder runs of the sweep to fit: {err.detail}", field="demo") from None
    if chosen.empty:
        raise LadderInputError("no finished runs of the sweep's current plan to fit", field="demo")
    finite = chosen[pd.to_numeric(chosen["bpb"], errors="coerce").notna()]
    if finite.empty:
        raise LadderInputError(f"all {len(chosen)} ladder runs of the sweep diverged (no BPB to fit); their MLflow "
                               "runs say why", field="demo")
    return chosen


def demo_compute_laws(long: pd.DataFrame, *, bootstrap: int) -> PowerLawSet:
    """Each domain's compute law as the demo fits it: the one step (`fits.compute_laws.fit_power_laws`)
    with its default selection and the floor rule DEMO_FLOOR ("auto", `fits.floors`). A domain whose
    rungs show no loss floor gets the nested law A·C^(−α) (E on its lower bound, `extra["floor_at_zero"]`,
    said in the log, the figure, the report and the card): a demo ladder spans two decades of compute,
    where a floor is rarely visible, and its card at two rungs above the top needs a law; its predictions
    near the fitted range are identified, E is not (`fits.power_law`). `ladder fit power-law --floor auto`
    and `ladder extrapolate --floor auto` fit the same laws on the same runs."""
    from fits.compute_laws import fit_power_laws

    laws = fit_power_laws(long, "train_flops", "bpb", group="domain", floor=DEMO_FLOOR, bootstrap=bootstrap)
    for domain, law in sorted(laws.laws.items()):
        if law.extra.get("floor_at_zero"):
            log.warning("power law for %s: E = 0, no loss floor over these rungs: the nested law A·C^-α "
                        "(α = %.3g); its predictions near the range are identified, E is not", domain,
                        law.params["alpha"])
    return laws


def fit_compute_laws(long: pd.DataFrame, *, bootstrap: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each domain's compute law (`demo_compute_laws`) and the backtest of its top rung on the same rows;
    a domain whose law is not fitted says why."""
    from fits.backtest import backtest_floor, holdout_backtest
    from fits.errors import FitError

    laws = demo_compute_laws(long, bootstrap=bootstrap)
    backtests = {}
    for domain in laws.names:
        # The top rung is predicted even where E is not identified (E = 0 below the top, flagged).
        try:
            backtests[domain] = holdout_backtest(laws.rows_of(domain), "train_flops", "bpb", holdout_top=1,
                                                 bootstrap=min(bootstrap, 400), floor=backtest_floor(DEMO_FLOOR))
        except FitError as err:
            backtests[domain] = {"error": str(err)}
        if domain in laws.errors:  # said in the report and on stderr, never papered over
            log.warning("power law for %s: %s", domain, laws.errors[domain])
            backtests[domain]["law_error"] = f"law not fitted: {laws.errors[domain]}"
    return laws.laws, backtests


def fit_lr_wd_surfaces(runs: pd.DataFrame) -> tuple[list[Any], list[dict[str, Any]]]:
    """One weighted quadratic surface over (log LR, log LR·WD) per rung that swept LR/WD. The runs table
    (`fit_table`'s) needs SURFACE_COLUMNS as numbers; a missing or non-numeric one is refused by name."""
    from fits.errors import FitError, FitInputError
    from fits.surfaces import fit_surface

    table = runs.copy()
    for column in SURFACE_COLUMNS:
        if column not in table.columns:
            raise FitInputError(f"no such column; the LR/WD surfaces need {list(SURFACE_COLUMNS)}, the table has "
                                f"{sorted(map(str, runs.columns))}", column=column)
        # as `fit_table` reads an MLflow table: numbers written as text are numbers, any other text is refused
        values = pd.to_numeric(table[column], errors="coerce")
        bad = table[column][values.isna() & table[column].notna()]
        if len(bad):
            raise FitInputError(f"holds non-numbers (first {bad.iloc[0]!r} at row {bad.index[0]!r})", column=column)
        table[column] = values
    surfaces, errors = [], []
    for flops, part in table.dropna(subset=["lr", "wd"]).groupby("train_flops"):
        if part["lr"].nunique() >= 3 and part["bpb"].isna().all():  # said, not a surface that vanishes
            errors.append({"train_flops": float(flops), "error": "no run of this rung has a BPB on every held-out "
                           "domain (the surface fits their mean)"})
    table = table.dropna(subset=["bpb", "lr", "wd"]).assign(lr_wd=lambda t: t["lr"] * t["wd"])
    for flops, part in table.groupby("train_flops"):
        if part["lr"].nunique() < 3:
            continue
        key = {"train_flops": float(flops), "params_active": float(part["params_active"].iloc[0]),
               "steps": float(part["steps"].median()), "tpp": float(part["tpp"].iloc[0])}
        try:
            surfaces.append(fit_surface(part, ["lr", "lr_wd"], "bpb", key=key))
        except FitError as err:
            errors.append({**key, "error": str(err)})
    return surfaces, errors


def demo_cards(recipe_ref: str, target_rung: int, laws: dict) -> dict[str, dict]:
    """The demo's recipe cards: its own recipe's at `target_rung` with the laws it fitted, and MAI-Base-2
    L102's. `recipe_ref` is the spec's `recipe` as written, a shipped name or a path to a recipe file
    (a recipe loaded from a path is not found again by its name)."""
    own = build_card(recipe_ref, target_rung, laws)
    # A CPU ladder cannot fit a 2.8T model's laws: the L102 card uses the report's, labelled as such.
    return {f"{own['target']['recipe']} L{target_rung}": own,
            "mai-base-2 L102": build_card("mai-base-2", 102, {"power_law": {}, "hparams": None, "files": []})}


def check_demo_inputs(spec_name: str, tracking_uri: str | None, *, new_store: bool = False, bootstrap: int = 1000):
    """The checks `ladder sweep run` makes, before the demo writes anything: the spec (a bad one is named
    by its file, as `ladder sweep plan` names it), a trial that cannot fit its GPU, and the store (a
    --tracking-uri the user names must exist unless `new_store`; the default store may be created); and
    the fits' `bootstrap` (refused after the sweep, it cost the sweep's minutes).
    Returns (spec, where, recipe, store, create_store)."""
    from fits.errors import FitInputError
    from fits.validate import check_bootstrap
    from ladder.run.orchestrate import check_fits_this_machine, default_store
    from ladder.run.stores import check_store
    from rungs.tracking_uri import is_embedded_default
    from sweeps.cost import check_fits_memory, cost_sweep
    from sweeps.plan import plan_sweep, spec_recipe
    from sweeps.spec import load_spec, resolve_spec_path

    try:
        check_bootstrap(bootstrap)
    except FitInputError as err:
        raise LadderInputError(err.detail, field="--bootstrap") from None
    where = str(resolve_spec_path(spec_name))
    spec = load_spec(where)
    planned = plan_sweep(spec, where=where)  # bad specs fail here, named by their file
    recipe = spec_recipe(spec, where=where)
    if any(p.trial.resources.gpu_memory for p in planned):
        check_fits_memory(cost_sweep(planned, recipe), where=where)
    store = default_store(tracking_uri)
    create_store = new_store or is_embedded_default(tracking_uri)
    check_store(store, create=create_store, command="ladder demo")  # reads only: a store it may create is made later
    check_fits_this_machine(planned, where=where)  # the demo's private local Ray: before its data is prepared
    return spec, where, recipe, store, create_store


def run_demo(*, out_dir: Path = Path("runs/demo"), tracking_uri: str | None = None, spec_name: str = DEMO_SPEC,
             bootstrap: int = 1000, progress: Callable[[str], None] = log.info, new_store: bool = False) -> DemoResult:
    """The demo (module docstring). Its spec and store are checked (`check_demo_inputs`) before any
    folder is created or data prepared; `new_store` lets a named --tracking-uri that does not exist
    be created (the default store always may be)."""
    from ladder.run.orchestrate import run_sweep
    from rungs.data.prepare import ensure_prepared

    t0 = time.perf_counter()
    spec, where, recipe, uri, create_store = check_demo_inputs(spec_name, tracking_uri, new_store=new_store,
                                                               bootstrap=bootstrap)
    out_dir.mkdir(parents=True, exist_ok=True)

    progress("[1/5] demo corpus: tokenizing the shipped multi-domain corpus (cached after the first run)")
    ensure_prepared(vocab_size=recipe.vocab_size)

    progress(f"[2/5] sweep {spec.name}: the {recipe.name} ladder and its LR/WD grid on local Ray (about 13 min on "
             "an AMX CPU, 23 min on 2 AVX2 cores; the time left follows each finished trial)")
    eta = SweepEta(_trial_flops(spec), progress)
    eta.start()
    outcome = run_sweep(spec, where=where, tracking_uri=uri, progress=eta, create_store=create_store, on_todo=eta.todo)
    sweep = {"trials": len(outcome.rows), "states": pd.Series([r.state for r in outcome.rows]).value_counts().to_dict(),
             "ran_now": sum(bool(getattr(r, "ran_now", False)) for r in outcome.rows)}
    result = DemoResult(out_dir=out_dir, tracking_uri=uri, experiment=outcome.experiment, sweep=sweep)

    progress(f"[3/5] fits: BPB vs FLOPs per domain ({bootstrap} bootstrap resamples) and the top-rung backtest")
    runs = current_runs(fit_table(read_runs(outcome.experiment, uri)), spec)
    best = long_by_domain(ladder_runs(runs))
    result.power_laws, result.backtests = fit_compute_laws(best, bootstrap=bootstrap)
    for domain in domains_of(runs):  # a held-out domain no ladder run scored: said, not dropped
        if domain not in result.power_laws and domain not in result.backtests:
            why = "no ladder run has a BPB on this held-out domain"
            log.warning("power law for %s: %s", domain, why)
            result.backtests[domain] = {"error": why, "law_error": f"law not fitted: {why}"}
    if not result.power_laws:
        log.warning("no domain's BPB-vs-FLOPs law could be fitted from the demo runs; the report shows why")

    progress("[4/5] LR/WD surfaces in (log LR, log LR·WD) and recipe cards")
    result.surfaces, result.surface_errors = fit_lr_wd_surfaces(runs)
    target_rung = max(spec_rungs(spec)) + STEPS_ABOVE_LADDER
    laws = {"power_law": result.power_laws, "hparams": None, "files": [],
            "experiment": {"experiment": outcome.experiment, "tracking_uri": uri, "n_runs": len(runs),
                           "run_ids": runs["run_id"].tolist()}}
    result.cards = demo_cards(spec.recipe, target_rung, laws)

    progress("[5/5] figures and report")
    from ladder.analysis.report import write_figures, write_report

    result.figures = write_figures(result, best, runs)
    result.wall_seconds = time.perf_counter() - t0
    write_report(result, best)
    (out_dir / "demo.json").write_text(json.dumps(jsonable(summary(result)), indent=2))
    return result


def _trial_flops(spec) -> dict[str, float]:
    """Each trial's training FLOPs by label, from the sweep plan (no torch): what the time left weighs by."""
    from sweeps.cost import cost_sweep
    from sweeps.plan import plan_sweep, spec_recipe

    planned = plan_sweep(spec)
    cost = {t.key: t.train_flops for t in cost_sweep(planned, spec_recipe(spec)).trials}
    return {p.label: cost[p.key] for p in planned}


def spec_rungs(spec) -> list[int]:
    return sorted({L for block in spec.blocks for L in block.rungs})


def summary(result: DemoResult) -> dict[str, Any]:
    return {
        "report": str(result.report_path),
        "tracking_uri": result.tracking_uri,
        "experiment": result.experiment,
        "sweep": result.sweep,
        "laws": {d: _law_summary(law) for d, law in result.power_laws.items()},
        "backtest": {d: ({"error": b["error"]} if "error" in b else
                         {"rel_error": b["predictions"][0]["rel_error"], "inside": b["all_inside"],
                          "floor_at_zero": b["floor_at_zero"]})
                     for d, b in result.backtests.items()},
        "surfaces": [s.to_dict() for s in result.surfaces],
        "cards": result.cards,
        "wall_seconds": result.wall_seconds,
    }


def _law_summary(law) -> dict[str, Any]:
    """A law's parameters and intervals as the report shows them: none where the one interval rule gives none,
    and no interval for E where E sits at zero (no floor seen: the nested law A·C^-α, E not identified)."""
    floor_at_zero = bool(law.extra.get("floor_at_zero"))
    ci = dict(law.ci) if law.interval_note is None else {}
    if floor_at_zero:
        ci.pop("E", None)
    return {**law.params, "ci": ci, "floor_at_zero": floor_at_zero}
