"""The laws file: what `ladder fit power-law|hparams|arms|efficiency --save` writes and `ladder extrapolate --laws`
and `ladder fit iso-bpb --laws` read ({"power_law": {domain: fit}, "hparams": {...}, "arms": {...}}, any
of them, or a bare `fit hparams` or `fit arms` JSON). `fit chinchilla --save` writes {"chinchilla": L(N, D)},
which neither reads: such a file is refused saying so. "arms" is one `ladder fit arms` result (or `ladder
fit efficiency`'s EG_FLOPs in the same form, one domain named after its metric):
{"baseline": NAME, "ci_level", "arms": {arm: {domain: {"rungs": [...], "trend": {...},
"train_flops_range": [lo, hi]}}}}, the trend with its intercept, slope, dof and covariance
(`fits.eg_scaling`). Every way a file can be wrong is refused here, naming the file and the part."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ladder.errors import LadderInputError

# The x every power law read here must have: the card (`ladder extrapolate`) and `ladder fit iso-bpb`
# evaluate laws at training FLOPs, so a law of tokens or parameters would give a number of the wrong unit.
COMPUTE_COLUMN = "train_flops"


def load_laws(paths: list[str]) -> dict[str, Any]:
    """Merge laws files: {"power_law": {domain: fit}, "hparams": {...}, "arms": {baseline: result}} (or a bare
    `fit hparams` or `fit arms` JSON). Arms measured against the same baseline in several files are merged,
    a later file's arm replacing an earlier one's."""
    from fits.errors import FitInputError
    from fits.power_law import power_law_from_dict

    laws: dict[str, Any] = {"power_law": {}, "hparams": None, "arms": {}, "files": list(paths)}
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
        if {"baseline", "arms", "ci_level"} <= set(data):  # a bare `ladder fit arms --json`
            data = {"arms": data}
        chinchilla = "chinchilla" in data or str(data.get("law", "")).startswith("chinchilla")
        if chinchilla and not {"power_law", "hparams", "arms"} & set(data):
            raise LadderInputError("an L(N, D) law from `ladder fit chinchilla`: `ladder extrapolate --laws` and "
                                   "`ladder fit iso-bpb --laws` do not read Chinchilla laws; they read compute laws "
                                   "(`ladder fit power-law --save`), LR/WD laws (`fit hparams --save`) and data arms "
                                   "(`fit arms|efficiency --save`)", where=path, field="chinchilla")
        if not {"power_law", "hparams", "arms"} & set(data):
            raise LadderInputError("no laws found: expected 'power_law', 'hparams' and/or 'arms' keys (the files "
                                   "`ladder fit power-law|hparams|arms|efficiency --save` write)", where=path)
        power_laws = data.get("power_law") or {}
        if not isinstance(power_laws, dict):
            raise LadderInputError(f"expected an object of domain → fit, got {type(power_laws).__name__}",
                                   where=path, field="power_law")
        for domain, fit in power_laws.items():
            if not isinstance(fit, dict):
                raise LadderInputError(f"expected a fit object, got {type(fit).__name__}", where=path,
                                       field=f"power_law.{domain}")
            x = (fit.get("options") or {}).get("x", COMPUTE_COLUMN)
            if x != COMPUTE_COLUMN:
                raise LadderInputError(f"fitted against {x!r}, but the card and iso-bpb evaluate a law at training "
                                       f"FLOPs: refit with `--x {COMPUTE_COLUMN}` (a column of training FLOPs under "
                                       f"another name: rename it {COMPUTE_COLUMN})", where=path,
                                       field=f"power_law.{domain}")
            try:
                laws["power_law"][domain] = _probed(power_law_from_dict(fit))
            except FitInputError as err:
                raise LadderInputError(err.detail, where=path, field=f"power_law.{domain}") from None
            except (KeyError, TypeError, ValueError, IndexError, AttributeError, ArithmeticError) as err:
                # a field of the wrong type or shape inside the fit (x_range, interval, prediction)
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
        if data.get("arms") is not None:
            section = _check_arms(data["arms"], path)
            merged = laws["arms"].setdefault(section["baseline"], {**section, "arms": {}, "files": []})
            merged["arms"].update(section["arms"])
            merged["files"].append(path)
    return laws


# The compute a law is probed at (the report's full scale is ~2.6e25 FLOPs): every part a card reads is read.
PROBE_FLOPS = 1e20


def _probed(law):
    """The law, once everything a card reads of it has been read at a nominal compute, and its parts found
    to agree: the value, the interval and the "E = 0" label come from three fields (`params`, `prediction`,
    `floor_at_zero`), and a file edited by hand can make them disagree (a BPB outside its own interval)."""
    from fits.errors import FitInputError
    from fits.extrapolate import bpb_from_law

    card = bpb_from_law(law, PROBE_FLOPS)
    if law.extra.get("floor_at_zero") and law.params["E"] != 0:
        raise FitInputError(f"says floor_at_zero but E = {law.params['E']:g}: the file was edited; refit and save it")
    model = law.prediction_model
    if model is not None:
        from_model = float(model.interval([PROBE_FLOPS])["predicted"][0])
        if abs(from_model - card["value"]) > 1e-6 * abs(card["value"]):
            raise FitInputError(f"its params (BPB {card['value']:.6g} at {PROBE_FLOPS:.0e} FLOPs) and its prediction "
                                f"model ({from_model:.6g}) disagree: the file was edited; refit and save it")
    return law


def _check_arms(section: Any, path: str) -> dict[str, Any]:
    """A `ladder fit arms` result, each arm's trend evaluated once at a nominal compute so a file with
    the keys but not the shapes the fit writes is refused here, naming the arm and domain."""
    from fits.eg_extrapolate import eg_at

    if not isinstance(section, dict):
        raise LadderInputError(f"expected an object, got {type(section).__name__}", where=path, field="arms")
    if not isinstance(section.get("baseline"), str) or not isinstance(section.get("arms"), dict):
        raise LadderInputError("expected 'baseline' (the baseline arm's name) and 'arms' (arm → domain → EG per rung "
                               "and trend), as `ladder fit arms --save` writes", where=path, field="arms")
    for arm, per_domain in section["arms"].items():
        if not isinstance(per_domain, dict):
            raise LadderInputError(f"expected an object of domain → EG, got {type(per_domain).__name__}", where=path,
                                   field=f"arms.{arm}")
        for domain, cell in per_domain.items():
            try:
                if not isinstance(cell, dict):
                    raise TypeError(f"expected an object, got {type(cell).__name__}")
                eg_at(cell, 1e20)
            except (KeyError, TypeError, ValueError, IndexError) as err:
                raise LadderInputError(f"not the EG result `ladder fit arms --save` writes ({type(err).__name__}: "
                                       f"{err})", where=path, field=f"arms.{arm}.{domain}") from None
    return section


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
        except (KeyError, TypeError, ValueError, IndexError, AttributeError, ArithmeticError) as err:
            raise LadderInputError(f"not the laws `ladder fit hparams --save` writes ({type(err).__name__}: {err})",
                                   where=path, field=f"hparams.{part}") from None
