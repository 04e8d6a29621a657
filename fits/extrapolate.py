"""The numbers of the full-scale recipe card, from fitted laws (or the report's, as a fallback).

Everything here works on the JSON forms of the laws (`to_dict()`), so a card can be made from
laws fitted in this process or loaded from a saved laws file. The caller (the `ladder extrapolate`
command) supplies the target run: steps, TPP, active parameters, training FLOPs, from the plan.

- LR*, WD*: the selected hyperparameter laws, with 95% observation intervals (t-based, from the
  OLS coefficient covariance plus the residual variance);
- dropout*: the sigmoid law with its interval;
- BPB per domain: each domain's compute law at the target's FLOPs, with the prediction interval of
  one run there (the law's parameter uncertainty, seed noise, Student-t: `fits.prediction`, with each
  source's share) where the one interval rule allows one (`FitResult.interval_note`; otherwise `interval` is null and
  `interval_note` says why), and how far it extrapolates (target FLOPs over the largest fitted
  FLOPs). Beyond `FAR_EXTRAPOLATION` times the data's compute the card carries a warning: a law fitted
  over two decades says little about six more, whatever its band.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats

from fits.dropout import sigmoid_interval
from fits.power_law import PowerLawResult
from fits.report_laws import hparams_from_report, usable_lr_wd
from fits.results import jsonable
from provenance import code_version


def predict_regression(law: dict[str, Any], values: dict[str, float], level: float = 0.95) -> tuple[float, float, float]:
    """Mean and observation interval of an OLS law from its dict form (params, cov, scale, df_resid)."""
    names = list(law["params"])
    x = np.array([1.0 if n == "const" else values[n] for n in names])
    beta = np.array([law["params"][n] for n in names])
    mean = float(x @ beta)
    if law.get("exactly_determined") or law.get("cov") is None:
        return mean, float("nan"), float("nan")
    var = float(x @ np.asarray(law["cov"]) @ x + law["scale"])
    half = stats.t.ppf(0.5 + level / 2, law["df_resid"]) * math.sqrt(max(var, 0.0))
    return mean, mean - half, mean + half


def hparams_from_laws(hparams: dict[str, Any], *, steps: float, tpp: float, params_active: float) -> dict[str, Any]:
    v = {"log_steps": math.log(steps), "log_tpp": math.log(tpp), "log_params": math.log(params_active)}
    sel = hparams["selected"]
    lr, lr_lo, lr_hi = predict_regression(sel["log_lr"], v)
    prod, p_lo, p_hi = predict_regression(sel["lr_wd_product"], v)
    usable_lr_wd(lr, prod, where=f"at {steps:.4g} steps, TPP {tpp:g}, {params_active:.4g} active parameters")
    def interval(lo: float, hi: float):
        return [math.exp(lo), math.exp(hi)] if math.isfinite(lo) and math.isfinite(hi) else None

    return {
        "lr": {"value": math.exp(lr), "interval95": interval(lr_lo, lr_hi), "law": sel["log_lr"]["terms"]},
        "lr_wd_product": {"value": math.exp(prod), "interval95": interval(p_lo, p_hi),
                          "law": sel["lr_wd_product"]["terms"]},
        "wd": {"value": math.exp(prod - lr), "law": "LR*·WD* / LR*"},
        "source": "fitted laws",
    }


def dropout_from_law(dropout: dict[str, Any], params_active: float, level: float = 0.95, seed: int = 0) -> dict[str, Any]:
    # a law saved before its degrees of freedom were: the normal draws it was made with
    dof = dropout.get("dof")
    mean, lo, hi = sigmoid_interval(dropout["params"], dropout["cov"], float("inf") if dof is None else float(dof),
                                    params_active, level=level, seed=seed)
    return {"value": float(mean[0]), "interval95": [float(lo[0]), float(hi[0])], "source": "fitted dropout law"}


# Past this many times the largest fitted compute a prediction is flagged on the card (and on stderr).
FAR_EXTRAPOLATION = 100.0


def bpb_from_law(law: PowerLawResult, train_flops: float, level: float = 0.95) -> dict[str, Any]:
    out = {"value": float(law.predict([train_flops])[0]), "interval": None, "ci_level": level,
           "law": law.params, "n_points": law.n_points, "floor_at_zero": bool(law.extra.get("floor_at_zero")),
           "extrapolation_factor": train_flops / law.extra["x_range"][1] if "x_range" in law.extra else None}
    note = law.interval_note  # the one interval rule: a band only where the law has one
    if note is None and law.prediction_model is not None:  # a new run at the target: law, seed noise, t-based
        iv = law.new_run_interval([train_flops], level)
        out["interval"] = [float(iv["lo"][0]), float(iv["hi"][0])]
        out["interval_kind"] = "prediction interval of one run (fits.prediction)"
        out["interval_shares"] = {k: float(v[0]) for k, v in iv["shares"].items()}
        if law.prediction_model.heldout_variance > 0:  # the BPB is the held-out set's: its error is common
            out["heldout_sampling_common"] = float(iv["heldout_sampling_common"][0])
    elif note is None:  # a laws file saved before the prediction model: the bootstrap band of the law
        lo, hi = law.predict_interval([train_flops], level)
        out["interval"] = [float(lo[0]), float(hi[0])]
        out["interval_kind"] = "bootstrap band of the law (no run noise: a laws file saved by older code)"
    else:
        out["interval_note"] = note
    return out


def extrapolation_warnings(predicted_bpb: dict[str, dict[str, Any]]) -> list[str]:
    """A warning when any domain's prediction lies beyond FAR_EXTRAPOLATION × its data's compute."""
    far = {d: b["extrapolation_factor"] for d, b in predicted_bpb.items()
           if (b.get("extrapolation_factor") or 0.0) > FAR_EXTRAPOLATION}
    if not far:
        return []
    where = ", ".join(f"{d} ×{f:.3g}" for d, f in far.items())
    return [f"BPB extrapolated more than {FAR_EXTRAPOLATION:g}× beyond the largest fitted compute ({where}): the "
            "laws and their bands are extended far past what the rungs measured; read them as a guess"]


def recipe_card(target: dict[str, Any], *, power_laws: dict[str, PowerLawResult] | None = None,
                hparams: dict[str, Any] | None = None, dropout: dict[str, Any] | None = None,
                report_laws: dict[str, float] | None = None, report_source: str = "MAI-Base-2 report",
                recipe_dropout: float | None = None, provenance: dict[str, Any] | None = None) -> dict[str, Any]:
    """target needs steps, tpp, params_active, train_flops; everything else in it is passed through."""
    steps, tpp, n_active = target["steps"], target["tpp"], target["params_active"]
    if hparams is not None and hparams.get("selected"):
        hp = hparams_from_laws(hparams, steps=steps, tpp=tpp, params_active=n_active)
    elif report_laws is not None:
        hp = hparams_from_report(report_laws, steps=steps, tpp=tpp, source=report_source)
    else:
        hp = {"source": "none: no fitted laws and no recipe laws given"}
    dropout = dropout if dropout is not None else (hparams or {}).get("dropout")
    if dropout is not None and dropout.get("params"):
        hp["dropout"] = dropout_from_law(dropout, n_active)
    elif recipe_dropout is not None:
        hp["dropout"] = {"value": recipe_dropout, "interval95": None,
                         "source": "the recipe's fixed dropout (no dropout law fitted)"}
    bpb = {d: bpb_from_law(law, target["train_flops"]) for d, law in sorted((power_laws or {}).items())}
    return jsonable({"target": target, "hyperparameters": hp, "predicted_bpb": bpb,
                     "warnings": extrapolation_warnings(bpb), "provenance": provenance or {},
                     "code_version": code_version()})
