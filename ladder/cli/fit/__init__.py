"""`ladder fit power-law|chinchilla|hparams|efficiency|iso-bpb|arms|heldout`: fit laws to a CSV or straight to an MLflow
experiment.

JSON contracts (docs/architecture.md): power-law → `ladder/cli/fit/power_law.py`; chinchilla → E, A, B, alpha,
beta; hparams → {"lr_wd_product": {coef, steps_exponent}, "log_lr": {intercept, log_tpp, log_steps},
"slices": [...]}. Fits read from MLflow are logged back as an MLflow run of their own. `--save
FILE.json` writes the laws (with bootstrap draws): power-law, hparams, arms and efficiency in the form
`ladder extrapolate --laws` reads (`ladder/cli/fit/laws_file.py`; iso-bpb reads the power laws);
chinchilla writes {"chinchilla": L(N, D) with its draws}, which no command reads back.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys

from ladder.cli.fit import arms, efficiency, heldout, power_law
from ladder.cli.fit.inputs import (add_ci_level_and_seed, check_counts_and_level, delta_arg, column_arg, finish, input_error, load_input)
from ladder.errors import LadderInputError
from ladder.plan.recipe import HparamLaws
from ladder.cli.output import make_table, output_file, print_json, stdout_console
from rungs.tracking_uri import DEFAULT_STORE_HELP

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fit", help="fit scaling and hyperparameter laws to a CSV or an MLflow experiment")
    fit_sub = p.add_subparsers(dest="fit_command", required=True, parser_class=type(p))

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--csv", help="input table (one row per run)")
        q.add_argument("--experiment", help="read the runs of this MLflow experiment instead of a CSV")
        q.add_argument("--tracking-uri", help=f"MLflow store ({DEFAULT_STORE_HELP})")
        q.add_argument("--no-log", action="store_true", help="do not log the fit back to MLflow (with --experiment)")
        q.add_argument("--save", type=output_file((".json",)),
                       help="write the fitted laws (with bootstrap draws) to this JSON file")
        q.add_argument("--plot", type=output_file((".png",)), help="write a PNG figure of the fit to this path")
        q.add_argument("--json", action="store_true", help="print one JSON object")

    power_law.register(fit_sub, common)

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
    q.add_argument("--starts", choices=["hoffmann", "varpro"], default="hoffmann",
                   help="where the optimiser starts: 'hoffmann' (default) Hoffmann et al.'s 4,500-point grid over "
                        "(E, A, B, α, β), the best --n-starts refined; 'varpro' a grid over (α, β) with E, A, B "
                        "solved by least squares at each point")
    q.add_argument("--n-starts", type=int, default=64, help="grid starts refined by L-BFGS-B (0: all 4,500)")
    add_ci_level_and_seed(q)
    q.set_defaults(handler=run_chinchilla)

    q = fit_sub.add_parser("hparams", help="LR/WD surfaces per slice → LR*·WD* and LR* laws (+ dropout law); "
                                          "columns: lr, wd, steps, tpp, params_active, the metric (--y), and "
                                          "dropout for the dropout law")
    common(q)
    q.add_argument("--y", default="bpb", help="metric column (default bpb); the table also needs lr, wd, steps, tpp "
                                              "and params_active (and dropout for the dropout law), one row per run")
    q.add_argument("--criterion", choices=["aic", "bic"], default="aic",
                   help="how the terms of the LR*·WD* and LR* laws are chosen among log steps, log TPP and log size: "
                        "the lowest 'aic' (default) or 'bic' (penalises terms more on many slices)")
    q.set_defaults(handler=run_hparams)

    efficiency.register(fit_sub, common)
    arms.register(fit_sub, common)
    heldout.register(fit_sub)


# ---------------------------------------------------------------- chinchilla

def run_chinchilla(args: argparse.Namespace) -> int:
    from fits.chinchilla import fit_chinchilla
    from fits.errors import FitError

    df, source = load_input(args)
    n, d, y = column_arg(args, "n", "params_active"), column_arg(args, "d", "tokens"), column_arg(args, "y", "bpb")
    check_counts_and_level(args)
    if args.n_starts < 0:
        raise LadderInputError(f"must be 0 (all 4,500 starts) or more, got {args.n_starts}", field="--n-starts")
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
    if args.plot:
        plot_chinchilla(fit, df, n=n, d=d, y=y, path=args.plot, backtest=payload.get("backtest"))
        payload["plot"] = args.plot
    finish(args, payload, source, df, {"chinchilla": fit.to_dict(include_draws=True)},
           {**fit.params, **out["compute_optimal"]})
    if args.json:
        print_json(payload)
        return 0
    rows = [[k, v, f"[{fit.ci[k][0]:.4g}, {fit.ci[k][1]:.4g}]" if k in fit.ci else "-"] for k, v in fit.params.items()]
    rows += [[f"compute-optimal {k}", v, "-"] for k, v in out["compute_optimal"].items()]
    form = f"E + A/{n}^η + B/{d}^η (shared η)" if args.shared_exponent else f"E + A/{n}^α + B/{d}^β"
    stdout_console.print(make_table(f"{y} = {form} ({fit.n_points} points, objective {fit.objective:.6g})",
                                    ["name", "value", "CI"], rows))
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


def plot_chinchilla(fit, df, *, n: str, d: str, y: str, path: str, backtest: dict | None = None) -> None:
    """The fitted L(N, D) against the runs, as a PNG at `path`: left, the loss against tokens, one colour
    and one law curve per model size (the held-out sizes' predictions, where a backtest ran, with their
    intervals); right, the loss against compute 6·N·D with the law's compute-optimal frontier."""
    import numpy as np
    from matplotlib import colormaps

    from fits.plots import log_axes, new_figure, save_figure

    N, D, L = (df[c].to_numpy(float) for c in (n, d, y))
    sizes = np.unique(N)
    colours = colormaps["viridis"](np.linspace(0.0, 0.9, len(sizes)))
    fig, (ax_d, ax_c) = new_figure(ncols=2)
    p = fit.params
    for size, colour in zip(sizes, colours):
        at = N == size
        grid = np.geomspace(D[at].min() / 2, D[at].max() * 2, 100)
        ax_d.plot(grid, fit.predict(size, grid), color=colour, lw=1)
        labelled = len(sizes) <= 10 or size in (sizes[0], sizes[-1])  # a legend of a few sizes, not fifty
        ax_d.scatter(D[at], L[at], color=colour, s=14, zorder=3, label=f"{n} {size:.3g}" if labelled else None)
        ax_c.scatter(6 * size * D[at], L[at], color=colour, s=14, zorder=3)
    for row in (backtest or {}).get("predictions", []):
        ax_d.errorbar(row["D"], row["predicted"], yerr=[[row["predicted"] - row["lo"]], [row["hi"] - row["predicted"]]],
                      fmt="_", color="C3", capsize=3, ms=10, zorder=5)
    if (backtest or {}).get("predictions"):
        ax_d.plot([], [], "_", color="C3", label=f"predicted without the {backtest['holdout_top']} largest")
    opt = fit.extra["compute_optimal"]
    C = np.geomspace((6 * N * D).min() / 2, (6 * N * D).max() * 10, 200)
    n_opt, d_opt = opt["G"] * (C / 6) ** opt["a"], (C / 6) ** opt["b"] / opt["G"]
    ax_c.plot(C, fit.predict(n_opt, d_opt), color="C3",
              label=f"compute-optimal (a = {opt['a']:.3g}, b = {opt['b']:.3g})")
    for ax, xlabel in ((ax_d, d), (ax_c, f"compute 6·{n}·{d}")):
        ax.axhline(p["E"], color="grey", lw=0.8, ls=":", label=f"E = {p['E']:.4g}")
        log_axes(ax)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(y)
        ax.legend(fontsize=7)
    ax_d.set_title(f"{fit.formula}: alpha {p['alpha']:.3g}, beta {p['beta']:.3g}", fontsize=9)
    ax_c.set_title("the runs against compute, and the law's frontier", fontsize=9)
    save_figure(fig, path)


# ---------------------------------------------------------------- hyperparameters

def _lr_wd_cells(optimum: dict[str, float | None]) -> list[object]:
    """A slice's LR* and WD* for the table; "-" for an optimum too far out to be a number (a loss flat
    along LR·WD puts it thousands of log units away: the slice is flagged and left out of the laws)."""
    lr, lr_wd = optimum.get("lr"), optimum.get("lr_wd")
    ok = [v is not None and math.isfinite(v) and v > 0 for v in (lr, lr_wd)]
    return [lr if ok[0] else "-", lr_wd / lr if all(ok) else "-"]


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
    rows = [[f"{s['params_active']:.3g}", s["tpp"], s["steps"], *_lr_wd_cells(s["optimum"]),
             ", ".join(s["flags"]) or "ok"] for s in payload["slices"]]
    stdout_console.print(make_table("LR/WD optima per slice", ["params_active", "tpp", "steps", "LR*", "WD*", "flags"], rows))
    p, lr = payload["lr_wd_product"], payload["log_lr"]
    if payload["dropout"]:
        d = payload["dropout"]["params"]
        stdout_console.print(f"dropout* = {d['p_max']:.3g} / (1 + exp(-{d['k']:.3g}·(log N - {d['m']:.3g})))")
        for left_out in payload["dropout"]["excluded"]:  # no usable dropout optimum: not in the sigmoid
            where = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                              for k, v in left_out.items() if k != "reason")
            print(f"dropout law: slice {where} left out ({left_out['reason']})", file=sys.stderr)
    if payload["options"]["diverged_rows_dropped"]:
        print(f"{payload['options']['diverged_rows_dropped']} run(s) without a finite {args.y} (diverged) left out",
              file=sys.stderr)
    if "dropout_error" in payload["options"]:
        print(f"dropout law not fitted: {payload['options']['dropout_error']}", file=sys.stderr)
    if payload["selected"] is None:
        stdout_console.print("LR/WD were not swept: no LR*/WD* laws")
        return 0
    report = HparamLaws()  # the report's laws, written once (ladder/plan/recipe.py)
    if p["coef"] is not None:
        stdout_console.print(f"LR*·WD* = {p['coef']:.4g} · steps^{p['steps_exponent']:.3f}   "
                             f"(report: {report.lr_wd_text()})")
    if lr["intercept"] is not None:
        tpp_term = f" + {lr['log_tpp']:.3f}·log TPP" if lr["log_tpp"] is not None else " (TPP constant: no TPP term)"
        stdout_console.print(f"log LR* = {lr['intercept']:.3f}{tpp_term} + {lr['log_steps']:.3f}·log steps   "
                             f"(report: {report.log_lr_text()})")
    if p["coef"] is None or lr["intercept"] is None:
        stdout_console.print("[yellow]steps do not vary across the slices, so the report's form (a law in steps) is "
                             "not identifiable; the selected laws:[/yellow]")
        for name in ("lr_wd_product", "log_lr"):
            law = payload["selected"][name]
            terms = f"{law['params']['const']:.4g}" + "".join(
                f" {'-' if law['params'][t] < 0 else '+'} {abs(law['params'][t]):.4g}·{t}" for t in law["terms"])
            stdout_console.print(f"  {law['target']} = {terms}")
    if payload["selected"]["log_lr"].get("exactly_determined"):
        stdout_console.print(f"[yellow]exactly determined from {payload['selected']['log_lr']['n']} slice optima: "
                             "no intervals; add slices for uncertainty[/yellow]")
    stdout_console.print(f"selected by {args.criterion.upper()}: LR*·WD* ~ {payload['selected']['lr_wd_product']['terms']}, "
                         f"log LR* ~ {payload['selected']['log_lr']['terms']}")
    return 0
