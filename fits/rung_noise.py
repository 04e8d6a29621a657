"""The seed noise an EG interval against the same rung uses: the rung's own, or pooled over the rungs.

Seed noise need not be the same at every rung of a ladder. On cpu-demo-d2 the sd of log BPB between twelve
seeds of the same data is 0.53%, 0.81% and 0.31% at L2, L3 and L4 (Bartlett's test p = 0.012;
docs/science.md, "The seed noise, rung by rung"), and one pooled σ over those rungs made the replica's 95% intervals cover 1
in 85% of resampled calibrations at L3 and in 100% at L4. Each rung's own noise, from the runs at that rung
(every arm's repeated seeds there), covered 95% at each. So the rule "rung" (the default of
`fits.eg_same_rung.same_rung_gains`) takes each rung's noise where that rung has repeated seeds, on its own
degrees of freedom, and only a rung without them (or whose repeats agree exactly) borrows the pool of the
others (said per cell: `seed_noise_from`); the rule "pooled" is one σ for every rung, the more degrees of freedom when the rungs'
noise is the same. Bartlett's test of equal noise across the rungs is reported either way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from scipy import stats

from fits.errors import FitInputError

NOISE_RULES = ("rung", "pooled")
BORROWED_NOTE = ("no repeated seeds at this rung (or its repeats agree exactly): its seed noise is the other "
                 "rungs' pooled")
EXACT_AGREEMENT_VAR = 1e-20  # a variance of log BPB below this (sd 1e-10) is runs that agree to rounding


@dataclass(frozen=True)
class Noise:
    """A variance of log BPB between seeds, its degrees of freedom, the (arm) groups it was pooled over, and
    where it came from ("rung" or "pooled")."""

    var: float
    dof: int
    groups: int
    source: str


def at_rung(var: float | None, dof: int, groups: int) -> Noise:
    """A rung's own noise estimate; one whose repeated runs agree exactly (a variance at rounding level: the
    same config run twice) measures nothing, and is kept with no degrees of freedom, so that the rung borrows
    the others' pool instead of an interval of zero width."""
    if var is None or var <= EXACT_AGREEMENT_VAR:
        return Noise(0.0, 0, groups, "rung")
    return Noise(var, dof, groups, "rung")


def check_rule(rule: str) -> None:
    if rule not in NOISE_RULES:
        raise FitInputError(f"must be one of {list(NOISE_RULES)}, got {rule!r}", column="seed_noise")


def pooled(per_rung: dict[Any, Noise]) -> Noise | None:
    """The rungs' noise pooled: their sums of squares over their degrees of freedom."""
    dof = sum(n.dof for n in per_rung.values())
    if dof == 0:
        return None
    var = sum(n.var * n.dof for n in per_rung.values() if n.dof) / dof
    return Noise(var, dof, sum(n.groups for n in per_rung.values()), "pooled")


def noise_at(rung: Any, per_rung: dict[Any, Noise], rule: str) -> Noise | None:
    """The noise a cell at `rung` uses under `rule` (module docstring); None where no rung measured any."""
    own = per_rung.get(rung)
    if rule == "rung" and own is not None and own.dof > 0:
        return own
    return pooled(per_rung)


def bartlett(per_rung: dict[Any, Noise]) -> dict[str, Any] | None:
    """Bartlett's test that the rungs with repeated seeds share one noise variance: the statistic, its χ²
    degrees of freedom (rungs − 1) and p. None with fewer than two such rungs (or a rung whose runs agree
    exactly, where the statistic is not defined)."""
    parts = [(n.var, n.dof) for n in per_rung.values() if n.dof > 0]
    if len(parts) < 2 or any(v <= 0 for v, _ in parts):
        return None
    k, total = len(parts), sum(d for _, d in parts)
    pooled_var = sum(v * d for v, d in parts) / total
    correction = 1 + (sum(1 / d for _, d in parts) - 1 / total) / (3 * (k - 1))
    statistic = (total * math.log(pooled_var) - sum(d * math.log(v) for v, d in parts)) / correction
    return {"test": "bartlett", "statistic": statistic, "dof": k - 1,
            "p_value": float(stats.chi2.sf(statistic, k - 1))}
