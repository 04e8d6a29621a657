"""Check a candidate demo ladder from its MLflow runs: for each rung set, the held-out top rung
predicted from the rungs below (per domain: error, 95% interval, inside or not), and the LR/WD
surface of every rung that swept a grid (is the optimum inside the grid? where is it against the
law?). docs/backtest_diagnosis/ holds what it printed.

    python scripts/demo_ladder_check.py --experiment sweep-demo-tpp1 --tracking-uri sqlite:////tmp/h7/mlflow.db \
        --rungs 4-9 --rungs 3-8 --jsonl docs/backtest_diagnosis/demo_tpp1_runs.jsonl

Only the runs of the ladder block at the law's LR/WD enter the compute law (as in `ladder demo`);
a rung set whose rungs have not all finished is skipped with a note.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def rung_set(text: str) -> list[int]:
    """'4-9' → 4..9; '4-6,8,11,13' → 4, 5, 6, 8, 11, 13 (a ladder need not be consecutive)."""
    rungs: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        rungs += range(int(lo), int(hi or lo) + 1)
    return rungs


def backtests(long, rungs: list[int]) -> list[dict]:
    from fits.backtest import holdout_backtest
    from fits.errors import FitError

    out = []
    for domain, part in long[long["L"].isin(rungs)].groupby("domain"):
        try:
            b = holdout_backtest(part, "train_flops", "bpb", holdout_top=1, bootstrap=400)
        except FitError as err:
            out.append({"domain": domain, "error": str(err)})
            continue
        p = b["predictions"][0]
        out.append({"domain": domain, "actual": p["actual"], "predicted": p["predicted"], "lo": p["lo"], "hi": p["hi"],
                    "rel_error": p["rel_error"], "inside": p["inside"],
                    "interval_available": p.get("interval_available", True), "floor_at_zero": b.get("floor_at_zero")})
    return out


def surfaces(runs, ladder) -> list[dict]:
    from fits.errors import FitError
    from fits.surfaces import fit_surface

    table = runs.dropna(subset=["bpb", "lr", "wd"]).assign(lr_wd=lambda t: t["lr"] * t["wd"])
    out = []
    for L, part in table.groupby("L"):
        if part["lr"].nunique() < 3:
            continue
        steps = float(part["steps"].median())
        law = ladder[ladder["L"] == L].iloc[0]
        try:
            s = fit_surface(part, ["lr", "lr_wd"], "bpb", key={"L": int(L), "steps": steps})
        except FitError as err:
            out.append({"L": int(L), "error": str(err)})
            continue
        opt = s.optimum_natural()
        out.append({"L": int(L), "steps": steps, "runs": len(part), "lr_star": opt["lr"], "lr_law": float(law["lr"]),
                    "lr_wd_star": opt["lr_wd"], "lr_wd_law": float(law["lr"] * law["wd"]),
                    "lr_wd_coef_star": opt["lr_wd"] * steps, "flags": list(s.flags), "notes": list(s.notes),
                    "best_run_bpb": float(part["bpb"].min()), "law_run_bpb": float(law["bpb"])})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiment", required=True)
    ap.add_argument("--tracking-uri", default="sqlite:///runs/mlflow.db")
    ap.add_argument("--rungs", action="append", default=[], help="a rung set, e.g. 4-9 or 4-6,8,11,13 (repeatable)")
    ap.add_argument("--jsonl", type=Path, help="also write one line per run (rung, block, LR, WD, FLOPs, BPB per domain)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore", category=RuntimeWarning)

    import pandas as pd

    from ladder.run.mlflow_runs import fit_table, long_by_domain, read_runs

    runs = fit_table(read_runs(args.experiment, args.tracking_uri))
    runs["L"] = pd.to_numeric(runs["rung"], errors="coerce").astype(int)
    ladder = runs[(runs["block"] == "ladder")].sort_values("L")
    long = long_by_domain(ladder)
    report: dict = {"experiment": args.experiment, "rung_sets": {}, "surfaces": surfaces(runs, ladder)}
    for text in args.rungs or ["4-9"]:
        rungs = rung_set(text)
        missing = sorted(set(rungs) - set(ladder["L"]))
        if missing:
            report["rung_sets"][text] = {"skipped": f"rungs {missing} have no finished ladder run"}
            continue
        flops = ladder.set_index("L").loc[rungs, "train_flops"]
        report["rung_sets"][text] = {"span": float(flops.max() / flops.min()), "backtest": backtests(long, rungs)}
    print(json.dumps(report, indent=1, default=float))
    if args.jsonl:
        cols = ["L", "block", "lr", "wd", "steps", "tpp", "params_active", "train_flops", "wall_seconds", "bpb"]
        cols += sorted(c for c in runs.columns if c.startswith("bpb_"))
        with args.jsonl.open("w") as f:
            for row in runs.sort_values(["block", "L", "lr", "wd"])[cols].to_dict("records"):
                f.write(json.dumps(row, default=float) + "\n")


if __name__ == "__main__":
    main()
