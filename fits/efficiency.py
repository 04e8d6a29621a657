"""Compute efficiency, read off fitted compute laws.

- Iso-BPB compute multiplier of a recipe A over a reference model B on one domain: the FLOPs B
  spent over the FLOPs A's law needs to reach B's BPB, C_B / C_A(BPB_B), with C_A(y) the
  inverse of A's law (the report: 4.2×–12.3× over DeepSeek-V4-Pro-Base across four domains).
- Efficiency gain of a change between two arms of an ablation: at each rung, the compute the
  baseline's law needs to reach the candidate's loss over the compute the candidate used:
  EG_FLOPs = C_base(y_cand) / C_cand, and EG_time the same with wall-clock seconds (the baseline's
  law refitted against wall seconds). EG > 1 means the change saves compute; the report quotes
  EG − 1 (activation gradient clipping: +2% at L18 growing to +28% at L42).
An EG's interval carries the baseline law's parameter uncertainty and the candidate's measured BPB's
own noise (one run's seed noise: EG is read off a single noisy point; the arms share the held-out sets,
so their sampling error is common to both and cancels) through the law's slope
(`fits.prediction.PredictionModel.inverse_interval`, Student-t; coverage measured in docs/fits.md);
every rung's EG reads the same law, so their errors are correlated (`eg_log_covariance`, what a trend over the
rungs needs: `fits.eg_scaling`); the iso-BPB multipliers' intervals come from the bootstrap draws of the laws (the reference's BPB is
a published number). Both only where the one interval rule allows the law one (`FitResult.interval_note`); elsewhere the interval is null and
`interval_note` says why.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from fits.results import percentile_interval
from fits.errors import FitInputError
from fits.compute_laws import fit_power_laws
from fits.floors import DEFAULT_FLOOR
from fits.power_law import PowerLawResult
from fits.prediction import log_law_jacobian
from fits.results import jsonable
from fits.bootstrap import MIN_DISTINCT_FOR_INTERVAL
from fits.validate import numeric_column, require_columns
from provenance import code_version


def load_references(path: str | Path) -> dict[str, Any]:
    """A references YAML: {references: [{name, train_flops, bpb: {domain: value}, provenance}]}. Its
    errors name the part that is wrong, in one line, and leave the path to the caller (who names it once)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_bytes().decode("utf-8"))
    except OSError as err:
        raise FitInputError(f"cannot read references YAML: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise FitInputError(f"not UTF-8 text (byte {err.start}); a references YAML is text") from None
    except yaml.YAMLError as err:
        raise FitInputError(f"not a valid references YAML: {_yaml_error(err)}") from None
    refs = data.get("references") if isinstance(data, dict) else None
    if not isinstance(refs, list) or not refs:
        raise FitInputError("expected a mapping with a non-empty 'references' list")
    for i, ref in enumerate(refs):
        if not isinstance(ref, dict):
            raise FitInputError(f"references[{i}] must be a mapping with name, train_flops, bpb; got "
                                f"{type(ref).__name__}")
        for key in ("name", "train_flops", "bpb"):
            if key not in ref:
                raise FitInputError(f"references[{i}] has no {key!r}; each needs name, train_flops, bpb")
        flops = _positive_finite(ref["train_flops"])  # YAML 1.1 reads "1.2e25" (no dot, no sign) as a string
        if flops is None:
            raise FitInputError(f"references[{i}].train_flops must be a finite positive number, got "
                                f"{ref['train_flops']!r}")
        ref["train_flops"] = flops
        if not isinstance(ref["bpb"], dict):
            raise FitInputError(f"references[{i}].bpb must map domains to finite positive BPB values")
        for domain, value in ref["bpb"].items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or _positive_finite(value) is None:
                raise FitInputError(f"references[{i}].bpb.{domain} must be a finite positive BPB, got {value!r}")
    return data


def _positive_finite(value: Any) -> float | None:
    """The value as a finite number > 0, or None (bools are not numbers here)."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if np.isfinite(number) and number > 0 else None


def _yaml_error(err: yaml.YAMLError) -> str:
    """PyYAML's error in one line: where the parser stopped and what it found."""
    mark, problem = getattr(err, "problem_mark", None), getattr(err, "problem", None)
    if mark is None or not problem:
        return " ".join(str(err).split())
    return f"line {mark.line + 1}, column {mark.column + 1}: {' '.join(problem.split())}"


def iso_bpb_multipliers(laws: dict[str, PowerLawResult], references: list[dict[str, Any]],
                        ci_level: float = 0.95) -> dict[str, Any]:
    """Per reference and domain: C_ref / C_law(BPB_ref), with a bootstrap interval when the law has draws."""
    out = []
    for ref in references:
        rows = {}
        for domain, bpb_ref in ref["bpb"].items():
            if domain not in laws:
                continue
            law = laws[domain]
            needed = float(law.inverse([bpb_ref])[0])
            row = {"bpb_reference": bpb_ref, "flops_needed": needed, "multiplier": ref["train_flops"] / needed,
                   "below_floor": bool(np.isinf(needed))}
            if law.interval_note is None:
                mult = ref["train_flops"] / law.inverse_draws([bpb_ref])[:, 0]
                lo, hi = percentile_interval(mult, ci_level)
                row["interval"] = [float(lo), float(hi)]
            else:
                row["interval"], row["interval_note"] = None, law.interval_note
            rows[domain] = row
        values = [r["multiplier"] for r in rows.values()]
        out.append({"reference": ref["name"], "train_flops": ref["train_flops"], "domains": rows,
                    "range": [min(values), max(values)] if values else None,
                    "provenance": ref.get("provenance")})
    return jsonable({"ci_level": ci_level, "references": out, "code_version": code_version()})


def baseline_law(base: pd.DataFrame, x: str, y: str, **fit_options: Any) -> PowerLawResult:
    """The baseline arm's compute law through the one fitting step (`fits.compute_laws.fit_power_laws`),
    on every baseline run (select 'all': an ablation's seeds and rungs are all evidence), with the
    caller's floor rule; its error, if it cannot be fitted, is raised."""
    laws = fit_power_laws(base, x, y, group=None, select="all", id_column=None, **fit_options)
    if y in laws.errors:
        raise laws.errors[y]
    return laws.laws[y]


def _eg_interval(law: PowerLawResult, y_cand: float, n_runs: int, used: float,
                 level: float) -> tuple[float, float, dict[str, float] | None, float | None]:
    """EG's interval: the compute the baseline's law needs for the candidate's measured BPB (the mean of
    its `n_runs` runs), with the law's parameter uncertainty and the candidate's seed noise carried
    through the law's slope (`fits.prediction`), and the degrees of freedom of its Student-t; a law saved
    without a prediction model falls back to its bootstrap draws (parameter uncertainty only, percentiles:
    no degrees of freedom)."""
    model = law.prediction_model
    if model is None:
        lo, hi = percentile_interval(law.inverse_draws([y_cand])[:, 0] / used, level)
        return float(lo), float(hi), None, None
    iv = model.inverse_interval([y_cand], level, n_runs=n_runs)
    return (float(iv["lo"][0] / used), float(iv["hi"][0] / used),
            {k: float(v[0]) for k, v in iv["shares"].items()}, float(iv["dof"]))


def eg_log_covariance(law: PowerLawResult, y_cand: np.ndarray, n_runs: np.ndarray) -> np.ndarray | None:
    """The covariance of log EG_FLOPs across one arm's rungs (candidate BPBs `y_cand`, each the mean of
    `n_runs` runs), from the source of `_eg_interval`, so its diagonal is each rung's own interval's variance.
    Every rung reads the same law, so its parameter error moves them together: g_i'·Σ_θ·g_j, g_i = ∂ log x(y_i)
    / ∂θ = −(∂ log ŷ/∂θ) / (∂ log ŷ/∂ log x) at the rung (implicit differentiation of log ŷ(x; θ) = log y_i),
    plus the candidate's seed noise, its own at each rung (δ_ij). A law without a prediction model gives the
    sample covariance of its bootstrap draws' log x(y_i) (parameter uncertainty only, as its intervals). The
    compute the arm used is a constant of each rung and drops out. None where a BPB is below the law's floor."""
    y_cand = np.asarray(y_cand, dtype=float)
    model = law.prediction_model
    if model is None:
        log_x = np.log(law.inverse_draws(y_cand))
        log_x = log_x[np.all(np.isfinite(log_x), axis=1)]
        return np.atleast_2d(np.cov(log_x, rowvar=False)) if len(log_x) > len(y_cand) else None
    theta = np.asarray(model.theta)
    z = np.log(model.inverse_interval(y_cand)["x"]) - model.log_x0
    if not np.all(np.isfinite(z)):
        return None
    jac = log_law_jacobian(theta, z, model.nested)  # (rungs, params): ∂ log ŷ/∂θ
    log_slope = -theta[1] * jac[:, 0]  # ∂ log ŷ/∂ log x: −α·s₁ with a floor, −α without (column 0 is then 1)
    grad = jac / log_slope[:, None]  # ∂ log x/∂θ, up to a sign that cancels in the product
    law_part = model.scale * grad @ np.asarray(model.cov_unit) @ grad.T
    seed_part = model.scale * model.seed_variance / np.asarray(n_runs, dtype=float) / log_slope**2
    return law_part + np.diag(seed_part)


def correlation(cov: np.ndarray) -> np.ndarray:
    """The correlation matrix of a covariance matrix."""
    sd = np.sqrt(np.diag(cov))
    return cov / np.outer(sd, sd)


def efficiency_gains(df: pd.DataFrame, *, arm: str = "arm", baseline: str = "baseline", y: str = "bpb",
                     flops: str = "train_flops", wall: str | None = "wall_seconds", rung: str = "rung",
                     bootstrap: int = 1000, ci_level: float = 0.95, seed: int = 0,
                     floor: str = DEFAULT_FLOOR) -> dict[str, Any]:
    """EG_FLOPs (and EG_time when `wall` is given) of every non-baseline arm at every rung; `floor` is the
    baseline laws' floor rule (`fits.floors`: "auto" where the rungs show no loss floor). "eg_flops_correlation"
    holds, per arm whose every rung has an interval, the correlation of its rungs' log EG_FLOPs (in the rows'
    order): they read one law (`eg_log_covariance`), what a trend across the rungs needs (`fits.eg_scaling`)."""
    cols = [arm, y, flops, rung] + ([wall] if wall else [])
    require_columns(df, cols)
    df = df.assign(**{c: numeric_column(df, c, positive=True) for c in (y, flops) + ((wall,) if wall else ())})
    if baseline not in set(df[arm]):
        raise FitInputError(f"no rows with {arm} == {baseline!r}; arms present: {sorted(map(str, set(df[arm])))}", column=arm)
    base = df[df[arm] == baseline]
    fit_options = {"bootstrap": bootstrap, "ci_level": ci_level, "seed": seed, "floor": floor}
    law_flops = baseline_law(base, flops, y, **fit_options)
    law_time = baseline_law(base, wall, y, **fit_options) if wall else None
    # The time law's x, wall seconds, differs from seed to seed at one rung, so its distinct x overstate the
    # evidence: its interval is judged by the rungs, as the FLOPs law's is.
    time_note = law_time.interval_note if law_time else None
    n_rungs = base[rung].nunique()
    if law_time and time_note is None and n_rungs < MIN_DISTINCT_FOR_INTERVAL:
        time_note = (f"{n_rungs} baseline rungs: below {MIN_DISTINCT_FOR_INTERVAL} a bootstrap over rows mostly drops "
                     "rungs and its intervals under-cover (the time law's wall seconds differ by seed, so its distinct "
                     "x overstate the rungs)")
    notes = {"eg_flops": law_flops.interval_note, "eg_time": time_note}
    arms, correlations = {}, {}
    for name, group in df[df[arm] != baseline].groupby(arm, sort=True):
        rows = []
        for r, g in group.groupby(rung, sort=True):
            y_c = float(g[y].mean())
            row = {"rung": r, "bpb": y_c, "train_flops": float(g[flops].mean())}
            for key, law, used in (("eg_flops", law_flops, row["train_flops"]),
                                   ("eg_time", law_time, float(g[wall].mean()) if wall else None)):
                if law is None:
                    continue
                row[key] = float(law.inverse([y_c])[0] / used)
                if not math.isfinite(row[key]):  # below the law's floor: no compute reaches it, no interval either
                    row[f"{key}_interval"] = None
                    row[f"{key}_interval_note"] = "the arm's BPB is below the baseline law's floor"
                elif notes[key] is None:
                    lo, hi, shares, dof = _eg_interval(law, y_c, len(g), used, ci_level)
                    row[f"{key}_interval"] = [float(lo), float(hi)]
                    if shares is not None:
                        row[f"{key}_interval_shares"] = shares
                    if dof is not None:  # its Student-t's: what a trend over the rungs reads σ with
                        row[f"{key}_interval_dof"] = dof
                else:
                    row[f"{key}_interval"], row[f"{key}_interval_note"] = None, notes[key]
                if wall and key == "eg_time":
                    row["wall_seconds"] = used
            rows.append(row)
        arms[str(name)] = rows
        if rows and all(r.get("eg_flops_interval") is not None for r in rows):
            runs = group.groupby(rung, sort=True)[y]  # each row's BPB is its rung's mean of these runs
            cov = eg_log_covariance(law_flops, np.array([r["bpb"] for r in rows]), runs.size().to_numpy())
            if cov is not None and np.all(np.diag(cov) > 0) and np.all(np.isfinite(cov)):
                correlations[str(name)] = correlation(cov).tolist()
    return jsonable({"baseline": baseline, "ci_level": ci_level, "arms": arms, "eg_flops_correlation": correlations,
                     "baseline_law_flops": law_flops.params,
                     "baseline_law_time": law_time.params if law_time else None, "code_version": code_version()})
