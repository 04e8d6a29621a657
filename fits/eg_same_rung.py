"""EG_FLOPs against the baseline's own runs at the same rung, the baseline's law used only for its slope.

`fits.efficiency.efficiency_gains` reads an arm's BPB off the baseline's fitted law: where the law passes
above or below the baseline's own runs at a rung (its misfit there, or those runs' seed noise), every arm at
that rung moves with it, an arm with the baseline's very data included. Against the baseline's runs at the
same rung, that shared misfit cancels:

    log EG = log(C_base / C_arm) + (log ȳ_base − log ȳ_arm) / s,   s = −d log L / d log C of the law at C_base,

ȳ the mean BPB of each side's runs at the rung (the law through the baseline's point, with the law's local
slope: the compute the baseline needs to move from its BPB to the arm's). Its uncertainty, by the delta
method: the seed noise of both means, σ²·(1/n_base + 1/n_arm) with σ² the variance of log BPB between seeds
pooled over every arm with repeated seeds at that rung (its degrees of freedom Σ(n − 1) give the Student-t;
a rung without repeats borrows the pool of the others, and `seed_noise="pooled"` pools over every (arm, rung):
`fits.rung_noise` says why each rung's own is the default), and
the slope's, from the law's bootstrap draws: var(log EG) = var(Δ)/s² + Δ²·var(s)/s⁴ (every rung's s is the
same law's, so an arm's rungs share that part: `log_eg_covariance`, for a trend over them). Without repeated seeds
there is no noise estimate and no interval; where the baseline's law has no interval (the one interval rule,
`FitResult.interval_note`: fewer than 5 rungs, no bootstrap), its slope's part cannot be had, and the EG
has no interval either, the law's note saying why, as against the law. A rung where the baseline has no
run gives no EG, nor, paired, one where no run of the arm shares a value with the baseline's.

Paired on a column (`pair`, e.g. "seed"): an arm's run and the baseline's run at one rung with the same value
there start from the same initial weights (`seed` sets them; `data_seed` the order of the data, rungs.config),
so what the initialisation does to both cancels in their difference. The runs at a rung are then a randomized
block design, the values of `pair` the blocks: log y = arm effect + block effect + noise. Δ is the mean over the
n values both sides ran of d = log y_base − log y_arm, var(Δ) = 2σ²/n, and σ² the residual variance of that
additive fit, by least squares over the baseline and every arm at the rung that shares a value with it, pooled
for each rung, or pooled over the rungs as above (Σ(cells − parameters) degrees of freedom: (A − 1)(S − 1) at a rung of A arms, baseline
included, on S shared values). (Pooling each arm's own differences instead counts the baseline's runs once per
arm: the arms' differences share them, so that pool has about half the degrees of freedom it claims.) Only the
paired runs count; a value run twice on one side is refused. Unpaired, the same runs give var(Δ) = σ²·(2/n) with
σ² holding the initialisation's share too: pairing narrows the interval by as much as that share is
(docs/science.md measures it), and costs degrees of freedom where it is small.

How many seeds would narrow it: with n seeds on each side, the seed-noise part of the interval is
±t·σ·√(2/n)/s in log EG, t with the G·(n − 1) degrees of freedom of the same G (arm, rung) groups at n seeds
each, so an interval of ±h (in log, log(1 + h)) needs the least n ≥ 2 with t·σ·√(2/n)/s ≤ log(1 + h)
(`seeds_for_half_width`; one seed measures no noise). It leaves out the slope's part (Δ²·var(s)/s⁴, zero
for an arm that buys nothing). σ is itself measured, on few degrees of freedom, and n grows as σ²: the
number comes with the range the χ² interval of σ gives at the same level (`seed_sd_interval`; with 18
degrees of freedom σ is known to within −24%/+48% at 95%, so n to within about ×0.6 to ×2.2).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from scipy import special

from fits.efficiency import baseline_law, correlation
from fits.errors import FitInputError
from fits.results import jsonable
from fits.rung_noise import BORROWED_NOTE, Noise, at_rung, bartlett, check_rule, noise_at, pooled

SEEDS_SEARCHED = 10_000  # `seeds_for_half_width` says None past this many seeds a side
NO_REPEATS_NOTE = "no (arm, rung) has repeated seeds: the seed noise, and so the interval, cannot be estimated"
NO_PAIRS_NOTE = ("no (arm, rung) has two or more runs paired with the baseline's: the noise of a pair's "
                 "difference, and so the interval, cannot be estimated")


def pair_differences(base: pd.DataFrame, arm_runs: pd.DataFrame, *, pair: str, y: str) -> pd.Series:
    """d = log y_base − log y_arm per value of `pair` both sides ran (one rung's runs)."""
    b = np.log(base[y].astype(float)).groupby(base[pair]).mean()
    a = np.log(arm_runs[y].astype(float)).groupby(arm_runs[pair]).mean()
    shared = b.index.intersection(a.index)
    return (b[shared] - a[shared]).sort_index()


def paired_variance(per_rung: list[pd.DataFrame], *, arm: str, pair: str, y: str) -> tuple[float | None, int]:
    """(the per-run noise variance of the additive fit log y = arm + block at each rung, pooled, its degrees of
    freedom). `per_rung`: each rung's runs of the baseline and of the arms whose `pair` value the baseline ran too."""
    ss, dof = 0.0, 0
    for runs in per_rung:
        arms, blocks = pd.factorize(runs[arm])[0], pd.factorize(runs[pair])[0]
        n_arms, n_blocks = arms.max() + 1, blocks.max() + 1
        if n_arms < 2 or n_blocks < 2:
            continue
        design = np.zeros((len(runs), n_arms + n_blocks - 1))
        design[np.arange(len(runs)), arms] = 1.0
        rest = blocks > 0
        design[np.flatnonzero(rest), n_arms + blocks[rest] - 1] = 1.0
        logs = np.log(runs[y].to_numpy(np.float64))
        coef, *_ = np.linalg.lstsq(design, logs, rcond=None)
        resid = logs - design @ coef
        ss += float(resid @ resid)
        dof += len(runs) - int(np.linalg.matrix_rank(design))
    if dof == 0:
        return None, 0
    return ss / dof, dof


def check_pairing(df: pd.DataFrame, *, arm: str, baseline: str, rung: str, pair: str) -> None:
    """Refuses a pairing column that cannot pair: missing, empty in a run, a value run twice by one arm at one
    rung, or one that pairs no run of any arm with the baseline's."""
    if pair not in df.columns:
        raise FitInputError(f"no column {pair!r} to pair the runs on; the table has {sorted(map(str, df.columns))}",
                            column=pair)
    missing = df[df[pair].isna()]
    if len(missing):
        named = missing["run_id"].astype(str).tolist() if "run_id" in missing.columns else missing.index.tolist()
        raise FitInputError(f"{len(missing)} run(s) have no {pair!r} to pair on: {named[:5]}", column=pair)
    twice = df[df.duplicated([arm, rung, pair], keep=False)]
    if len(twice):
        first = twice.iloc[0]
        same = twice[(twice[arm] == first[arm]) & (twice[rung] == first[rung]) & (twice[pair] == first[pair])]
        value = first[pair].item() if hasattr(first[pair], "item") else first[pair]
        raise FitInputError(f"arm {str(first[arm])!r} has {len(same)} runs at rung {first[rung]} with {pair} "
                            f"{value!r}: pairing needs one run per value a side", column=pair)
    base = df[df[arm] == baseline]
    others = df[df[arm] != baseline]
    shared = others.merge(base[[rung, pair]].drop_duplicates(), on=[rung, pair])
    if shared.empty:
        raise FitInputError(f"no run of any arm shares a {pair!r} with a baseline run at its rung (the baseline's: "
                            f"{sorted(map(str, set(base[pair])))}; the arms': {sorted(map(str, set(others[pair])))})",
                            column=pair)


def local_slope(E, A, alpha, train_flops: float):
    """s = −d log L / d log C of E + A·C^−α at C (arrays of parameters give arrays)."""
    power = A * train_flops ** (-alpha)
    return alpha * power / (E + power)


def seed_variance(df: pd.DataFrame, *, arm: str, rung: str, y: str) -> tuple[float | None, int]:
    """(pooled variance of log y between seeds of the same arm and rung, its degrees of freedom)."""
    logs = np.log(df[y].astype(float))
    groups = logs.groupby([df[arm], df[rung]])
    dof = int((groups.count() - 1).clip(lower=0).sum())
    if dof == 0:
        return None, 0
    return float(((logs - groups.transform("mean")) ** 2).sum() / dof), dof


# The quantiles below are scipy.stats' own kernels (t.ppf is special.stdtrit, chi2.ppf 2·gammaincinv(dof/2, ·),
# norm.ppf ndtri: the same numbers, bit for bit), called without the distribution objects' argument handling,
# which costs ~200 µs a call: a ladder's cells call them thousands of times in the seed search.
def t_quantile(q: float, dof: float) -> float:
    """The q quantile of Student's t on `dof` > 0 degrees of freedom (0 < q < 1)."""
    return float(special.stdtrit(dof, q))


def chi2_quantile(q: float, dof: float) -> float:
    """The q quantile of χ² on `dof` > 0 degrees of freedom (0 < q < 1)."""
    return float(2 * special.gammaincinv(dof / 2, q))


def seeds_for_half_width(log_sd: float, slope: float, half_width: float, *, groups: int,
                         ci_level: float = 0.95, most: int = SEEDS_SEARCHED) -> int | None:
    """Seeds on each side (arm and baseline alike) for a ±`half_width` EG interval from seed noise alone
    (module docstring): `log_sd` the sd of log BPB between seeds, `slope` the law's local slope
    −d log L / d log C at the rung, `groups` the (arm, rung) groups the noise is pooled over, each with n
    seeds then (groups·(n − 1) degrees of freedom). None above `most`."""
    if not (log_sd >= 0 and slope > 0 and half_width > 0 and groups >= 1 and 0 < ci_level < 1):
        raise ValueError(f"need log_sd >= 0, slope > 0, half_width > 0, groups >= 1 and 0 < ci_level < 1; got "
                         f"{log_sd}, {slope}, {half_width}, {groups}, {ci_level}")
    if log_sd == 0:
        return 2
    target = math.log1p(half_width) * slope / log_sd
    q = 0.5 + ci_level / 2
    # t > z at any degrees of freedom, so no n below the normal quantile's answer will do: start there
    n = max(2, math.floor(2 * (float(special.ndtri(q)) / target) ** 2))
    while n <= most:
        if t_quantile(q, groups * (n - 1)) * math.sqrt(2 / n) <= target:
            return n
        n += 1
    return None


def seed_sd_interval(log_sd: float, dof: int, ci_level: float = 0.95) -> tuple[float, float]:
    """The χ² interval of a noise sd estimated as `log_sd` on `dof` degrees of freedom (normal noise)."""
    tail = (1 - ci_level) / 2
    return (log_sd * math.sqrt(dof / chi2_quantile(1 - tail, dof)),
            log_sd * math.sqrt(dof / chi2_quantile(tail, dof)))


def log_eg_covariance(parts: list[tuple[float, float, float, float]], draws: tuple[np.ndarray, ...]) -> np.ndarray:
    """The covariance of log EG across one arm's rungs, each rung's (Δ, s, var(Δ), C_base) as its interval
    has them (module docstring): each rung's own runs give var(Δ)/s² on the diagonal, and the law's slope,
    read off the same bootstrap draws at every rung, adds Δ_i·Δ_j·Cov(s_i, s_j)/(s_i²·s_j²), which its
    diagonal is the interval's slope part of. An arm that buys nothing (every Δ near 0) has rungs all but
    independent; one with a gain or a loss has them move together with the law's slope."""
    delta, s, var_delta, c_base = (np.array(v, dtype=float) for v in zip(*parts))
    slopes = np.stack([local_slope(*draws, c) for c in c_base])  # (rungs, draws)
    cov_s = np.atleast_2d(np.cov(slopes))  # ddof 1, as the interval's var(s)
    scale = delta / s**2
    return np.diag(var_delta / s**2) + np.outer(scale, scale) * cov_s


def same_rung_gains(df: pd.DataFrame, *, arm: str = "arm", baseline: str = "baseline", y: str = "bpb",
                    flops: str = "train_flops", rung: str = "rung", bootstrap: int = 200, ci_level: float = 0.95,
                    seed: int = 0, floor: str = "auto", target_half_width: float = 0.10,
                    pair: str | None = None, seed_noise: str = "rung") -> dict[str, Any]:
    """Per non-baseline arm and rung: {"rung", "bpb", "train_flops", "eg_flops", "eg_flops_interval", ...}, the
    shape of `efficiency_gains`' rows, with "seeds_for_target": the seeds a side that would make the interval
    ±`target_half_width` (`seeds_for_half_width`) and "seeds_for_target_range", that number at either end of
    the seed noise's own interval; and the seed noise it used. `pair`: the column whose equal values
    pair an arm's run with the baseline's (module docstring); None compares the means of all runs. `seed_noise`:
    "rung" gives each rung's interval the noise measured at that rung (a rung without repeated seeds borrows
    the others' pool), "pooled" one noise pooled over every rung (`fits.rung_noise`).
    "eg_flops_correlation": per arm whose every rung has an interval, the correlation of its rungs' log EG
    (`log_eg_covariance`), what a trend across the rungs needs (`fits.eg_scaling`)."""
    check_rule(seed_noise)
    if pair is not None:
        check_pairing(df, arm=arm, baseline=baseline, rung=rung, pair=pair)
    base = df[df[arm] == baseline]
    law = baseline_law(base, flops, y, bootstrap=bootstrap, ci_level=ci_level, seed=seed, floor=floor)
    p = law.params
    draws = None
    if law.interval_note is None:
        draws = tuple(law.bootstrap_column(n) for n in ("E", "A", "alpha"))
    base_at = {r: g for r, g in base.groupby(rung, sort=True)}
    others = df[df[arm] != baseline]
    pairs: dict[tuple[Any, Any], pd.Series] = {}
    per_rung: dict[Any, Noise] = {}  # each rung's seed noise, from every arm's runs there
    if pair is None:
        for r, runs in df.groupby(rung, sort=True):
            var_r, dof_r = seed_variance(runs, arm=arm, rung=rung, y=y)
            per_rung[r] = at_rung(var_r, dof_r, int(runs[arm].nunique()))
    else:
        for (name, r), g in others.groupby([arm, rung], sort=True):
            if r in base_at:
                pairs[name, r] = pair_differences(base_at[r], g, pair=pair, y=y)
        for r, b in base_at.items():
            block = pd.concat([b, others[(others[rung] == r) & others[pair].isin(b[pair])]])
            var_r, dof_r = paired_variance([block], arm=arm, pair=pair, y=y)
            per_rung[r] = at_rung(var_r, dof_r, sum(len(d) > 0 for (_, rr), d in pairs.items() if rr == r))
    pool = pooled(per_rung)
    q = 0.5 + ci_level / 2
    arms: dict[str, list[dict[str, Any]]] = {}
    correlations: dict[str, list[list[float]]] = {}
    for name, group in others.groupby(arm, sort=True):
        rows = []
        parts: list[tuple[float, float, float, float]] = []  # (Δ, s, var(Δ), C_base) of each rung with an interval
        for r, g in group.groupby(rung, sort=True):
            b = base_at.get(r)
            if b is None:
                continue
            d = pairs.get((name, r))
            if d is not None and len(d) == 0:  # paired, and no run here shares a value with the baseline's
                continue
            if d is not None:  # only the paired runs
                b, g = b[b[pair].isin(d.index)], g[g[pair].isin(d.index)]
            c_base, c_arm = float(b[flops].mean()), float(g[flops].mean())
            y_base, y_arm = float(np.exp(np.log(b[y]).mean())), float(np.exp(np.log(g[y]).mean()))
            s = float(local_slope(p["E"], p["A"], p["alpha"], c_base))
            delta = math.log(y_base) - math.log(y_arm) if d is None else float(d.mean())
            log_eg = math.log(c_base / c_arm) + delta / s
            row = {"rung": r, "bpb": float(g[y].mean()), "train_flops": c_arm, "eg_flops": math.exp(log_eg),
                   "baseline_bpb": float(b[y].mean()), "local_slope": s,
                   "runs": [len(b), len(g)]}
            cell_noise = noise_at(r, per_rung, seed_noise)
            if cell_noise is None:
                row["eg_flops_interval"] = None
                row["eg_flops_interval_note"] = NO_REPEATS_NOTE if pair is None else NO_PAIRS_NOTE
                rows.append(row)
                continue
            row.update(seed_noise_log_sd=math.sqrt(cell_noise.var), seed_noise_dof=cell_noise.dof,
                       seed_noise_from=cell_noise.source)
            if cell_noise.source == "pooled" and seed_noise == "rung":
                row["seed_noise_note"] = BORROWED_NOTE
            if draws is None:  # the one interval rule: the law has no interval, so neither has its slope's part
                row["eg_flops_interval"], row["eg_flops_interval_note"] = None, law.interval_note
            else:
                var_log = cell_noise.var
                var_delta = var_log * (1 / len(b) + 1 / len(g)) if d is None else 2 * var_log / len(d)
                var_s = float(np.var(local_slope(*draws, c_base), ddof=1))
                se = math.sqrt(var_delta / s**2 + delta**2 * var_s / s**4)
                t = t_quantile(q, cell_noise.dof)
                row["eg_flops_interval"] = [math.exp(log_eg - t * se), math.exp(log_eg + t * se)]
                row["eg_flops_interval_dof"] = cell_noise.dof  # its Student-t's, the seed noise's
                parts.append((delta, s, var_delta, c_base))
                row["eg_flops_interval_shares"] = {"seed_noise": var_delta / s**2 / se**2 if se else 1.0,
                                                   "slope": delta**2 * var_s / s**4 / se**2 if se else 0.0}
            if s > 0:  # the seeds a side from the seed noise alone: measured either way
                sd = math.sqrt(cell_noise.var)
                counts = [seeds_for_half_width(v, s, target_half_width, groups=cell_noise.groups, ci_level=ci_level)
                          for v in (sd, *seed_sd_interval(sd, cell_noise.dof, ci_level))]
                row["seeds_for_target"], row["seeds_for_target_range"] = counts[0], counts[1:]
            rows.append(row)
        arms[str(name)] = rows
        if rows and len(parts) == len(rows) and draws is not None:
            cov = log_eg_covariance(parts, draws)
            if np.all(np.diag(cov) > 0):
                correlations[str(name)] = correlation(cov).tolist()
    return jsonable({"baseline": baseline, "ci_level": ci_level, "arms": arms, "eg_flops_correlation": correlations,
                     "baseline_law_flops": law.params,
                     "seed_noise": {**noise_summary(pool, ci_level), "paired_on": pair, "rule": seed_noise,
                                    "by_rung": {str(r): noise_summary(n if n.dof else None, ci_level)
                                                for r, n in per_rung.items()},
                                    "equal_across_rungs": bartlett(per_rung),
                                    "equal_across_arms": None if pair is not None else bartlett(
                                        {a: at_rung(*seed_variance(g, arm=arm, rung=rung, y=y), 1)
                                         for a, g in df.groupby(arm, sort=True)})},
                     "target_half_width": target_half_width})


def noise_summary(estimate: Noise | None, ci_level: float) -> dict[str, Any]:
    """{"log_sd", "dof", "log_sd_interval"} of a noise estimate (None: no repeated seeds, log_sd None)."""
    if estimate is None:
        return {"log_sd": None, "dof": 0}
    sd = math.sqrt(estimate.var)
    return {"log_sd": sd, "dof": estimate.dof, "log_sd_interval": list(seed_sd_interval(sd, estimate.dof, ci_level))}
