"""The seed-noise model of `fits.noise`, recomputed from the repeated-seed measurements it quotes.

`python -m benchmarks.seed_noise_model --json`: the sd of log BPB over seeds per (measurement, rung,
domain), their dof-weighted pool (`fits.noise.SEED_NOISE_LOG_SD`), the pool by rung, and the spread of
the domains' log sd beyond what sampling gives (which sets `fits.noise.SEED_NOISE_PRIOR_DOF`). Sources:
docs/backtest_diagnosis/web_by_origin.jsonl (web, TPP 5, five seeds on L4–L7, three on L8; a run's BPB
recombined from its origins by bytes), math_without_proofs_L4-L9_tpp4.jsonl (math without Metamath's
proofs, TPP 4) and the engine_seeds table of docs/science.md (cpu-demo L3, five seeds per engine).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.common import Report, main_for
from fits.noise import SEED_NOISE_LOG_SD, SEED_NOISE_PRIOR_DOF

DIAGNOSIS = Path(__file__).resolve().parent.parent / "docs" / "backtest_diagnosis"
# docs/science.md, "The two engines from their own seeds": mean ± sd of held-out BPB over five seeds, L3
ENGINE_SEEDS = {"torch": {"books": (3.2326, 0.0392), "code": (2.7750, 0.0205), "math": (3.5209, 0.0470),
                          "qa": (3.3834, 0.0258), "stem": (3.3370, 0.0106), "web": (2.8945, 0.0147)},
                "jax": {"books": (3.2262, 0.0288), "code": (2.7720, 0.0176), "math": (3.5160, 0.0661),
                        "qa": (3.3832, 0.0292), "stem": (3.3321, 0.0289), "web": (2.8940, 0.0147)}}


def measurements() -> pd.DataFrame:
    rows = []
    web = pd.read_json(DIAGNOSIS / "web_by_origin.jsonl", lines=True)
    runs = web.assign(bits=web.bpb * web.bytes).groupby(["trial_key", "L"])[["bits", "bytes"]].sum().reset_index()
    for rung, g in runs.groupby("L"):
        rows.append(("backtest TPP 5, web", rung, float(np.std(np.log(g.bits / g.bytes), ddof=1)), len(g) - 1))
    math = pd.read_json(DIAGNOSIS / "math_without_proofs_L4-L9_tpp4.jsonl", lines=True)
    for rung, g in math.groupby("L"):
        rows.append(("backtest TPP 4, math without proofs", rung, float(np.std(np.log(g.without_proofs), ddof=1)),
                     len(g) - 1))
    for engine, table in ENGINE_SEEDS.items():
        for domain, (mean, sd) in table.items():
            rows.append((f"engine_seeds {engine}, {domain}", 3, sd / mean, 4))  # sd/mean ≈ sd of log BPB
    return pd.DataFrame(rows, columns=["source", "rung", "log_sd", "dof"])


def run(quick: bool) -> Report:
    m = measurements()
    pooled = float(np.sqrt((m.log_sd**2 * m.dof).sum() / m.dof.sum()))
    by_rung = {int(r): {"log_sd": float(np.sqrt((g.log_sd**2 * g.dof).sum() / g.dof.sum())), "dof": int(g.dof.sum())}
               for r, g in m.groupby("rung")}
    four = m[m.dof >= 4]
    spread = float(np.sqrt(max(np.log(four.log_sd).var(ddof=1) - (1.0 / (2.0 * four.dof)).mean(), 0.0)))
    report = Report("seed_noise_model")
    report.results = {"measurements": m.to_dict(orient="records"), "pooled_log_sd": pooled, "dof": int(m.dof.sum()),
                      "by_rung": by_rung, "domain_spread_log_sd": spread,
                      "prior_dof_from_spread": 1.0 / (2.0 * spread**2) if spread > 0 else None}
    report.check("model_log_sd_within_5pct_of_pooled", abs(SEED_NOISE_LOG_SD / pooled - 1.0), "<=", 0.05)
    report.check("model_prior_dof_at_most_the_spreads", SEED_NOISE_PRIOR_DOF, "<=", 1.0 / (2.0 * spread**2))
    return report


if __name__ == "__main__":
    sys.exit(main_for("seed_noise_model", run))
