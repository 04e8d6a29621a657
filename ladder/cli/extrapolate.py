"""`ladder extrapolate RECIPE --rung L`: the full-scale recipe card.

Architecture, tokens, steps, batch and compute come from the plan (`ladder.plan.plan_rung`,
`ladder.plan.compute.plan_compute` on the recipe's GPU pool). LR*, WD*, dropout* and the predicted
BPB per domain come from fitted laws: a laws file (`ladder fit ... --save`, `--laws`, repeatable)
and/or fits made here from an MLflow experiment (`--experiment`) or a runs CSV (`--csv`), through the
one step `ladder fit power-law` takes (`fits.compute_laws.fit_power_laws`: `--select`, `--floor`), so
the same runs give the same laws. With no fitted hyperparameter laws, the card falls back to the
recipe's `hparam_laws` (the report's published laws) and says so on the card.

A prediction beyond ~100× the largest fitted compute is flagged on the card and on stderr
(`fits.extrapolate.FAR_EXTRAPOLATION`); `--plot` draws each law and its band out to the target.

A laws file from `ladder fit arms --save` adds the card's "data arms": each arm's EG_FLOPs against its
baseline per domain, carried along its trend (log EG linear in log compute) to the target's compute with
the interval of the trend there (`fits.eg_extrapolate`), flagged in the same way past 100× the compute
the arms were measured at. `--arms-baseline NAME` requires them, and shows only the arms against NAME.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from fits.compute_laws import DEFAULT_SELECT, SELECT_RULES
from ladder.errors import LadderInputError
from ladder.run.mlflow_runs import domains_of
from ladder.cli.fit.inputs import NO_FLOOR_HINT, add_floor_arg, is_no_floor, load_input, per_domain_rows
from ladder.cli.fit.laws_file import load_laws
from ladder.cli.output import make_table, output_file, print_json, stdout_console
from ladder.analysis.recipe_card import arms_rows, build_card, card_rows
from rungs.tracking_uri import DEFAULT_STORE_HELP

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("extrapolate", help="the full-scale recipe card from the fitted laws")
    p.add_argument("recipe", help="recipe name (mai-base-2, cpu-demo) or path to a YAML recipe")
    p.add_argument("--rung", type=int, required=True, help="L of the target model (e.g. 102)")
    p.add_argument("--tpp", type=float, help="tokens per active parameter (default: the recipe's)")
    p.add_argument("--experiment", help="fit the laws from this MLflow experiment's runs")
    p.add_argument("--csv", help="fit the laws from this runs table instead (bpb_<domain> columns, one row per run, "
                                 "as `ladder fit power-law --group domain` reads it)")
    p.add_argument("--tracking-uri", help=f"MLflow store ({DEFAULT_STORE_HELP})")
    p.add_argument("--laws", action="append", default=[], help="laws JSON from `ladder fit ... --save` (repeatable)")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for fits made here")
    p.add_argument("--select", choices=sorted(SELECT_RULES), default=DEFAULT_SELECT,
                   help="with --experiment or --csv, the runs the BPB laws are fitted on (as `ladder fit power-law "
                        "--select`)")
    add_floor_arg(p)
    p.add_argument("--arms-baseline", metavar="NAME",
                   help="show on the card only the data arms measured against this baseline arm (from a laws file "
                        "`ladder fit arms --save` wrote), and refuse laws files without them")
    p.add_argument("--plot", type=output_file((".png",)), help="write a PNG figure of each domain's law and its band out to the target")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def laws_from_runs(args: argparse.Namespace, laws: dict[str, Any]) -> dict[str, Any]:
    """Fit every domain's compute law from an experiment's or a CSV's runs, through the one step
    (`fits.compute_laws.fit_power_laws`, with `--select` and `--floor`), and the hyperparameter laws
    when the runs sweep LR/WD. `laws["rows"]` keeps the rows each law was fitted on (for `--plot`)."""
    from fits.compute_laws import fit_power_laws
    from fits.errors import FitError
    from fits.hparam_laws import fit_hparam_laws

    runs, source = load_input(args)
    where = source.get("csv") or f"experiment {args.experiment}"
    info = {**source, "run_ids": runs["run_id"].tolist() if "run_id" in runs else [], "domains": domains_of(runs)}
    long = per_domain_rows(runs, "domain", "bpb", where=where, x="train_flops")
    try:
        power_laws = fit_power_laws(long, "train_flops", "bpb", group="domain", select=args.select, floor=args.floor,
                                    bootstrap=args.bootstrap)
    except FitError as err:  # the table as a whole (e.g. no ladder block): bad input for every domain
        raise LadderInputError(getattr(err, "detail", str(err)), where=where,
                               field=getattr(err, "column", None) or "--select") from None
    laws["power_law"].update(power_laws.laws)
    laws["rows"] = power_laws.rows
    info["power_law_selection"] = power_laws.selection
    if power_laws.errors:
        info["power_law_errors"] = power_laws.reasons
        if any(is_no_floor(err) for err in power_laws.errors.values()):
            info["hint"] = NO_FLOOR_HINT
    wide = domains_of(runs)  # one row per run: the table the hyperparameter laws read
    if wide and laws["hparams"] is None and {"lr", "wd"} <= set(runs.columns) and runs["lr"].nunique() > 2:
        try:
            laws["hparams"] = fit_hparam_laws(runs).to_dict()
        except FitError as err:
            info["hparams_error"] = str(err)
    laws["experiment" if args.experiment else "runs"] = info
    return laws


def select_arms(laws: dict[str, Any], baseline: str) -> dict[str, Any]:
    """The arms measured against `baseline`, refused when the laws files hold none or none against it."""
    where = ", ".join(laws["files"]) or None
    if not laws["arms"]:
        raise LadderInputError("no data arms in the laws files; write them with `ladder fit arms --baseline NAME "
                               "--save FILE.json` and pass --laws FILE.json", where=where, field="--arms-baseline")
    if baseline not in laws["arms"]:
        raise LadderInputError(f"no arms measured against {baseline!r}; the laws files have arms against "
                               f"{sorted(laws['arms'])}", where=where, field="--arms-baseline")
    return {baseline: laws["arms"][baseline]}


def check_flags(args: argparse.Namespace) -> None:
    """The flags' own values, before any file is read: one line naming the flag."""
    if args.rung < 1:
        raise LadderInputError(f"a rung is a positive scale parameter L (the target model's, e.g. 102), got "
                               f"{args.rung}", field="--rung")
    if args.bootstrap < 0:
        raise LadderInputError(f"must be ≥ 0 (0: the laws fitted here without intervals), got {args.bootstrap}",
                               field="--bootstrap")


def run(args: argparse.Namespace) -> int:
    check_flags(args)
    laws = load_laws(args.laws)
    if args.arms_baseline is not None:
        laws["arms"] = select_arms(laws, args.arms_baseline)
    if args.experiment or args.csv:
        laws = laws_from_runs(args, laws)
    card = build_card(args.recipe, args.rung, laws, args.tpp)
    fitted_here = laws.get("runs") or laws.get("experiment") or {}
    for domain, reason in fitted_here.get("power_law_errors", {}).items():
        print(f"BPB {domain} not predicted: {reason}", file=sys.stderr)
    if fitted_here.get("hint"):
        print(fitted_here["hint"], file=sys.stderr)
    if fitted_here.get("hparams_error"):
        print(f"LR/WD laws not fitted from these runs (the recipe's laws are used): {fitted_here['hparams_error']}",
              file=sys.stderr)
    if args.plot and not laws["power_law"]:
        print(f"no BPB laws to plot: {args.plot} not written", file=sys.stderr)
    elif args.plot:
        from fits.plots import plot_extrapolation

        plot_extrapolation(laws["power_law"], card["target"]["train_flops"], laws.get("rows"), path=args.plot,
                           target_label=f"{card['target']['recipe']} L{card['target']['L']}")
        card["plot"] = args.plot
    for warning in card["warnings"]:
        print(f"warning: {warning}", file=sys.stderr)
    if args.json:
        print_json(card)
        return 0
    render(card)
    return 0


NO_LAWS = ("no BPB laws given: pass --laws FILE.json (from `ladder fit power-law --save`), --experiment or "
           "--csv")


def render(card: dict[str, Any], *, no_laws: str = NO_LAWS) -> None:
    """The card as tables; `no_laws`: what to say where it predicts no BPB (the flags that would give it laws)."""
    t, hp = card["target"], card["hyperparameters"]
    stdout_console.print(make_table(f"recipe card: {t['recipe']} L{t['L']}", ["name", "value", "interval"],
                                    card_rows(card)))
    stdout_console.print(f"hyperparameters from: {hp['source']}")
    if not card["predicted_bpb"]:
        stdout_console.print(no_laws)
    arms = card.get("data_arms")
    if arms:
        stdout_console.print(make_table(f"data arms: EG_FLOPs − 1 at L{t['L']} from each arm's trend "
                                        f"({arms['ci_level']:.0%} intervals)",
                                        ["baseline", "arm", "domain", "EG − 1", "interval", "reading", "trend slope"],
                                        arms_rows(card)))
        for baseline, per_arm in arms["baselines"].items():
            for arm, per_domain in per_arm.items():
                for domain, cell in per_domain.items():
                    if cell.get("interval_note"):
                        stdout_console.print(f"{arm} {domain}: {cell['interval_note']}")
