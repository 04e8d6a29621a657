"""`ladder fit power-law|chinchilla|hparams`: fit laws to a CSV or straight to an MLflow experiment.

JSON contracts (docs/architecture.md): power-law → {"fits": [{"group", "E", "A", "alpha", "ci", "backtest"}]}, a
group whose law could not be fitted (E on its bound, too few or too narrow rungs, a bootstrap that
cannot run) carrying E = A = alpha = null and its own reason, naming it, in "not_identified" and
"reason" (exit 0 when any group was fitted, 1 when none was; bad input for the whole table exits 2);
chinchilla → E, A, B, alpha, beta; hparams → {"lr_wd_product": {coef, steps_exponent},
"log_lr": {intercept, log_tpp, log_steps}, "slices": [...]}. Fits read from MLflow are logged back
as an MLflow run of their own. `--save FILE.json` writes the laws (with bootstrap draws) in the
form `ladder extrapolate --laws` reads. Which runs a power law is fitted on is the one rule of
`fits.compute_laws` (`--select`, default the ladder block), also used by extrapolate and the demo.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

import pandas as pd

from ladder.cli.fit import efficiency
from ladder.cli.fit.inputs import delta_arg, column_arg, finish, input_error, load_input
from ladder.errors import LadderInputError
from ladder.run.mlflow_runs import DEFAULT_TRACKING_URI, long_by_domain
from ladder.plan.recipe import HparamLaws
from ladder.cli.output import make_table, print_json, stdout_console
from fits.compute_laws import DEFAULT_SELECT, SELECT_RULES

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fit", help="fit scaling and hyperparameter laws to a CSV or an MLflow experiment")
    fit_sub = p.add_subparsers(dest="fit_command", required=True, parser_class=type(p))

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--csv", help="input table (one row per run)")
        q.add_argument("--experiment", help="read the runs of this MLflow experiment instead of a CSV")
        q.add_argument("--tracking-uri", default=DEFAULT_TRACKING_URI, help=f"MLflow store (default {DEFAULT_TRACKING_URI})")
        q.add_argument("--no-log", action="store_true", help="do not log the fit back to MLflow (with --experiment)")
        q.add_argument("--save", help="write the fitted laws (with bootstrap draws) to this JSON file")
        q.add_argument("--plot", help="write a PNG figure of the fit to this path")
        q.add_argument("--json", action="store_true", help="print one JSON object")

    q = fit_sub.add_parser("power-law", help="y = E + A·x^(−α) per group (BPB against training FLOPs); a group that "
                                            "cannot be fitted is reported with its reason, the others fitted; exit 1 "
                                            "when no group could be fitted")
    common(q)
    q.add_argument("--x", help="compute column (default with --experiment: train_flops)")
    q.add_argument("--y", help="metric column (default with --experiment: bpb, one law per domain)")
    q.add_argument("--group", help="one law per value of this column (default with --experiment: domain)")
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
    q.add_argument("--ci-level", type=float, default=0.95)
    q.add_argument("--seed", type=int, default=0)
    q.set_defaults(handler=run_power_law)

    q = fit_sub.add_parser("chinchilla", help="L(N, D) = E + A/N^α + B/D^β")
    common(q)
    q.add_argument("--n", help="parameters column (default with --experiment: params_active)")
    q.add_argument("--d", help="tokens column (default with --experiment: tokens)")
    q.add_argument("--y", help="loss column (default with --experiment: bpb)")
    q.add_argument("--bootstrap", type=int, default=0, help="bootstrap resamples for intervals (default 0: none)")
    q.add_argument("--delta", type=delta_arg, default=None,
                   help="Huber threshold on log residuals (default 1e-3, Hoffmann et al.)")
    q.add_argument("--holdout-top", type=int, default=0,
                   help="also fit without the K largest model sizes and predict their runs, with intervals (default 0)")
    q.add_argument("--shared-exponent", action="store_true",
                   help="one exponent for N and D, L = E + A/N^η + B/D^η (joint fits over several token multipliers)")
    q.add_argument("--starts", choices=["hoffmann", "varpro"], default="hoffmann")
    q.add_argument("--n-starts", type=int, default=64, help="grid starts refined by L-BFGS-B (0: all 4,500)")
    q.add_argument("--ci-level", type=float, default=0.95)
    q.add_argument("--seed", type=int, default=0)
    q.set_defaults(handler=run_chinchilla)

    q = fit_sub.add_parser("hparams", help="LR/WD surfaces per slice → LR*·WD* and LR* laws (+ dropout law)")
    common(q)
    q.add_argument("--y", default="bpb", help="metric column (default bpb)")
    q.add_argument("--criterion", choices=["aic", "bic"], default="aic")
    q.set_defaults(handler=run_hparams)

    efficiency.register(fit_sub, common)


# ---------------------------------------------------------------- power law

def run_power_law(args: argparse.Namespace) -> int:
    from fits.backtest import holdout_backtest, progressive_backtest
    from fits.compute_laws import fit_power_laws
    from fits.errors import FitBoundaryError, FitError

    df, source = load_input(args)
    x, y = column_arg(args, "x", "train_flops"), column_arg(args, "y", "bpb")
    group = args.group or ("domain" if args.experiment and y == "bpb" else None)
    if args.experiment and group == "domain":
        df = long_by_domain(df)
    if group and group not in df.columns:
        raise LadderInputError(f"no such column; the table has {sorted(map(str, df.columns))}",
                               where=source.get("csv") or args.experiment, field=group)
    if args.bootstrap < 0 or args.holdout_top < 0 or not 0 < args.ci_level < 1:
        raise LadderInputError("--bootstrap and --holdout-top must be ≥ 0 and --ci-level in (0, 1)", field="--bootstrap")
    select = "all" if args.all_runs else args.select
    delta_kw = {} if args.delta is None else {"delta": args.delta}
    try:  # table-level problems (a missing or non-numeric column, no ladder rows) are bad input for every group
        laws_set = fit_power_laws(df, x, y, group=group, select=select, bootstrap=args.bootstrap,
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
            if name is None and not isinstance(err, FitBoundaryError):
                raise input_error(err, source) from None
            # One group's law not fitted (no floor in the data, too few or too narrow rungs, a bootstrap
            # that cannot run): say so for that group, by name, and go on with the others instead of
            # losing every domain's result. Its backtest still runs where it can: the prediction of the
            # top rung is identified even where E is not (fits.backtest).
            backtest = _backtest(part, x, y, args, holdout_backtest, delta_kw)
            reason = f"{label}: {err}"
            fits.append({"group": name, "E": None, "A": None, "alpha": None,
                         "ci": {}, "ci_level": args.ci_level, "backtest": backtest, "n_points": len(part),
                         "not_identified": reason, "reason": reason})
            continue
        fit = laws_set.laws[label]
        backtest = _backtest(part, x, y, args, holdout_backtest, delta_kw)
        progressive = None
        if args.progressive:
            try:
                progressive = progressive_backtest(part, x, y, bootstrap=max(args.bootstrap, 200),
                                                   ci_level=args.ci_level, seed=args.seed, **delta_kw)
            except FitError as err:
                progressive = {"skipped": f"{label}: {getattr(err, 'detail', err)}"}
        d = fit.to_dict()
        fits.append({"group": d["group"], **fit.params, "ci": d["ci"], "ci_level": d["ci_level"], "backtest": backtest,
                     **({"progressive_backtest": progressive} if args.progressive else {}), "n_points": fit.n_points,
                     "objective": fit.objective, "x_range": d["x_range"],
                     "bootstrap_failed": d.get("bootstrap_failed", 0), "rows_used": d["rows_used"],
                     "options": d["options"], "code_version": d["code_version"],
                     **{k: d[k] for k in ("interval", "flags") if k in d}})
        saved[label] = fit.to_dict(include_draws=True)
        laws[label] = fit
    if not laws and not group:
        raise input_error(FitBoundaryError("; ".join(f["not_identified"] for f in fits)), source)
    if not laws:  # every group refused, each with its own reason
        if args.json:
            print_json({"fits": fits, "source": source})
        print(f"no group could be fitted ({len(fits)} of {len(fits)} refused):", file=sys.stderr)
        for f in fits:
            print(f"  {f['reason']}", file=sys.stderr)
        return 1
    payload = {"fits": fits, "source": source}
    identified = [f for f in fits if f["E"] is not None]
    if args.plot:
        from fits.plots import plot_power_laws

        panels = {f["group"] or y: laws.get(f["group"] or y) for f in fits}  # None: data only, law not identified
        plot_power_laws(panels, df, x=x, y=y, group=group, path=args.plot, holdout_top=args.holdout_top,
                        backtests={f["group"] or y: f["backtest"] for f in fits})
        payload["plot"] = args.plot
    finish(args, payload, source, df, {"power_law": saved},
           {f["group"] or y: {"E": f["E"], "A": f["A"], "alpha": f["alpha"]} for f in identified})
    if args.json:
        print_json(payload)
        return 0
    rows = []
    for f in fits:
        ci = f["ci"].get("alpha")
        bt = f["backtest"] or {}
        pred = max(bt.get("predictions") or [{}], key=lambda p: p.get("x", 0.0))  # the TOP held-out rung
        held_out = "-"
        if pred:
            band = f"[{pred['lo']:.4g}, {pred['hi']:.4g}]" if pred.get("interval_available", True) else "[interval n/a]"
            held_out = (f"{pred['actual']:.4g} vs {pred['predicted']:.4g} {band} "
                        f"{pred['rel_error']:+.2%}" + (" (E=0)" if bt.get("floor_at_zero") else ""))
        law = ["not fitted", "-", "-", "-"] if f["E"] is None else [
            f["E"], f["A"], f["alpha"], f"[{ci[0]:.4g}, {ci[1]:.4g}]" if ci else "-"]
        inside = str(pred.get("inside", "-")) if pred.get("interval_available", True) else "n/a"
        rows.append([f["group"] or y, *law, f["n_points"], held_out if pred else bt.get("skipped", "-"), inside])
    stdout_console.print(make_table(f"power law {y} = E + A·{x}^(−α)", ["domain", "E", "A", "alpha", "alpha CI",
                                    "points", "top rung held out: actual vs predicted [interval]", "inside"], rows))
    for f in fits:
        if f["E"] is None:
            print(f["not_identified"], file=sys.stderr)
        for flag in f.get("flags") or []:
            print(f"{f['group'] or y}: {flag}", file=sys.stderr)
        if (f.get("interval") or {}).get("available") is False:
            print(f"{f['group'] or y}: interval not available: {f['interval']['reason']}", file=sys.stderr)
    return 0


def _backtest(part: pd.DataFrame, x: str, y: str, args: argparse.Namespace, holdout_backtest,
              delta_kw: dict[str, Any]) -> dict[str, Any] | None:
    from fits.errors import FitBoundaryError, FitError, FitInputError

    if args.holdout_top == 0:
        return None
    try:
        return holdout_backtest(part, x, y, holdout_top=args.holdout_top, bootstrap=max(args.bootstrap, 200),
                                ci_level=args.ci_level, seed=args.seed, **delta_kw)
    except FitInputError as err:  # too few rungs to hold one out: say so instead of failing the fit
        return {"skipped": err.detail}
    except FitBoundaryError as err:  # the rungs below the top do not pin the law down on their own
        return {"skipped": "law below the top not identified", "reason": str(err)}
    except FitError as err:  # e.g. a bootstrap the rungs below the top cannot support
        return {"skipped": "backtest not possible", "reason": str(err)}


# ---------------------------------------------------------------- chinchilla

def run_chinchilla(args: argparse.Namespace) -> int:
    from fits.chinchilla import fit_chinchilla
    from fits.errors import FitError

    df, source = load_input(args)
    n, d, y = column_arg(args, "n", "params_active"), column_arg(args, "d", "tokens"), column_arg(args, "y", "bpb")
    if args.bootstrap < 0 or args.holdout_top < 0 or not 0 < args.ci_level < 1:
        raise LadderInputError("--bootstrap and --holdout-top must be ≥ 0 and --ci-level in (0, 1)", field="--bootstrap")
    if args.delta == "auto":
        raise LadderInputError("the Chinchilla fit takes a number for --delta ('auto' is for power laws)", field="--delta")
    kw = {"starts": args.starts, "n_starts": args.n_starts or None, **({} if args.delta is None else {"delta": args.delta})}
    if args.shared_exponent and (args.bootstrap or args.holdout_top):
        raise LadderInputError("--shared-exponent has no --bootstrap or --holdout-top yet", field="--shared-exponent")
    try:
        if args.shared_exponent:
            from fits.shared_exponent import fit_shared_exponent

            fit = fit_shared_exponent(df, n=n, d=d, y=y, n_starts=args.n_starts or 64,
                                      **({} if args.delta is None else {"delta": args.delta}))
        else:
            fit = fit_chinchilla(df, n=n, d=d, y=y, bootstrap=args.bootstrap, ci_level=args.ci_level, seed=args.seed,
                                 **kw)
    except FitError as err:
        raise input_error(err, source) from None
    out = fit.to_dict()
    payload = {**fit.params, **{k: v for k, v in out.items() if k not in ("params",)}, "source": source}
    if args.holdout_top:
        from fits.chinchilla_backtest import chinchilla_holdout

        try:
            payload["backtest"] = chinchilla_holdout(df, n, d, y, holdout_top=args.holdout_top,
                                                     bootstrap=max(args.bootstrap, 200), ci_level=args.ci_level,
                                                     seed=args.seed, **kw)
        except FitError as err:  # the law is fitted; only the backtest cannot run: say why
            payload["backtest"] = {"skipped": str(err)}
    finish(args, payload, source, df, {"chinchilla": fit.to_dict(include_draws=True)},
           {**fit.params, **out["compute_optimal"]})
    if args.json:
        print_json(payload)
        return 0
    rows = [[k, v, f"[{fit.ci[k][0]:.4g}, {fit.ci[k][1]:.4g}]" if k in fit.ci else "-"] for k, v in fit.params.items()]
    rows += [[f"compute-optimal {k}", v, "-"] for k, v in out["compute_optimal"].items()]
    stdout_console.print(make_table(f"{y} = E + A/{n}^α + B/{d}^β ({fit.n_points} points, objective "
                                    f"{fit.objective:.6g})", ["name", "value", "CI"], rows))
    bt = payload.get("backtest")
    if bt and "predictions" in bt:
        top = max(bt["predictions"], key=lambda p: (p["N"], p["D"]))
        stdout_console.print(f"held out the {bt['holdout_top']} largest {n}: {bt['share_inside']:.0%} of their runs inside "
                             f"the {bt['ci_level']:.0%} interval, max |error| {bt['max_abs_rel_error']:.2%}; largest run "
                             f"{top['actual']:.4g} vs {top['predicted']:.4g} [{top['lo']:.4g}, {top['hi']:.4g}]")
    elif bt:
        print(f"backtest skipped: {bt['skipped']}", file=sys.stderr)
    for flag in out.get("flags") or []:
        print(flag, file=sys.stderr)
    return 0


# ---------------------------------------------------------------- hyperparameters

def run_hparams(args: argparse.Namespace) -> int:
    from fits.errors import FitError
    from fits.hparam_laws import fit_hparam_laws

    df, source = load_input(args)
    try:
        fit = fit_hparam_laws(df, y=args.y, criterion=args.criterion)
    except FitError as err:
        raise input_error(err, source) from None
    payload = {**fit.to_dict(), "source": source}
    if args.plot:
        from fits.plots import plot_hparams

        payload["plot"] = [str(p) for p in plot_hparams(fit, args.plot)]
    finish(args, payload, source, df, {"hparams": fit.to_dict()},
           {"lr_wd_product": payload["lr_wd_product"], "log_lr": payload["log_lr"]})
    if args.json:
        print_json(payload)
        return 0
    rows = [[f"{s['params_active']:.3g}", s["tpp"], s["steps"], s["optimum"]["lr"],
             s["optimum"]["lr_wd"] / s["optimum"]["lr"], ", ".join(s["flags"]) or "ok"] for s in payload["slices"]]
    stdout_console.print(make_table("LR/WD optima per slice", ["params_active", "tpp", "steps", "LR*", "WD*", "flags"], rows))
    p, lr = payload["lr_wd_product"], payload["log_lr"]
    if payload["dropout"]:
        d = payload["dropout"]["params"]
        stdout_console.print(f"dropout* = {d['p_max']:.3g} / (1 + exp(-{d['k']:.3g}·(log N - {d['m']:.3g})))")
    if payload["selected"] is None:
        stdout_console.print("LR/WD were not swept: no LR*/WD* laws")
        return 0
    report = HparamLaws()  # the report's laws, written once (ladder/plan/recipe.py)
    stdout_console.print(f"LR*·WD* = {p['coef']:.4g} · steps^{p['steps_exponent']:.3f}   (report: {report.lr_wd_text()})")
    tpp_term = f" + {lr['log_tpp']:.3f}·log TPP" if lr["log_tpp"] is not None else " (TPP constant: no TPP term)"
    stdout_console.print(f"log LR* = {lr['intercept']:.3f}{tpp_term} + {lr['log_steps']:.3f}·log steps   "
                         f"(report: {report.log_lr_text()})")
    if payload["selected"]["log_lr"].get("exactly_determined"):
        stdout_console.print(f"[yellow]exactly determined from {payload['selected']['log_lr']['n']} slice optima: "
                             "no intervals; add slices for uncertainty[/yellow]")
    stdout_console.print(f"selected by {args.criterion.upper()}: LR*·WD* ~ {payload['selected']['lr_wd_product']['terms']}, "
                         f"log LR* ~ {payload['selected']['log_lr']['terms']}")
    return 0
