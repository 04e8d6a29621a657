"""What a ladder can resolve, before it runs: the expected width of its top-rung prediction.

The backtest predicts the top rung from the rungs below it. Before any run, the width of that prediction
interval follows from the spec alone: the fitted rungs' compute and seeds fix the law's parameter
uncertainty, the noise model (`fits.noise`: seed sd 0.87% of BPB per run) fixes the noise, and the
residual and prior degrees of freedom fix the t quantile (`fits.prediction`). The law taken is the nested
A·C^(−α), what `--floor auto` fits where the rungs show no loss floor (every cpu-demo ladder so far): its
log is linear in (log A, α), so the width depends on the compute and seeds only, not on the law's values.
A law with a visible floor has one more parameter and a wider interval.

`ladder sweep plan` prints it with the seeds per rung, or the rungs over the same span, that would bring
it under a target width.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from fits.noise import SeedNoise, model_seed_noise
from fits.prediction import PredictionModel, log_law_jacobian
from ladder.errors import LadderInputError
from ladder.plan.values import finite_real

LADDER_BLOCK = "ladder"
MAX_SEEDS = 16
MAX_RUNGS = 24
DEFAULT_TARGET_WIDTH = 0.02  # ± of the 95% interval, relative


def top_rung_half_width(flops: list[float], seeds: list[int], *, level: float = 0.95,
                        noise: SeedNoise | None = None) -> dict[str, Any]:
    """The expected ± (relative) of the `level` interval of the top rung (the largest FLOPs, the mean of
    its seeds) predicted by the nested law fitted on the rungs below, each with its number of seeds."""
    x, m = _check_rungs(flops, seeds)
    order = np.argsort(x, kind="stable")
    x, m = x[order], m[order]
    noise = noise or model_seed_noise()
    fit_x = np.repeat(x[:-1], m[:-1])
    log_x0 = float(np.log(fit_x).mean())
    J = log_law_jacobian(np.zeros(2), np.log(fit_x) - log_x0, nested=True)
    cov_unit = noise.variance * np.linalg.inv(J.T @ J)
    rep_dof = int((m[:-1] - 1).sum())
    model = PredictionModel(theta=[0.0, 0.1], log_x0=log_x0, nested=True, cov_unit=cov_unit.tolist(),
                            seed_variance=noise.variance, scale=1.0, residual_scale=None,
                            dof=noise.dof + rep_dof + (len(x) - 1 - 2), n_points=len(fit_x), n_params=2,
                            noise_source=noise.source)
    iv = model.interval([x[-1]], level, n_runs=int(m[-1]))
    return {"half_width": float(np.expm1(iv["half_width_log"][0])), "level": level, "dof": iv["dof"],
            "shares": {k: float(v[0]) for k, v in iv["shares"].items()},
            "fitted_rungs": len(x) - 1, "runs_fitted": len(fit_x), "top_seeds": int(m[-1])}


def _check_rungs(flops: Any, seeds: Any) -> tuple[np.ndarray, np.ndarray]:
    """The rungs' FLOPs and seeds as arrays, refused with the field named where they cannot give a width: one
    positive, finite number of FLOPs and one whole number ≥ 1 of seeds per rung, at least 4 rungs, and two
    distinct computes below the top (a line through one point has no slope)."""
    flops, seeds = list(flops), list(seeds)
    for i, f in enumerate(flops):
        if not (finite_real(f) and f > 0):
            raise LadderInputError(f"rung {i}: training FLOPs must be a positive, finite number, got {f!r}",
                                   field="flops")
    for i, s in enumerate(seeds):
        if isinstance(s, bool) or not isinstance(s, numbers.Integral) or s < 1:
            raise LadderInputError(f"rung {i}: the number of seeds must be a whole number ≥ 1, got {s!r}",
                                   field="seeds")
    if len(seeds) != len(flops):
        raise LadderInputError(f"{len(seeds)} seed counts for {len(flops)} rungs: one per rung", field="seeds")
    if len(flops) < 4:
        raise LadderInputError(f"{len(flops)} rungs: the backtest needs 3 below the top to fit the law",
                               field="flops")
    x = np.asarray(flops, dtype=float)
    if len(np.unique(np.sort(x)[:-1])) < 2:
        raise LadderInputError("the rungs below the top all have the same training FLOPs: the law's slope "
                               "needs at least two distinct computes", field="flops")
    return x, np.asarray(seeds, dtype=int)


def suggestions(flops: list[float], seeds: list[int], target: float, *, level: float = 0.95) -> dict[str, Any]:
    """The fewest seeds on every rung, or the fewest rungs over the same span of compute (geometric, with the
    spec's seeds on each), whose top-rung interval is within ±target; None where none up to the cap is."""
    _check_target(target)
    by_seeds = next((s for s in range(1, MAX_SEEDS + 1)
                     if top_rung_half_width(flops, [s] * len(flops), level=level)["half_width"] <= target), None)
    lo, hi = min(flops), max(flops)
    seeds_each = int(round(float(np.median(seeds))))
    by_rungs = next((k for k in range(len(flops), MAX_RUNGS + 1)
                     if top_rung_half_width(list(np.geomspace(lo, hi, k)), [seeds_each] * k,
                                            level=level)["half_width"] <= target), None)
    return {"target_half_width": target, "seeds_per_rung": by_seeds, "rungs_same_span": by_rungs,
            "rungs_same_span_seeds": seeds_each}


def _check_target(target: Any) -> None:
    """A target width is a fraction in (0, 1), as `ladder sweep plan --target-width` takes it."""
    if not (finite_real(target) and 0 < target < 1):
        raise LadderInputError(f"a relative half-width in (0, 1), e.g. 0.02 for ±2%, got {target!r}", field="target")


def ladder_runs(trials: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(rung, training FLOPs) of the runs a backtest fits: every trial at the law's LR/WD of the law's kind
    (`law_kind`: the TPP and arm of the "ladder" block's first trial at the law, else the sweep's), each key
    once: the ladder's runs and the extra seeds of a backtest spec, in any block. A grid point off the law's
    LR/WD is not a seed of the law, nor is another arm's or TPP's run: each arm of an ablation is its own law,
    and counting the other arms' runs or the grid's neighbours as its seeds would overstate the precision. A
    trial is a dict with key, block, L, train_flops, tpp, arm and at_law."""
    kind = law_kind(trials)
    keep = {t["key"]: t for t in trials if t["at_law"] and (t["tpp"], t["arm"]) == kind}
    return [(t["L"], t["train_flops"]) for t in keep.values()]


def first_kind(trials: list[dict[str, Any]]) -> tuple[Any, Any] | None:
    """(TPP, arm) of the first trial at the law's LR/WD."""
    return next(((t["tpp"], t["arm"]) for t in trials if t["at_law"]), None)


def law_kind(trials: list[dict[str, Any]]) -> tuple[Any, Any] | None:
    """(TPP, arm) of the law a sweep is read for: the "ladder" block's first trial at the law's LR/WD, else
    (no such block, or none of its trials at the law) the sweep's first."""
    return first_kind([t for t in trials if t["block"] == LADDER_BLOCK]) or first_kind(trials)


def ladder_resolution(trials: list[dict[str, Any]], *, target: float = DEFAULT_TARGET_WIDTH,
                      level: float = 0.95) -> dict[str, Any] | None:
    """A sweep's top-rung resolution (`ladder_runs` says which trials count) and what would reach
    `target`; None with fewer than 4 rungs."""
    _check_target(target)
    rungs: dict[int, list[float]] = {}
    for L, f in ladder_runs(trials):
        rungs.setdefault(L, []).append(f)
    if len(rungs) < 4:
        return None
    flops = [float(np.mean(v)) for _, v in sorted(rungs.items())]
    seeds = [len(v) for _, v in sorted(rungs.items())]
    out = top_rung_half_width(flops, seeds, level=level)
    kind = law_kind(trials)
    several = kind is not None and len({t["arm"] for t in trials}) > 1  # the arm read is named
    return {"rungs": sorted(rungs), "seeds": seeds, "arm": kind[1] if several else None, "law": "A·C^(−α) (no floor; a visible floor adds a parameter "
            "and width)", "noise": model_seed_noise().to_dict(), **out,
            "suggest": suggestions(flops, seeds, target, level=level)}


def describe(res: dict[str, Any]) -> str:
    """One paragraph for the plan's table: the expected ± and what would bring it under the target."""
    s = res["suggest"]
    arm = f" of arm {res['arm']} (each arm its own law)" if res.get("arm") else ""
    head = (f"top rung L{res['rungs'][-1]}{arm} predicted from L{res['rungs'][0]}–L{res['rungs'][-2]} "
            f"({res['fitted_rungs']} rungs, {res['runs_fitted']} runs): expected ±{res['half_width']:.1%} at "
            f"{res['level']:.0%} (parameters {res['shares']['parameters']:.0%}, seed noise "
            f"{res['shares']['seed_noise']:.0%}; noise model seed sd {res['noise']['log_sd']:.2%})")
    if res["half_width"] <= s["target_half_width"]:
        return head + f"; within the target ±{s['target_half_width']:.1%}"
    ways = []
    if s["seeds_per_rung"]:
        ways.append(f"{s['seeds_per_rung']} seeds on every rung")
    if s["rungs_same_span"]:
        each = s["rungs_same_span_seeds"]
        ways.append(f"{s['rungs_same_span']} rungs over the same compute ({each} seed{'' if each == 1 else 's'} each)")
    return head + (f"; under ±{s['target_half_width']:.1%}: " + " or ".join(ways) if ways else
                   f"; ±{s['target_half_width']:.1%} is out of reach with up to {MAX_SEEDS} seeds or {MAX_RUNGS} rungs")
