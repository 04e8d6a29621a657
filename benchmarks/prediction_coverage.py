"""Coverage of the compute law's prediction intervals on synthetic ladders (`fits.coverage`).

`python -m benchmarks.prediction_coverage [--quick] --json`: the demo's rungs (cpu-demo-d2 at TPP 30,
L2–L7), one or two seeds a rung, a law with no floor over them (the demo's: A·C^−0.12) and one with a
floor (E = 1.2, α = 0.2), seed noise from the noise model (`fits.noise`); for each, the share of draws
whose held-out truth falls inside the nominal 95% and 80% intervals of the backtest (top rung held out),
the recipe card (a new run at 10× the top compute) and the efficiency gain (a candidate at 1.2× compute,
one run at L6), each also with a held-out sampling error drawn once per ladder and shared by its rungs,
the target and the candidate arm. docs/fits.md quotes the full run (2000 draws each).
"""

from __future__ import annotations

import sys

import numpy as np

from benchmarks.common import Report, main_for
from fits.coverage import SyntheticLaw, backtest_coverage, card_coverage, efficiency_coverage

DEMO_FLOPS = np.array([1.770283008e11, 6.462934733e11, 1.835443814e12, 3.896116224e12, 7.770736927e12, 1.325465468e13])
LAWS = {"no floor (A·C^-0.12)": SyntheticLaw(0.0, 3.135 * 1.77e11**0.12, 0.12),
        "floor (E 1.2, alpha 0.2)": SyntheticLaw(1.2, 2.0 * 1.77e11**0.2, 0.2)}
HELDOUT_SE = (0.003, 0.03)  # the held-out set's rel. SE: one error per ladder, shared by its rungs (fits.coverage)


def run(quick: bool) -> Report:
    draws = 200 if quick else 2000
    report = Report("prediction_coverage")
    rows = []
    for name, law in LAWS.items():
        cases = {"backtest, 1 seed": lambda: backtest_coverage(law, DEMO_FLOPS, draws=draws),
                 "backtest, 2 seeds": lambda: backtest_coverage(law, DEMO_FLOPS, seeds=2, draws=draws),
                 "backtest, 1 seed, held-out se 0.3-3% (one per ladder)": lambda: backtest_coverage(
                     law, DEMO_FLOPS, draws=draws, heldout_se=HELDOUT_SE),
                 "recipe card, 10x the top": lambda: card_coverage(law, DEMO_FLOPS, draws=draws),
                 "recipe card, 10x the top, held-out se 0.3-3%": lambda: card_coverage(
                     law, DEMO_FLOPS, draws=draws, heldout_se=HELDOUT_SE),
                 "efficiency gain 1.2x at L6": lambda: efficiency_coverage(law, DEMO_FLOPS, draws=draws),
                 "efficiency gain 1.2x at L6, held-out se 0.3-3%": lambda: efficiency_coverage(
                     law, DEMO_FLOPS, draws=draws, heldout_se=HELDOUT_SE)}
        for case, fn in cases.items():
            rows.append({"law": name, "case": case, "draws": draws, **fn()})
    report.results["coverage"] = rows
    worst95 = min(r["coverage_0.95"] for r in rows)
    report.check("worst_coverage_at_nominal_95", worst95, ">=", 0.90)
    return report


if __name__ == "__main__":
    sys.exit(main_for("prediction_coverage", run))
