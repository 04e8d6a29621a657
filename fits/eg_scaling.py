"""What a recipe change buys, rung by rung and domain by domain, and whether it grows with scale.

Per domain (each `bpb_<domain>` column, and `bpb` when present) the efficiency gain of every arm at
every rung is `fits.efficiency.efficiency_gains` on that domain's column: EG_FLOPs = C_base(y_arm) /
C_arm, the compute the baseline's law needs to reach the arm's BPB over the compute the arm used,
with its interval (the baseline law's parameter uncertainty and the arm's seed noise). An EG whose
interval holds 1 is "no measured gain"; one above 1 a gain, below 1 a loss.

The trend is the slope b of log EG against log compute across rungs, log EG_i = a + b·log C_i: b > 0
means the gain grows with scale. Each rung's EG carries its own uncertainty, σ_i = (log hi − log lo) /
(2·t) from its interval, t the quantile that interval was made with (Student-t at its degrees of freedom:
the baseline law's prediction model's against the law, the seed noise's against the same rung; the
normal quantile for an interval of bootstrap percentiles). The rungs are not independent: against the law
every rung's EG is read off the same fitted law, whose parameter error moves them all
(`fits.efficiency.eg_log_covariance`), and against the same rung every rung's carries the law's local slope
(`fits.eg_same_rung.log_eg_covariance`). Their correlation R, with each rung's σ_i, makes the covariance
V = diag(σ)·R·diag(σ) of the rungs' log EG, and the fit is generalised least squares on it (method "gls":
weighted least squares, weights 1/σ_i², where no correlation is given), its standard error scaled up by the
Birge ratio √(χ²/dof), χ² = r'·V⁻¹·r, when the rungs scatter more than V says (never down). The interval is
Student-t on the degrees of freedom of the variance it uses (`quantile_dof`). Where the rungs scatter no more
than V says (Birge ratio 1) the slope's variance is V's alone, and V's σ_i are estimates on ν_i degrees of
freedom: the slope is b = w·y, its variance v = Σ c_i with c_i = w_i·(V·w)_i (each rung's share: ∂v/∂ log σ_i²,
the GLS weights being optimal, so their own change does not move v to first order), and the Welch-Satterthwaite
dof ν_eff = v² / Σ_g (Σ_{i∈g} |c_i|/√ν_i)² over groups g of rungs whose σ share one estimate: a rung's own
seeds make a group of one (the usual (Σc)² / Σ c_i²/ν_i), one law's residual scale or one pooled seed noise
makes all of them one group (ν_eff ≤ their ν; the Cauchy-Schwarz bound on σ̂'s that share their error in any
way), and a normal interval's σ (ν_i = ∞) adds nothing, so all-normal rungs give the normal quantile. Where the
Birge ratio is above 1 the scale is the residuals', on n − 2 degrees of freedom: the smaller of that and
ν_eff. So it is with fewer than `LINE_CHECK_DOF` (2) residual degrees of freedom (three rungs), where the
residuals cannot tell a line from a bend: a misfit the σ_i do not hold shows in χ² on one degree of freedom
only, and the σ-based quantile covered 87% there (`tests/fits/test_eg_trend_coverage.py`). (Always n − 2, as first made, covered 99.5% with σ on 6 dof and 99.95% with σ known:
`tests/fits/test_eg_trend_coverage.py`.) Without rung intervals it is ordinary least squares with the
residuals' standard error and n − 2 degrees of freedom. Two rungs give a slope and no interval. A slope whose
interval holds 0 is "no measured trend". The trend keeps its design (log compute, weights 1/σ_i², the
correlation it used), dof (n − 2), quantile_dof (None: normal) and the covariance of (a, b), and each cell the
compute range its rungs span: what `fits.eg_extrapolate` needs to carry the EG to a target's compute
(`ladder extrapolate`'s card).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from fits.eg_same_rung import check_pairing, same_rung_gains
from fits.efficiency import efficiency_gains
from fits.errors import FitError, FitInputError
from fits.floors import DEFAULT_FLOOR
from fits.results import jsonable
from fits.rung_noise import check_rule
from fits.validate import check_bootstrap, check_level, numeric_column, require_columns
from provenance import code_version

AGAINST = ("law", "rung")
DOMAIN_PREFIX = "bpb_"
SE_PREFIX = "bpb_se_"  # `bpb_se_<domain>`: a run's held-out standard error (ladder.run.mlflow_runs), not a domain
OVERALL = "bpb"


def domain_columns(df: pd.DataFrame) -> dict[str, str]:
    """{domain: column}: every `bpb_<domain>` column (not the `bpb_se_` standard errors), then `bpb`."""
    cols = {c[len(DOMAIN_PREFIX):]: c for c in df.columns
            if isinstance(c, str) and c.startswith(DOMAIN_PREFIX) and not c.startswith(SE_PREFIX)}
    if OVERALL in df.columns:
        cols["all"] = OVERALL
    return cols


def verdict(interval: list[float | None] | None, null: float, *, above: str, below: str, inside: str) -> str:
    """`above` when the interval lies above `null`, `below` when below, else `inside`; an end that is None (an
    infinite one, as `jsonable` writes it) is unbounded on its side."""
    if interval is None or interval[0] is None and interval[1] is None:
        return "no interval"
    lo = -math.inf if interval[0] is None else interval[0]
    hi = math.inf if interval[1] is None else interval[1]
    return above if lo > null else below if hi < null else inside


# What a cell against the same rung carries besides its EG (`fits.eg_same_rung`): the law's local slope and the
# runs a side, the seed noise its interval used (its rung's, or the pool where the rung has no repeats: fits.rung_noise),
# and the seeds a side for the target.
SAME_RUNG_KEYS = ("local_slope", "runs", "seeds_for_target", "seeds_for_target_range", "seed_noise_log_sd",
                  "seed_noise_dof", "seed_noise_from", "seed_noise_note")

# An arm whose BPB lies below the baseline law's floor: no compute brings the baseline there, so its EG_FLOPs
# is unbounded (`efficiency_gains` gives None, `jsonable`'s infinity).
BEYOND_FLOOR = "gain beyond the baseline's floor"


LINE_CHECK_DOF = 2  # residual dof below which the trend's quantile stays Student-t on n − 2 (module docstring)

def eg_verdict(interval: list[float] | None) -> str:
    """A gain, a loss, or "no measured gain" (the interval holds EG = 1)."""
    return verdict(interval, 1.0, above="gain", below="loss", inside="no measured gain")


def effective_dof(contributions: np.ndarray, dofs: list[float | None],
                  groups: list[object] | None = None) -> float:
    """Welch-Satterthwaite degrees of freedom of a variance Σ c_i whose i-th part rests on a σ̂ with dofs[i]
    degrees of freedom (None or inf: known), parts in one of `groups` sharing their estimate, different groups
    independent; `groups` None: all of them one group (module docstring). inf where every part is known."""
    nu = np.array([math.inf if d is None else float(d) for d in dofs])
    share = np.abs(np.asarray(contributions, dtype=float)) / np.sqrt(nu)  # √(Var σ̂²/2)/σ² = 1/√ν per part
    labels = [0] * len(nu) if groups is None else list(groups)
    spread = sum(float(share[[k == g for k in labels]].sum()) ** 2 for g in dict.fromkeys(labels))
    total = float(np.sum(contributions))
    return math.inf if spread == 0 else total**2 / spread


def eg_trend(log_compute: np.ndarray, eg: np.ndarray, intervals: list[list[float] | None], *,
             ci_level: float = 0.95, min_dof_for_interval: int = 1,
             interval_dofs: list[float | None] | None = None,
             correlation: np.ndarray | list[list[float]] | None = None,
             noise_groups: list[object] | None = None) -> dict[str, Any]:
    """The slope of log EG against log compute with its Student-t interval (module docstring). `intervals`
    are the rungs' EG intervals at `ci_level`; `interval_dofs` the degrees of freedom of each one's Student-t
    quantile (`eg_flops_interval_dof` of `efficiency_gains` and `same_rung_gains`), None (or a None entry)
    for an interval made with the normal quantile, as a bootstrap's percentiles are. `correlation`: the
    correlation of the rungs' log EG (`eg_flops_correlation` of the same), which with each rung's σ from its
    interval makes the rungs' covariance for generalised least squares; None treats the rungs as independent.
    `noise_groups`: one label a rung, equal for rungs whose σ share one estimate (a pool), distinct for independent
    ones (each rung's own seeds); None: all may share one (one law's residual scale): the quantile's
    Welch-Satterthwaite dof (module docstring)."""
    x = np.asarray(log_compute, dtype=float)
    y = np.log(np.asarray(eg, dtype=float))
    n = len(x)
    if n < 2 or np.ptp(x) == 0:
        return {"slope": None, "interval": None, "rungs": n, "verdict": "no trend",
                "note": "a trend needs at least two rungs of different compute"}
    dof = n - 2
    weighted = all(iv is not None and iv[0] > 0 and iv[1] > iv[0] for iv in intervals)
    if weighted:
        # Each rung's interval is a t (or normal) interval in log space: its half-width over that quantile is σ.
        dofs = list(interval_dofs) if interval_dofs is not None else [None] * n
        if len(dofs) != n:
            raise FitInputError(f"interval_dofs has {len(dofs)} entries for {n} rungs; give one per rung (None for "
                                "a normal interval)", column="interval_dofs")
        q = 0.5 + ci_level / 2
        quantiles = [float(stats.norm.ppf(q)) if d is None or not math.isfinite(d) else float(stats.t.ppf(q, d))
                     for d in dofs]
        sigma = np.array([(math.log(hi) - math.log(lo)) / (2 * k) for (lo, hi), k in zip(intervals, quantiles)])
        if noise_groups is not None and len(noise_groups) != n:
            raise FitInputError(f"noise_groups has {len(noise_groups)} entries for {n} rungs; give one per rung",
                                column="noise_groups")
    else:
        sigma = np.ones(n)
    gls = weighted and correlation is not None
    cov_y = np.diag(sigma**2)
    if gls:
        corr = np.asarray(correlation, dtype=float)
        if corr.shape != (n, n) or not np.all(np.isfinite(corr)):
            raise FitInputError(f"correlation must be a finite {n}×{n} matrix, one row per rung; got shape "
                                f"{corr.shape}", column="correlation")
        cov_y = corr * np.outer(sigma, sigma)
    # Generalised least squares by whitening: with cov_y = L·L', L⁻¹y = L⁻¹X·β + e has independent unit errors
    # (weighted least squares when cov_y is diagonal, ordinary when it is the identity).
    try:
        chol = np.linalg.cholesky(cov_y)
    except np.linalg.LinAlgError:
        raise FitInputError("the rungs' covariance (their correlation with each rung's σ) is not positive "
                            "definite", column="correlation") from None
    design = np.column_stack([np.ones(n), x])
    white_x, white_y = np.linalg.solve(chol, design), np.linalg.solve(chol, y)
    unit_cov = np.linalg.inv(white_x.T @ white_x)  # Cov(a, b) when the rungs' covariance is right
    intercept, slope = (float(v) for v in unit_cov @ white_x.T @ white_y)
    white_resid = white_y - white_x @ np.array([intercept, slope])
    out: dict[str, Any] = {"slope": slope, "intercept": intercept, "rungs": n, "dof": dof,
                           "method": "gls" if gls else "wls" if weighted else "ols", "ci_level": ci_level,
                           "log_compute": x.tolist(), "weights": (1.0 / sigma**2).tolist()}
    if gls:
        out["correlation"] = corr.tolist()
    if dof < min_dof_for_interval:
        out.update(interval=None, verdict="no interval", note=f"{n} rungs leave no degree of freedom for the "
                   "slope's interval; a trend with an interval needs three rungs")
        return out
    chi2 = float(white_resid @ white_resid)
    if weighted:
        birge = max(1.0, math.sqrt(chi2 / dof))
        scale2 = birge**2
        out["birge_ratio"] = birge
        # The slope is w·y; each rung's share of its variance under cov_y, what the σ̂'s dof weigh.
        w = (unit_cov @ white_x.T @ np.linalg.inv(chol))[1]
        nu = effective_dof(w * (cov_y @ w), dofs, noise_groups)
        # the residuals' scale, or no check of the line at all (three rungs: one residual dof): n − 2 at most
        quantile_dof = min(nu, dof) if birge > 1 or dof < LINE_CHECK_DOF else nu
    else:
        scale2 = chi2 / dof
        quantile_dof = dof
    # The covariance of (intercept, slope): what a prediction of log EG at a new log compute needs
    # (fits.eg_extrapolate), with the same scale as the slope's standard error.
    cov = scale2 * unit_cov
    if not float(cov[1, 1]) > 0:  # rungs whose intervals are all but zero wide: the whitening is ill-conditioned
        out.update(interval=None, verdict="no interval", note="the rungs' covariance leaves the slope no "
                   f"positive variance ({float(cov[1, 1]):.3g}): their intervals are too narrow to weigh")
        return out
    se = math.sqrt(float(cov[1, 1]))
    out["se"] = se
    out["cov"] = cov.tolist()
    t = float(stats.norm.ppf(0.5 + ci_level / 2) if math.isinf(quantile_dof)
              else stats.t.ppf(0.5 + ci_level / 2, quantile_dof))
    out["quantile_dof"] = None if math.isinf(quantile_dof) else quantile_dof
    out["interval"] = [slope - t * se, slope + t * se]
    out["verdict"] = verdict(out["interval"], 0.0, above="grows with scale", below="shrinks with scale",
                             inside="no measured trend")
    return out


def rung_noise_groups(rows: list[dict[str, Any]]) -> list[object]:
    """Against the same rung, which rungs' σ share one estimate: a rung's own seed noise is its own, the pool a
    rung without repeats borrows (or every rung's, `seed_noise="pooled"`) is one; the pool's kinship with the
    rungs it pools is left out (`tests/fits/test_eg_trend_coverage.py` measures the shipped mix with it)."""
    return [("rung", r["rung"]) if r.get("seed_noise_from") == "rung" else "pooled" for r in rows]


def eg_by_domain(df: pd.DataFrame, *, arm: str = "arm", baseline: str = "baseline", rung: str = "rung",
                 flops: str = "train_flops", domains: list[str] | None = None, bootstrap: int = 200,
                 ci_level: float = 0.95, seed: int = 0, floor: str = DEFAULT_FLOOR,
                 against: str = "law", target_half_width: float = 0.10, pair: str | None = None,
                 seed_noise: str = "rung") -> dict[str, Any]:
    """EG_FLOPs of every arm at every rung in every domain, each with its interval and verdict, and per
    arm and domain the trend of log EG with log compute. `against`: "law" reads the arm's BPB off the
    baseline's law (the report's EG); "rung" compares it with the baseline's own runs at the same rung, the
    law giving only its slope (`fits.eg_same_rung`: the law's misfit at a rung, shared by every arm, cancels),
    and each cell says how many seeds a side would make its interval ±`target_half_width`; `pair` (against the
    rung only) pairs an arm's runs with the baseline's on that column (`fits.eg_same_rung`); `seed_noise` (against
    the rung only): each rung's own seed noise ("rung") or one pooled over the rungs ("pooled", `fits.rung_noise`)."""
    check_bootstrap(bootstrap)
    check_level(ci_level)
    if against not in AGAINST:
        raise FitInputError(f"must be one of {list(AGAINST)}, got {against!r}", column="against")
    if pair is not None and against != "rung":
        raise FitInputError(f"runs are paired against the same rung only (against='rung'), not {against!r}",
                            column="pair")
    check_rule(seed_noise)
    if not target_half_width > 0:
        raise FitInputError(f"must be above 0, got {target_half_width}", column="target_half_width")
    available = domain_columns(df)
    if not available:
        raise FitInputError("no metric columns: expected bpb_<domain> columns (or bpb)", column="bpb_<domain>")
    if domains:
        unknown = [d for d in domains if d not in available]
        if unknown:
            raise FitInputError(f"unknown domains {unknown}; the table has {sorted(available)}", column="domains")
        available = {d: available[d] for d in domains}
    # What every domain shares is refused for the whole table; what one domain's values lack is that domain's
    # error (below), and the others go on.
    require_columns(df, [arm, rung, flops])
    if pair is not None:  # once for the table: a run the pairing cannot use is not a domain's law failing
        check_pairing(df, arm=arm, baseline=baseline, rung=rung, pair=pair)
    if baseline not in set(df[arm]):
        raise FitInputError(f"no rows with {arm} == {baseline!r}; arms present: {sorted(map(str, set(df[arm])))}",
                            column=arm)
    per_arm: dict[str, dict[str, Any]] = {}
    laws: dict[str, Any] = {}
    errors: dict[str, str] = {}
    noise: dict[str, Any] = {}
    for domain, column in available.items():
        rows_df = df.dropna(subset=[column])
        numeric_column(rows_df, column, positive=True)  # a bad value is the table's to fix, not a domain to skip
        try:
            if baseline not in set(rows_df[arm]):
                raise FitInputError(f"empty in every {baseline!r} run, so the baseline has no law on {domain}; "
                                    f"measure the baseline on {domain}, or leave the domain out", column=column)
            if against == "rung":
                out = same_rung_gains(rows_df, arm=arm, baseline=baseline, y=column, flops=flops, rung=rung,
                                      bootstrap=bootstrap, ci_level=ci_level, seed=seed, floor=floor,
                                      target_half_width=target_half_width, pair=pair, seed_noise=seed_noise)
                noise[domain] = out["seed_noise"]
            else:
                out = efficiency_gains(rows_df, arm=arm, baseline=baseline, y=column, flops=flops, wall=None,
                                       rung=rung, bootstrap=bootstrap, ci_level=ci_level, seed=seed, floor=floor)
        except FitError as err:  # a domain whose baseline law cannot be fitted: said, the others go on
            errors[domain] = f"{type(err).__name__}: {err}"
            continue
        laws[domain] = out["baseline_law_flops"]
        for name, rows in out["arms"].items():
            cells = []
            for r in rows:
                iv = r.get("eg_flops_interval")
                beyond = r["eg_flops"] is None and r["bpb"] is not None
                cells.append({"rung": r["rung"], "train_flops": r["train_flops"], "bpb": r["bpb"],
                              "eg": r["eg_flops"], "interval": iv,
                              "verdict": BEYOND_FLOOR if beyond else eg_verdict(iv),
                              **{k: r[k] for k in SAME_RUNG_KEYS if k in r},
                              **({"interval_note": r["eg_flops_interval_note"]}
                                 if r.get("eg_flops_interval_note") else {})})
            trend = eg_trend(np.log([c["train_flops"] for c in cells]), np.array([c["eg"] for c in cells]),
                             [c["interval"] for c in cells], ci_level=ci_level,
                             interval_dofs=[r.get("eg_flops_interval_dof") for r in rows],
                             correlation=out["eg_flops_correlation"].get(str(name)),
                             noise_groups=rung_noise_groups(rows) if against == "rung" else None) \
                if all(c["eg"] is not None and c["eg"] > 0 for c in cells) else {
                    "slope": None, "interval": None, "verdict": "no trend",
                    "note": "a rung's EG is unbounded (the arm's BPB is below the baseline law's floor) or 0"}
            if pair is not None and not cells:
                trend = {"slope": None, "interval": None, "verdict": "no trend",
                         "note": f"no run of this arm shares a {pair!r} with the baseline's runs at its rung"}
            measured = [c["train_flops"] for c in cells]
            per_arm.setdefault(str(name), {})[domain] = {
                "rungs": cells, "trend": trend,
                "train_flops_range": [min(measured), max(measured)] if measured else None}
    if not per_arm and errors:
        raise FitInputError("no domain's baseline law could be fitted: " +
                            "; ".join(f"{d}: {e}" for d, e in errors.items()), column=baseline)
    return jsonable({"baseline": baseline, "against": against,
                     **({"seed_noise": noise, "target_half_width": target_half_width} if noise else {}),
                     "ci_level": ci_level, "domains": [d for d in available if d not in errors],
                     "arms": per_arm, "baseline_laws": laws, "errors": errors, "code_version": code_version()})
