"""`ladder fit power-law`: y = E + A·x^(−α) per group, with bootstrap intervals and the held-out-rung backtest.

JSON contract (DESIGN.md): {"fits": [{"group", "E", "A", "alpha", "ci", "backtest"}]}, one entry per
group. A group whose law could not be fitted (E on its bound under `--floor fit`, too few or too narrow
rungs, a bootstrap that cannot run) carries E = A = alpha = null and its own reason, naming it, in
"not_identified" and "reason"; exit 0 when any group was fitted, 1 when none was; bad input for the
whole table exits 2. Where a group was refused for showing no loss floor, "hint" names `--floor auto`.
The laws come from the one step `fits.compute_laws.fit_power_laws` (`--select`, `--floor`); every
interval printed follows the one interval rule (`FitResult.interval_note`: "n/a" where there is none).

`--group domain` on a runs table with per-domain `bpb_<domain>` columns (what `ladder fit --experiment`
reads, and `notebooks/fixtures/demo_runs.csv`) fits one law per domain, one row per (run, domain).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import pandas as pd

from fits.compute_laws import DEFAULT_SELECT, SELECT_RULES
from ladder.cli.fit.inputs import (NO_FLOOR_HINT, SMALL_LADDER_HINT, add_ci_level_and_seed, check_counts_and_level, add_floor_arg, column_arg, delta_arg, finish,
                                   input_error, is_no_floor, load_input, per_domain_rows)
from ladder.cli.output import make_table, print_json, stdout_console
from ladder.errors import LadderInputError

def register(fit_sub: argparse._SubParsersAction, common) -> None:
    q = fit_sub.add_parser("power-law", help="y = E + A·x^(−α) per group (BPB against training FLOPs); a group that "
                                            "cannot be fitted is reported with its reason, the others fitted; exit 1 "
                                            "when no group could be fitted")
    common(q)
    q.add_argument("--x", help="compute column (default with --experiment: train_flops)")
    q.add_argument("--y", help="metric column (default with --experiment: bpb, one law per domain)")
    q.add_argument("--group", help="one law per value of this column (default with --experiment: domain; 'domain' on "
                                   "a table with bpb_<domain> columns: one law per domain)")
    q.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for intervals (default 1000)")
    q.add_argument("--holdout-top", type=int, default=1, help="rungs held out for the backtest (default 1; 0: none)")
    q.add_argument("--progressive", action="store_true", help="also backtest adding rungs one at a time")
    q.add_argument("--select", choices=sorted(SELECT_RULES), default=DEFAULT_SELECT,
                   help="which runs the law is fitted on: 'ladder' (default) the ladder block, one run per rung at "
                        "the recipe's TPP and the law's LR/WD (a table without a 'block' column is the ladder); "
                        "'best' the best run per compute; 'all' every run (fits.compute_laws says why)")
    q.add_argument("--all-runs", action="store_true", help="fit every run (the same as --select all), e.g. the "
                   "repeated seeds of every rung")
    q.add_argument("--cluster", help="bootstrap whole clusters of rows (e.g. a run id repeated over checkpoints)")
    q.add_argument("--delta", type=delta_arg, default=None,
                   help="Huber threshold on log residuals: a number (default 1e-3, Hoffmann et al.) or 'auto' "
                        "(1.345 × the seed-to-seed noise of log BPB, for ladders with repeated seeds)")
    add_floor_arg(q)
    add_ci_level_and_seed(q)
    q.set_defaults(handler=run_power_law)


def run_power_law(args: argparse.Namespace) -> int:
    from ladder.run.mlflow_runs import domains_of
    from fits.bootstrap import TooFewRungsForBootstrap
    from fits.compute_laws import fit_power_laws
    from fits.errors import FitBoundaryError, FitError

    df, source = load_input(args)
    x, y = column_arg(args, "x", "train_flops"), column_arg(args, "y", "bpb")
    group = args.group or ("domain" if args.experiment and y == "bpb" else None)
    wide_domains = domains_of(df) if group == "domain" and y == "bpb" and "domain" not in df.columns else []
    df = per_domain_rows(df, group, y, where=source.get("csv") or args.experiment, x=x)
    check_counts_and_level(args)
    if args.cluster and args.cluster not in df.columns:  # the whole table's problem: once, before any group is fitted
        raise LadderInputError(f"no column {args.cluster!r} to bootstrap clusters of; the table has "
                               f"{sorted(map(str, df.columns))}", where=source.get("csv") or args.experiment,
                               field="--cluster")
    select = "all" if args.all_runs else args.select
    delta_kw = {} if args.delta is None else {"delta": args.delta}
    try:  # table-level problems (a missing or non-numeric column, no ladder rows) are bad input for every group
        laws_set = fit_power_laws(df, x, y, group=group, select=select, floor=args.floor, bootstrap=args.bootstrap,
                                  ci_level=args.ci_level, seed=args.seed, cluster=args.cluster, **delta_kw)
    except FitError as err:
        raise input_error(err, source) from None
    source["selection"] = laws_set.selection
    if select == "best":
        source["frontier"] = "best run per compute value (--all-runs to fit every run)"
    df = laws_set.rows
    fits, saved, laws = [], {}, {}
    for label in laws_set.names:
        name = None if group is None else label
        part = laws_set.rows_of(label)
        if label in laws_set.errors:
            err = laws_set.errors[label]
            if name is None and isinstance(err, TooFewRungsForBootstrap):
                raise input_error(FitError(f"{err} ({SMALL_LADDER_HINT})"), source) from None
            if name is None and not isinstance(err, FitBoundaryError):
                raise input_error(err, source) from None
            # One group's law not fitted (no floor in the data, too few or too narrow rungs, a bootstrap
            # that cannot run): say so for that group, by name, and go on with the others instead of
            # losing every domain's result. Its backtest still runs where it can: the prediction of the
            # top rung is identified even where E is not (fits.backtest).
            reason = f"{label}: {err}"
            fits.append({"group": name, "E": None, "A": None, "alpha": None, "ci": {}, "ci_level": args.ci_level,
                         "backtest": _backtest(part, x, y, args, delta_kw), "n_points": len(part),
                         "not_identified": reason, "reason": reason,
                         **({"hint": NO_FLOOR_HINT} if is_no_floor(err) else {}),
                         **({"hint": SMALL_LADDER_HINT} if isinstance(err, TooFewRungsForBootstrap) else {})})
            continue
        fit = laws_set.laws[label]
        d = fit.to_dict()
        fits.append({"group": d["group"], **fit.params, "ci": d["ci"], "ci_level": d["ci_level"],
                     "backtest": _backtest(part, x, y, args, delta_kw),
                     **({"progressive_backtest": _progressive(part, label, x, y, args, delta_kw)}
                        if args.progressive else {}),
                     "n_points": fit.n_points, "objective": fit.objective, "x_range": d["x_range"],
                     "floor_at_zero": d["floor_at_zero"], "bootstrap_failed": d.get("bootstrap_failed", 0),
                     "rows_used": d["rows_used"], "options": d["options"], "code_version": d["code_version"],
                     **{k: d[k] for k in ("interval", "flags") if k in d}})
        saved[label] = fit.to_dict(include_draws=True)
        laws[label] = fit
    for domain in sorted(set(wide_domains) - {str(f["group"]) for f in fits}):  # no run has a BPB there (said above)
        reason = f"{domain}: no run has a BPB on this domain (bpb_{domain} is empty in every run)"
        fits.append({"group": domain, "E": None, "A": None, "alpha": None, "ci": {}, "ci_level": args.ci_level,
                     "backtest": None, "n_points": 0, "not_identified": reason, "reason": reason})
    no_floor = any(f.get("hint") == NO_FLOOR_HINT for f in fits)
    few_rungs = any(f.get("hint") == SMALL_LADDER_HINT for f in fits)
    if not laws and not group:  # the data refused the law (exit 1, as for groups), not a bad table (2)
        message = "; ".join(f["not_identified"] for f in fits) + (f" ({NO_FLOOR_HINT})" if no_floor else "")
        if args.json:
            print_json({"fits": fits, "source": source, **({"hint": NO_FLOOR_HINT} if no_floor else {})})
        print(f"ladder fit: {input_error(FitBoundaryError(message), source)}", file=sys.stderr)
        return 1
    if not laws:  # every group refused, each with its own reason
        if args.json:
            print_json({"fits": fits, "source": source, **({"hint": NO_FLOOR_HINT} if no_floor else {}),
                        **({"small_ladder_hint": SMALL_LADDER_HINT} if few_rungs else {})})
        print(f"no group could be fitted ({len(fits)} of {len(fits)} refused):", file=sys.stderr)
        for f in fits:
            print(f"  {f['reason']}", file=sys.stderr)
        if no_floor:
            print(NO_FLOOR_HINT, file=sys.stderr)
        if few_rungs:
            print(SMALL_LADDER_HINT, file=sys.stderr)
        return 1
    payload = {"fits": fits, "source": source, **({"hint": NO_FLOOR_HINT} if no_floor else {})}
    if args.plot:
        from fits.plots import plot_power_laws

        panels = {f["group"] or y: laws.get(f["group"] or y) for f in fits}  # None: data only, law not identified
        plot_power_laws(panels, df, x=x, y=y, group=group, path=args.plot, holdout_top=args.holdout_top,
                        backtests={f["group"] or y: f["backtest"] for f in fits})
        payload["plot"] = args.plot
    finish(args, payload, source, df, {"power_law": saved},
           {f["group"] or y: {"E": f["E"], "A": f["A"], "alpha": f["alpha"]} for f in fits if f["E"] is not None})
    if args.json:
        print_json(payload)
    else:
        stdout_console.print(make_table(f"power law {y} = E + A·{x}^(−α) (floor: {args.floor})",
                                        ["domain", "E", "A", "alpha", "alpha CI", "points",
                                         "top rung held out: actual vs predicted (interval)", "inside",
                                         "interval ± (variance shares)"],
                                        [_table_row(f, y, laws.get(f["group"] or y)) for f in fits]))
        if args.progressive:
            stdout_console.print(make_table(f"progressive backtest: each rung predicted by the law fitted on the "
                                            f"rungs below it ({args.ci_level:.0%} intervals)",
                                            ["domain", "rungs fitted", x, "actual vs predicted (interval)", "inside",
                                             "alpha"], _progressive_rows(fits, y)))
    _notes(fits, y, no_floor)
    return 0


def _progressive_rows(fits: list[dict[str, Any]], y: str) -> list[list[Any]]:
    """The progressive backtest of every group as table rows: one per step, a step that could not be fitted
    (or a group whose progressive backtest could not run) with its reason."""
    rows: list[list[Any]] = []
    for f in fits:
        label = f["group"] or y
        if f["E"] is None:
            rows.append([label, "-", "-", "law not fitted: no progressive backtest", "-", "-"])
            continue
        prog = f.get("progressive_backtest") or {}
        if "skipped" in prog:
            rows.append([label, "-", "-", f"skipped: {prog['skipped']}", "-", "-"])
        for step in prog.get("steps", []):
            if "error" in step:  # the reason, often long and the same for every group, once on stderr (_notes)
                rows.append([label, step["n_rungs_fitted"], f"{step['x']:.4g}", "not fitted (reason below)", "-", "-"])
                continue
            available = step.get("interval_available", True) and step.get("lo") is not None
            band = f"[{step['lo']:.4g}, {step['hi']:.4g}]" if available else "(interval n/a)"
            rows.append([label, step["n_rungs_fitted"], f"{step['x']:.4g}",
                         f"{step['actual']:.4g} vs {step['predicted']:.4g} {band} {step['rel_error']:+.2%}"
                         + (" (E=0)" if step.get("floor_at_zero") else ""),
                         str(step.get("inside")) if available else "n/a", f"{step['alpha']:.4g}"])
    return rows


def _table_row(f: dict[str, Any], y: str, law) -> list[Any]:
    bt = f["backtest"] or {}
    pred = max(bt.get("predictions") or [{}], key=lambda p: p.get("x", 0.0))  # the TOP held-out rung
    held_out = bt.get("skipped", "-")
    if pred:
        band = f"[{pred['lo']:.4g}, {pred['hi']:.4g}]" if pred.get("interval_available", True) else "(interval n/a)"
        held_out = (f"{pred['actual']:.4g} vs {pred['predicted']:.4g} {band} "
                    f"{pred['rel_error']:+.2%}" + (" (E=0)" if bt.get("floor_at_zero") else ""))
    inside = str(pred.get("inside", "-")) if pred.get("interval_available", True) else "n/a"
    width = "n/a" if pred and not pred.get("interval_available", True) else "-"  # the one interval rule
    if pred.get("interval"):
        from fits.prediction import describe_shares

        width = f"±{pred['half_width_rel']:.1%} ({describe_shares(pred['interval']['shares'])})"
        common = pred["interval"].get("heldout_sampling_common")
        if common:  # the held-out set's error moves every rung alike: beside the interval, not in it
            width += f"; held-out set ±{common:.1%} common to every rung*"
    if law is None:
        return [f["group"] or y, "not fitted", "-", "-", "-", f["n_points"], held_out, inside, width]
    ci = f["ci"].get("alpha")
    alpha_ci = f"[{ci[0]:.4g}, {ci[1]:.4g}]" if ci else "n/a"  # the one interval rule: n/a where there is none
    E = ("0 (fixed)" if f["options"].get("floor") == "zero" else "0 (no floor)") if f["floor_at_zero"] else f["E"]
    return [f["group"] or y, E, f["A"], f["alpha"], alpha_ci, f["n_points"], held_out, inside, width]


def _notes(fits: list[dict[str, Any]], y: str, no_floor: bool) -> None:
    """What the table cannot say, on stderr: refusals, E = 0 laws, flags, intervals not available."""
    for f in fits:
        label = f["group"] or y
        if f["E"] is None and f["n_points"]:  # a domain with no BPB at all was said when the table was read
            print(f["not_identified"], file=sys.stderr)
        if f.get("floor_at_zero") and f["options"].get("floor") != "zero":
            print(f"{label}: E = 0, no loss floor over these rungs: the nested law A·x^(−α); its predictions near "
                  "the range are identified, E is not", file=sys.stderr)
        for flag in f.get("flags") or []:
            print(f"{label}: {flag}", file=sys.stderr)
        if (f.get("interval") or {}).get("available") is False:
            print(f"{label}: interval not available: {f['interval']['reason']}", file=sys.stderr)
    step_errors: dict[tuple[int, str], list[str]] = {}
    for f in fits:
        for step in (f.get("progressive_backtest") or {}).get("steps", []):
            if "error" in step:
                step_errors.setdefault((step["n_rungs_fitted"], step["error"]), []).append(f["group"] or y)
    for (k, error), labels in step_errors.items():
        print(f"progressive backtest, law on the {k} lowest rungs not fitted ({', '.join(labels)}): {error}",
              file=sys.stderr)
    if no_floor:
        print(NO_FLOOR_HINT, file=sys.stderr)
    if any((p.get("interval") or {}).get("heldout_sampling_common") for f in fits
           for p in (f.get("backtest") or {}).get("predictions") or []):
        from fits.prediction import HELDOUT_COMMON_NOTE

        print(f"* {HELDOUT_COMMON_NOTE}", file=sys.stderr)


def _backtest(part: pd.DataFrame, x: str, y: str, args: argparse.Namespace,
              delta_kw: dict[str, Any]) -> dict[str, Any] | None:
    from fits.backtest import backtest_floor, holdout_backtest
    from fits.errors import FitBoundaryError, FitError, FitInputError

    if args.holdout_top == 0:
        return None
    try:
        return holdout_backtest(part, x, y, holdout_top=args.holdout_top, bootstrap=max(args.bootstrap, 200),
                                ci_level=args.ci_level, seed=args.seed, floor=backtest_floor(args.floor), **delta_kw)
    except FitInputError as err:  # too few rungs to hold one out: say so instead of failing the fit
        return {"skipped": err.detail}
    except FitBoundaryError as err:  # the rungs below the top do not pin the law down on their own
        return {"skipped": "law below the top not identified", "reason": str(err)}
    except FitError as err:  # e.g. a bootstrap the rungs below the top cannot support
        return {"skipped": "backtest not possible", "reason": str(err)}


def _progressive(part: pd.DataFrame, label: str, x: str, y: str, args: argparse.Namespace,
                 delta_kw: dict[str, Any]) -> dict[str, Any]:
    from fits.backtest import backtest_floor, progressive_backtest
    from fits.errors import FitError

    try:
        return progressive_backtest(part, x, y, bootstrap=max(args.bootstrap, 200), ci_level=args.ci_level,
                                    seed=args.seed, floor=backtest_floor(args.floor), **delta_kw)
    except FitError as err:
        return {"skipped": f"{label}: {getattr(err, 'detail', err)}"}
