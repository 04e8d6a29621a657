"""Coverage measured, not assumed: synthetic ladders drawn from a known law with measured noise, fitted,
and the share of held-out truths that fall inside the prediction intervals (`fits.prediction`).

A draw: rungs at the given compute, `seeds` runs each, log BPB = log(E + A·C^(−α)) + seed noise (+ held-out
sampling error where `heldout_se` is given: one δ per ladder, shared by all its rungs, the target run and a
candidate arm, as every run of a ladder is scored on the same held-out documents; its standard error is
passed to the interval as a runs table's `<y>_se` column would). The seed sd of each draw's ladder is the noise model's
(`fits.noise.SEED_NOISE_LOG_SD`) times exp(0.27·N(0, 1)): domains differ in noise by that much
(`fits.noise`), and the interval does not know a draw's own sd. Every draw is fitted at once by the
batched solver (`fits.batched`, the bootstrap's) from the true law, with the production's Huber δ and
floor rule; the interval is the production's (`fits.prediction`). The production path itself
(`fits.backtest.holdout_backtest`, its starts, its bootstrap) is checked on fewer draws by the tests.

Three intervals are measured: the backtest's (the top rung held out, predicted from the rest), the
recipe card's (every rung fitted, a new run at `target_factor` × the top compute) and an efficiency
gain's (a candidate arm whose law is the baseline's at `multiplier` × its compute, one run at a rung:
does EG's interval hold the true multiplier?).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fits.batched import batched_huber_lm
from fits.noise import SEED_NOISE_LOG_SD, seed_noise
from fits.prediction import prediction_model
from fits.robust import HUBER_DELTA

DOMAIN_SPREAD = 0.27  # sd of log(seed sd) between domains, beyond sampling (fits.noise)


@dataclass(frozen=True)
class SyntheticLaw:
    E: float
    A: float
    alpha: float

    def log_bpb(self, x: np.ndarray) -> np.ndarray:
        return np.log(self.E + self.A * x ** (-self.alpha))


def _residual_fn(z: np.ndarray, log_y: np.ndarray):
    """(r, J) of log ŷ − log y for theta rows (a, α, e, draw): the solver passes the rows still moving, so
    each row carries its draw's index as a fourth parameter with a zero Jacobian column (it never moves)."""

    def fn(theta: np.ndarray):
        t1 = theta[:, 0:1] - theta[:, 1:2] * z[None, :]
        lse = np.logaddexp(t1, theta[:, 2:3])
        s1 = np.exp(t1 - lse)
        rows = log_y[np.rint(theta[:, 3]).astype(int)]
        return lse - rows, np.stack([s1, -z[None, :] * s1, 1.0 - s1, np.zeros_like(s1)], axis=-1)

    return fn


def _draw(rng: np.random.Generator, law: SyntheticLaw, x: np.ndarray, draws: int,
          heldout_se: tuple[float, float] | None) -> tuple[np.ndarray, np.ndarray | None]:
    """(log y (draws, n), eval variance (draws, n) or None): the held-out error is one δ per draw (ladder),
    the same at every x."""
    sd = SEED_NOISE_LOG_SD * np.exp(DOMAIN_SPREAD * rng.standard_normal((draws, 1)))
    log_y = law.log_bpb(x)[None, :] + sd * rng.standard_normal((draws, len(x)))
    if heldout_se is None:
        return log_y, None
    se = rng.uniform(*heldout_se, size=(draws, 1)) * np.ones((1, len(x)))
    return log_y + se[:, :1] * rng.standard_normal((draws, 1)), se**2


def batched_fit(x: np.ndarray, log_y: np.ndarray, law: SyntheticLaw, *, delta: float = HUBER_DELTA,
                floor: str = "auto") -> tuple[np.ndarray, float, np.ndarray]:
    """(theta (draws, 3), log_x0, nested (draws,)): every draw's law, fitted from the true one."""
    log_x0 = float(np.log(x).mean())
    z = np.log(x) - log_x0
    lo, hi = float(log_y.min()), float(log_y.max())  # fits.power_law's bounds, over every draw (one box)
    e_lo = lo - 12.0
    start = np.column_stack([np.full(len(log_y), np.log(law.A) - law.alpha * log_x0), np.full(len(log_y), law.alpha),
                             np.full(len(log_y), np.log(law.E) if law.E > 0 and floor != "zero" else e_lo),
                             np.arange(len(log_y), dtype=float)])
    lower = np.array([lo - 30.0, 1e-4, e_lo, 0.0])
    upper = np.array([hi + 10.0, 4.0, e_lo if floor == "zero" else hi + 1.0, len(log_y) - 1.0])
    theta, _ = batched_huber_lm(_residual_fn(z, log_y), start, np.ones_like(log_y), delta=delta, lower=lower,
                                upper=upper)
    nested = (theta[:, 2] <= log_y.min(axis=1) + np.log(1e-2)) if floor != "fit" else np.zeros(len(theta), bool)
    theta = theta[np.argsort(theta[:, 3])]
    return theta[:, :3], log_x0, nested


def _models(x, log_y, eval_var, theta, log_x0, nested):
    return [prediction_model(theta[b], log_x0, x, np.exp(log_y[b]), nested=bool(nested[b]),
                             noise=seed_noise(x, log_y[b]), eval_variance=None if eval_var is None else eval_var[b])
            for b in range(len(theta))]


def backtest_coverage(law: SyntheticLaw, rungs: np.ndarray, *, seeds: int = 1, draws: int = 400,
                      levels: tuple[float, ...] = (0.95, 0.8), heldout_se: tuple[float, float] | None = None,
                      delta: float = HUBER_DELTA, floor: str = "auto", seed: int = 0) -> dict[str, float]:
    """Share of draws whose held-out top rung (mean of its `seeds` runs) is inside the interval, per level."""
    rng = np.random.default_rng(seed)
    x = np.repeat(rungs, seeds)
    log_y, eval_var = _draw(rng, law, x, draws, heldout_se)
    train = x < rungs[-1]
    theta, log_x0, nested = batched_fit(x[train], log_y[:, train], law, delta=delta, floor=floor)
    models = _models(x[train], log_y[:, train], None if eval_var is None else eval_var[:, train], theta, log_x0, nested)
    actual = np.exp(log_y[:, ~train]).mean(axis=1)
    out = {}
    for level in levels:
        ivs = [m.interval([rungs[-1]], level, eval_variance=0.0 if eval_var is None else eval_var[b, -1],
                          n_runs=seeds) for b, m in enumerate(models)]
        out[f"coverage_{level:g}"] = float(np.mean([iv["lo"][0] <= a <= iv["hi"][0] for iv, a in zip(ivs, actual)]))
        out[f"median_half_width_{level:g}"] = float(np.median([np.expm1(iv["half_width_log"][0]) for iv in ivs]))
    return out


def card_coverage(law: SyntheticLaw, rungs: np.ndarray, *, target_factor: float = 10.0, seeds: int = 1,
                  draws: int = 400, levels: tuple[float, ...] = (0.95, 0.8), seed: int = 0,
                  delta: float = HUBER_DELTA, floor: str = "auto",
                  heldout_se: tuple[float, float] | None = None) -> dict[str, float]:
    """Share of draws whose new run at target_factor × the top compute, scored on the same held-out set,
    lies inside the card's interval."""
    rng = np.random.default_rng(seed)
    x = np.repeat(rungs, seeds)
    target = rungs[-1] * target_factor
    log_y, eval_var = _draw(rng, law, np.append(x, target), draws, heldout_se)
    theta, log_x0, nested = batched_fit(x, log_y[:, :-1], law, delta=delta, floor=floor)
    models = _models(x, log_y[:, :-1], None if eval_var is None else eval_var[:, :-1], theta, log_x0, nested)
    actual = np.exp(log_y[:, -1])
    out = {}
    for level in levels:
        ivs = [m.interval([target], level) for m in models]
        out[f"coverage_{level:g}"] = float(np.mean([iv["lo"][0] <= a <= iv["hi"][0] for iv, a in zip(ivs, actual)]))
        out[f"median_half_width_{level:g}"] = float(np.median([np.expm1(iv["half_width_log"][0]) for iv in ivs]))
    return out


def efficiency_coverage(law: SyntheticLaw, rungs: np.ndarray, *, multiplier: float = 1.2, rung: int = -2,
                        seeds: int = 1, draws: int = 400, levels: tuple[float, ...] = (0.95, 0.8), seed: int = 0,
                        delta: float = HUBER_DELTA, floor: str = "auto",
                        heldout_se: tuple[float, float] | None = None) -> dict[str, float]:
    """Share of draws whose true EG (`multiplier`) lies inside the interval of EG = C_base(y_cand) / C_cand,
    the candidate measured by one run at `rungs[rung]` (its law: the baseline's at multiplier × compute),
    scored on the baseline's held-out set (one δ for both arms)."""
    rng = np.random.default_rng(seed)
    x = np.repeat(rungs, seeds)
    c_cand = rungs[rung]
    both, eval_var = _draw(rng, law, np.append(x, c_cand * multiplier), draws, heldout_se)
    log_y, cand = both[:, :-1], both[:, -1:]
    theta, log_x0, nested = batched_fit(x, log_y, law, delta=delta, floor=floor)
    models = _models(x, log_y, None if eval_var is None else eval_var[:, :-1], theta, log_x0, nested)
    out = {}
    for level in levels:
        ivs = [m.inverse_interval(np.exp(cand[b]), level) for b, m in enumerate(models)]
        out[f"coverage_{level:g}"] = float(np.mean([iv["lo"][0] / c_cand <= multiplier <= iv["hi"][0] / c_cand
                                                    for iv in ivs]))
        out[f"median_half_width_{level:g}"] = float(np.median([np.expm1(iv["half_width_log"][0]) for iv in ivs]))
    return out
