"""How noisy one run's BPB is: the noise model a compute law's prediction interval starts from.

A ladder with one seed per rung cannot see its own seed-to-seed noise, and a 3-parameter law fitted
on 5 rungs keeps 2 residual degrees of freedom, so its residuals alone understate the noise (their
mean square is (n − p)/n of it, before the fit's own pull towards the points). The interval therefore
starts from a measured noise model and lets the ladder's own evidence (repeated seeds, residuals)
move it, weighing each by its degrees of freedom (`fits.prediction`).

Seed noise, sd of log BPB of one run, per held-out domain, from every repeated-seed measurement this
project has (the numbers are reproduced by `python -m benchmarks.seed_noise_model --json`):

- `python -m benchmarks.engine_seeds` (docs/science.md, cpu-demo L3, 382 steps, five seeds per
  engine, six domains): 0.32–1.88%, 12 groups of 4 dof;
- sweeps/backtest.yaml's five seeds on L4–L7 and three on L8 (TPP 5), web's BPB recombined from
  docs/backtest_diagnosis/web_by_origin.jsonl: 0.09–0.86%;
- five seeds on L4–L7, three on L8, two on L9 (TPP 4), math without Metamath's proofs,
  docs/backtest_diagnosis/math_without_proofs_L4-L9_tpp4.jsonl: 0.40–1.05%.

Pooled (85 dof): 0.87%. By rung: L3 0.97%, L4 0.80%, L5 0.68%, L6 0.72%, L7 0.81%, L8 0.29% (4 dof),
L9 0.76% (1 dof): no trend the data resolve, so one figure for every rung. The domains differ more
than 4-dof estimates scatter: the sd of log(sd) is 0.44 against the 0.35 that sampling alone gives,
so a domain's own seed sd lies about exp(±0.27) around the pooled figure. That spread is the prior's
weight: a scaled inverse-χ² prior on the variance with ν dof has sd(log σ) ≈ 1/√(2ν), and
1/√(2·0.27²) ≈ 7; `SEED_NOISE_PRIOR_DOF` takes 6.

The held-out set's sampling error is not in these figures (every seed of a measurement reads the same
documents). Where the runs table carries it (a `<y>_se` column: the held-out documents' standard error
of each run's final BPB) it enters each run's variance; elsewhere it is not modelled apart: the part
of it that differs between rungs shows in the residuals, which move the noise scale.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SEED_NOISE_LOG_SD = 0.0087  # pooled seed sd of log BPB of one run, any domain, any rung (module docstring)
SEED_NOISE_PRIOR_DOF = 6.0  # how far a domain's own seed sd strays from it, as prior degrees of freedom
SEED_NOISE_SOURCE = ("noise model: seed sd 0.87% of BPB per run (pooled over 85 dof of repeated seeds: "
                     "engine_seeds L3, backtest L4–L9; fits.noise)")


@dataclass(frozen=True)
class SeedNoise:
    """The seed-noise variance of log y of one run, its weight in degrees of freedom and where it came from."""

    variance: float
    dof: float
    source: str

    def to_dict(self) -> dict[str, float | str]:
        return {"log_sd": float(np.sqrt(self.variance)), "dof": self.dof, "source": self.source}


def model_seed_noise(log_sd: float = SEED_NOISE_LOG_SD, dof: float = SEED_NOISE_PRIOR_DOF) -> SeedNoise:
    return SeedNoise(variance=log_sd**2, dof=dof, source=SEED_NOISE_SOURCE if log_sd == SEED_NOISE_LOG_SD
                     else f"noise model: seed sd {log_sd:.2%} of BPB per run (given)")


def replicate_variance(x: np.ndarray, log_y: np.ndarray) -> tuple[float, int]:
    """Pooled within-rung variance of log y over the rungs with repeated runs, and its degrees of
    freedom (runs − rungs among them); (nan, 0) where no rung repeats."""
    _, group = np.unique(x, return_inverse=True)
    counts = np.bincount(group)
    means = np.bincount(group, weights=log_y) / counts
    ss = float(((log_y - means[group]) ** 2).sum())
    dof = int((counts - 1).sum())
    return (ss / dof, dof) if dof > 0 else (float("nan"), 0)


def seed_noise(x: np.ndarray, log_y: np.ndarray, prior: SeedNoise | None = None) -> SeedNoise:
    """The noise model, updated by the ladder's repeated seeds where it has them: the pooled
    within-rung variance and the prior, each weighted by its degrees of freedom."""
    prior = prior or model_seed_noise()
    var, dof = replicate_variance(x, log_y)
    if dof == 0:
        return prior
    pooled = (prior.dof * prior.variance + dof * var) / (prior.dof + dof)
    return SeedNoise(variance=pooled, dof=prior.dof + dof,
                     source=f"repeated seeds: within-rung sd {np.sqrt(var):.2%} of BPB ({dof} dof), pooled with the "
                            f"{prior.source} ({prior.dof:g} dof)")
