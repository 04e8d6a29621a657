"""`ladder extrapolate RECIPE --rung L`: the full-scale recipe card.

Architecture, tokens, steps, batch and compute come from the plan (`ladder.plan.plan_rung`,
`ladder.plan.compute.plan_compute` on the recipe's GPU pool). LR*, WD*, dropout* and the predicted
BPB per domain come from fitted laws: a laws file (`ladder fit ... --save`, `--laws`, repeatable)
and/or fits made here from an MLflow experiment (`--experiment`). With no fitted hyperparameter
laws, the card falls back to the recipe's `hparam_laws` (the report's published laws) and says
so on the card.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from fits.compute_laws import DEFAULT_SELECT, SELECT_RULES
from ladder.errors import LadderInputError
from ladder.run.mlflow_runs import DEFAULT_TRACKING_URI, domains_of, fit_table, long_by_domain, read_runs
from ladder.cli.output import make_table, print_json, stdout_console
from ladder.analysis.recipe_card import build_card, card_rows

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("extrapolate", help="the full-scale recipe card from the fitted laws")
    p.add_argument("recipe", help="recipe name (mai-base-2, cpu-demo) or path to a YAML recipe")
    p.add_argument("--rung", type=int, required=True, help="L of the target model (e.g. 102)")
    p.add_argument("--tpp", type=float, help="tokens per active parameter (default: the recipe's)")
    p.add_argument("--experiment", help="fit the laws from this MLflow experiment's runs")
    p.add_argument("--tracking-uri", default=DEFAULT_TRACKING_URI)
    p.add_argument("--laws", action="append", default=[], help="laws JSON from `ladder fit ... --save` (repeatable)")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for fits made here")
    p.add_argument("--select", choices=sorted(SELECT_RULES), default=DEFAULT_SELECT,
                   help="with --experiment, the runs the BPB laws are fitted on (as `ladder fit power-law --select`)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def load_laws(paths: list[str]) -> dict[str, Any]:
    """Merge laws files: {"power_law": {domain: fit}, "hparams": {...}} (or a bare `fit hparams` JSON)."""
    from fits.errors import FitInputError
    from fits.power_law import power_law_from_dict

    laws: dict[str, Any] = {"power_law": {}, "hparams": None, "files": list(paths)}
    for path in paths:
        try:
            data = json.loads(Path(path).read_bytes().decode("utf-8"))
        except FileNotFoundError:
            raise LadderInputError("laws file not found; write one with `ladder fit ... --save FILE.json`", where=path) from None
        except IsADirectoryError:
            raise LadderInputError("is a directory, not a laws JSON file", where=path) from None
        except UnicodeDecodeError as err:
            raise LadderInputError(f"not UTF-8 text (byte {err.start}); a laws file is the JSON "
                                   f"`ladder fit ... --save` writes", where=path) from None
        except json.JSONDecodeError as err:
            raise LadderInputError(f"not valid JSON: {err}", where=path) from None
        if not isinstance(data, dict):
            raise LadderInputError("expected a JSON object", where=path)
        if "lr_wd_product" in data and "selected" in data:
            data = {"hparams": data}
        if not {"power_law", "hparams"} & set(data):
            raise LadderInputError("no laws found: expected 'power_law' and/or 'hparams' keys (the files "
                                   "`ladder fit power-law|hparams --save` write)", where=path)
        power_laws = data.get("power_law") or {}
        if not isinstance(power_laws, dict):
            raise LadderInputError(f"expected an object of domain → fit, got {type(power_laws).__name__}",
                                   where=path, field="power_law")
        for domain, fit in power_laws.items():
            if not isinstance(fit, dict):
                raise LadderInputError(f"expected a fit object, got {type(fit).__name__}", where=path,
                                       field=f"power_law.{domain}")
            try:
                laws["power_law"][domain] = power_law_from_dict(fit)
            except FitInputError as err:
                raise LadderInputError(err.detail, where=path, field=f"power_law.{domain}") from None
            except (KeyError, TypeError, ValueError) as err:  # a field of the wrong type inside the fit
                raise LadderInputError(f"not a power-law result the fits wrote ({type(err).__name__}: {err})",
                                       where=path, field=f"power_law.{domain}") from None
        if data.get("hparams") is not None and not isinstance(data["hparams"], dict):
            raise LadderInputError(f"expected an object, got {type(data['hparams']).__name__}", where=path,
                                   field="hparams")
        if data.get("hparams"):
            if "selected" not in data["hparams"] and "dropout" not in data["hparams"]:
                raise LadderInputError("hparams laws lack 'selected' (re-fit with `ladder fit hparams --save`)",
                                       where=path, field="hparams")
            _check_hparams(data["hparams"], path)
            laws["hparams"] = data["hparams"]
    return laws


def _check_hparams(hparams: dict[str, Any], path: str) -> None:
    """Evaluate the laws once at a nominal point, so a file that has the keys but not the shapes the
    fits write is refused here, naming the part, instead of failing deep inside the card."""
    from fits.extrapolate import dropout_from_law, hparams_from_laws

    for part, probe in (("selected", lambda h: hparams_from_laws(h, steps=1000.0, tpp=20.0, params_active=1e6)),
                        ("dropout", lambda h: dropout_from_law(h["dropout"], 1e6))):
        if not hparams.get(part):
            continue
        try:
            probe(hparams)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as err:
            raise LadderInputError(f"not the laws `ladder fit hparams --save` writes ({type(err).__name__}: {err})",
                                   where=path, field=f"hparams.{part}") from None


def laws_from_experiment(args: argparse.Namespace, laws: dict[str, Any]) -> dict[str, Any]:
    """Fit every domain's compute law on the runs the one rule selects (`fits.compute_laws`: by
    default the ladder block), and the hyperparameter laws when the runs sweep LR/WD."""
    from fits.compute_laws import fit_power_laws
    from fits.errors import FitError
    from fits.hparam_laws import fit_hparam_laws

    runs = fit_table(read_runs(args.experiment, args.tracking_uri))
    info = {"experiment": args.experiment, "tracking_uri": args.tracking_uri, "n_runs": len(runs),
            "run_ids": runs["run_id"].tolist(), "domains": domains_of(runs)}
    try:
        power_laws = fit_power_laws(long_by_domain(runs), "train_flops", "bpb", group="domain", select=args.select,
                                    bootstrap=args.bootstrap)
    except FitError as err:  # the table as a whole (e.g. no ladder block): bad input for every domain
        raise LadderInputError(str(err), where=f"experiment {args.experiment}", field="--select") from None
    laws["power_law"].update(power_laws.laws)
    info["power_law_selection"] = power_laws.selection
    if power_laws.errors:
        info["power_law_errors"] = power_laws.reasons
    if laws["hparams"] is None and {"lr", "wd"} <= set(runs.columns) and runs["lr"].nunique() > 2:
        try:
            laws["hparams"] = fit_hparam_laws(runs).to_dict()
        except FitError as err:
            info["hparams_error"] = str(err)
    laws["experiment"] = info
    return laws


def run(args: argparse.Namespace) -> int:
    laws = load_laws(args.laws)
    if args.experiment:
        laws = laws_from_experiment(args, laws)
    card = build_card(args.recipe, args.rung, laws, args.tpp)
    if args.json:
        print_json(card)
        return 0
    render(card)
    return 0


def render(card: dict[str, Any]) -> None:
    t, hp = card["target"], card["hyperparameters"]
    stdout_console.print(make_table(f"recipe card: {t['recipe']} L{t['L']}", ["name", "value", "interval"],
                                    card_rows(card)))
    stdout_console.print(f"hyperparameters from: {hp['source']}")
    if not card["predicted_bpb"]:
        stdout_console.print("no BPB laws given: pass --laws FILE.json (from `ladder fit power-law --save`) or --experiment")
