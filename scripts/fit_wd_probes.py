"""Refit the LR·WD law of a ladder from weight-decay probes at the law's LR.

Each rung has runs at the law's LR with WD = m × the WD of the law they ran under (m = 1: a sweep's seed-0 run,
the other m from `scripts/ladder_probe.py` lines in a probes file). The mean held-out BPB is fitted
over all rungs at once as a bowl in x = log(LR·WD) with one curvature and an optimum on a law:

    BPB(L, x) = level_L + curvature · (x − x*_L)²,   x*_L = log coef + exponent · log steps_L

(the recipe's form, LR·WD = coef · steps^exponent), once with the exponent free and once held at
the report's −1. Prints the fitted coef with its standard error, the exponent, each rung's optimum
as a multiple of the current law's WD, and an F test of the held exponent against the free one.

    python scripts/fit_wd_probes.py docs/backtest_diagnosis/probes.jsonl --experiment sweep-backtest-wd-c6.3
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats
from scipy.optimize import least_squares

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

VARIANT = re.compile(r"^L(\d+) WD x([0-9.]+) at the law's LR")


def load_points(probes: Path, experiment: str, tracking_uri: str) -> pd.DataFrame:
    from ladder.mlflow_runs import fit_table, read_runs

    rows = []
    for line in probes.read_text().splitlines():
        rec = json.loads(line)
        m = VARIANT.match(rec.get("variant", ""))
        if m and rec.get("finished"):
            rows.append({"rung": int(m.group(1)), "multiple": float(m.group(2)), "steps": rec["steps"],
                         "lr": rec["lr"], "wd": rec["weight_decay"], "bpb": rec["bpb_mean"], "source": "probe"})
    if not rows:
        raise SystemExit(f"{probes}: no finished 'L<n> WD x<m> at the law's LR' probes")
    runs = fit_table(read_runs(experiment, tracking_uri))
    base = runs[(runs["seed"].astype(float) == 0) & runs["rung"].astype(float).isin({r["rung"] for r in rows})]
    for _, r in base.iterrows():
        rows.append({"rung": int(r["rung"]), "multiple": 1.0, "steps": float(r["steps"]), "lr": float(r["lr"]),
                     "wd": float(r["wd"]), "bpb": float(r["bpb"]), "source": f"{experiment} seed 0"})
    df = pd.DataFrame(rows)
    df["x"] = np.log(df["lr"] * df["wd"])
    return df.sort_values(["rung", "multiple"]).reset_index(drop=True)


def fit(df: pd.DataFrame, exponent: float | None) -> dict:
    rungs = sorted(df["rung"].unique())
    idx = df["rung"].map({L: i for i, L in enumerate(rungs)}).to_numpy()
    log_steps = np.log(df["steps"].to_numpy(float))
    x, y = df["x"].to_numpy(), df["bpb"].to_numpy()
    n_free = 3 if exponent is None else 2  # log coef, curvature[, exponent]

    def unpack(p):
        log_coef, curvature = p[0], p[1]
        k = p[2] if exponent is None else exponent
        return log_coef, curvature, k, p[n_free:]

    def resid(p):
        log_coef, curvature, k, levels = unpack(p)
        return levels[idx] + curvature * (x - (log_coef + k * log_steps)) ** 2 - y

    start = np.r_[math.log(6.3) - 0.5, 0.03, *([-1.0] if exponent is None else []),
                  [df[df["rung"] == L]["bpb"].min() for L in rungs]]
    res = least_squares(resid, start)
    dof = len(y) - len(res.x)
    sse = float(np.sum(res.fun**2))
    s2 = sse / dof if dof > 0 else float("nan")
    cov = s2 * np.linalg.pinv(res.jac.T @ res.jac)
    log_coef, curvature, k, levels = unpack(res.x)
    out = {"coef": math.exp(log_coef), "log_coef_se": math.sqrt(cov[0, 0]), "curvature": curvature,
           "curvature_se": math.sqrt(cov[1, 1]), "exponent": k,
           "exponent_se": math.sqrt(cov[2, 2]) if exponent is None else None,
           "sse": sse, "dof": dof, "n_points": len(y), "rungs": [int(L) for L in rungs]}
    out["optimum_per_rung"] = {}
    for L, steps in df.groupby("rung")["steps"].first().items():
        lr = df[(df["rung"] == L)]["lr"].iloc[0]
        law_wd = df[(df["rung"] == L) & (df["multiple"] == 1.0)]["wd"].iloc[0]
        wd_star = math.exp(log_coef + k * math.log(steps)) / lr
        out["optimum_per_rung"][int(L)] = {"steps": int(steps), "wd_star": wd_star, "multiple_of_law": wd_star / law_wd}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("probes", type=Path)
    ap.add_argument("--experiment", default="sweep-backtest-wd-c6.3",
                    help="MLflow experiment with the m = 1 runs (seed 0): the backtest under the former c = 6.3 law")
    ap.add_argument("--tracking-uri", default="sqlite:///runs/mlflow.db")
    args = ap.parse_args()
    df = load_points(args.probes, args.experiment, args.tracking_uri)
    print(df[["rung", "multiple", "steps", "lr", "wd", "bpb", "source"]].to_string(index=False), file=sys.stderr)
    free, held = fit(df, None), fit(df, -1.0)
    f_stat = (held["sse"] - free["sse"]) / (free["sse"] / free["dof"])
    p_value = float(stats.f.sf(f_stat, 1, free["dof"]))
    print(json.dumps({"exponent_free": free, "exponent_held_at_-1": held,
                      "f_test_exponent_-1": {"F": f_stat, "p": p_value, "dof": [1, free["dof"]]}}, indent=2))


if __name__ == "__main__":
    main()
