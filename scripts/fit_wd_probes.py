"""Refit the LR·WD law of a ladder from weight-decay probes at the law's LR (the report's method).

Each rung has runs at the law's LR with WD = m × the WD of the law they ran under (m = 1: a sweep's seed-0 run,
the other m from `scripts/ladder_probe.py` lines in a probes file). Per rung, the held-out BPB is fitted as a
weighted quadratic in log(LR·WD) (`fits.surfaces.fit_surface`, 1-D: the probes vary WD only), giving the
rung's optimum with its delta-method standard error and flags (not a bowl; optimum outside the probed
range). The optima of the rungs whose bowl is sound are then regressed on log steps with statsmodels OLS
(`fits.hparam_laws.fit_regression`), the recipe's form LR·WD = coef · steps^exponent, once with the exponent
free and once held at the report's −1 (a constant-only fit of log(LR·WD*) + log steps).

    python scripts/fit_wd_probes.py docs/backtest_diagnosis/probes.jsonl --experiment sweep-backtest-wd-c6.3
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fits.hparam_laws import fit_regression  # noqa: E402
from fits.results import jsonable  # noqa: E402
from fits.surfaces import fit_surface  # noqa: E402
from ladder.run.mlflow_runs import DEFAULT_TRACKING_URI, fit_table, read_runs  # noqa: E402

VARIANT = re.compile(r"^L(\d+) WD x([0-9.]+) at the law's LR")


def load_points(probes: Path, experiment: str, tracking_uri: str) -> pd.DataFrame:
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
    df["lr_wd"] = df["lr"] * df["wd"]
    return df.sort_values(["rung", "multiple"]).reset_index(drop=True)


def rung_optima(df: pd.DataFrame) -> pd.DataFrame:
    """One row per rung: the optimum of its 1-D bowl in log(LR·WD), its SE, flags, and the multiple of the law's WD."""
    rows = []
    for rung, g in df.groupby("rung"):
        surface = fit_surface(g, ["lr_wd"], "bpb", id_column=None, key={"rung": int(rung)})
        law = g[g["multiple"] == 1.0]
        law_lr_wd = float(law["lr_wd"].iloc[0]) if len(law) else float("nan")
        x_star, se = float(surface.optimum[0]), float(surface.optimum_se[0])
        rows.append({"rung": int(rung), "steps": float(g["steps"].iloc[0]), "log_steps": math.log(g["steps"].iloc[0]),
                     "log_lr_wd": x_star, "log_lr_wd_se": se, "multiple_of_law": math.exp(x_star) / law_lr_wd,
                     "best_probed_multiple": float(g.loc[g["bpb"].idxmin(), "multiple"]),
                     "predicted_min_bpb": surface.predicted_min, "flags": surface.flags, "ok": surface.ok})
    return pd.DataFrame(rows)


def laws(optima: pd.DataFrame) -> dict:
    used = optima[optima["ok"]].copy()
    out: dict = {"rungs_used": used["rung"].tolist(),
                 "rungs_left_out": {int(r.rung): r.flags for r in optima[~optima["ok"]].itertuples()}}
    free = fit_regression(used, "log_lr_wd", ("log_steps",), allow_exact=True)
    if free is not None:
        out["exponent_free"] = {"coef": math.exp(free.params["const"]), "exponent": free.params["log_steps"],
                                "ci95": free.ci, "r2": free.r2, "n": free.n}
    used["log_lr_wd_times_steps"] = used["log_lr_wd"] + used["log_steps"]
    held = fit_regression(used, "log_lr_wd_times_steps", (), allow_exact=True)
    if held is not None:
        out["exponent_held_at_-1"] = {"coef": math.exp(held.params["const"]),
                                      "coef_ci95": [math.exp(v) for v in held.ci["const"]], "n": held.n}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("probes", type=Path)
    ap.add_argument("--experiment", default="sweep-backtest-wd-c6.3",
                    help="MLflow experiment with the m = 1 runs (seed 0): the backtest under the former c = 6.3 law")
    ap.add_argument("--tracking-uri", default=DEFAULT_TRACKING_URI)
    args = ap.parse_args()
    df = load_points(args.probes, args.experiment, args.tracking_uri)
    print(df[["rung", "multiple", "steps", "lr", "wd", "bpb", "source"]].to_string(index=False), file=sys.stderr)
    optima = rung_optima(df)
    print(optima.drop(columns=["log_steps"]).to_string(index=False), file=sys.stderr)
    print(json.dumps(jsonable({"optimum_per_rung": optima.to_dict(orient="records"), **laws(optima)}), indent=2))


if __name__ == "__main__":
    main()
