"""Nightly rung regressions: run a small deterministic sweep fresh, compare with a golden file.

Each night's run gets its own store and run directories (`runs/nightly/<stamp>/`), so nothing is
skipped as already finished. Per trial we compare the final BPB of every held-out domain, the
training throughput (tokens/s) and the mean MoE round count per step with the golden values.
Tolerances are not guessed: `--update-baseline` runs the sweep `repeats` times and sets each
tolerance from the spread it measured (times a safety factor), with a floor for what a repeat on
the same machine cannot show (another machine's kernels, a busier machine). Only a change in the
bad direction beyond tolerance is a regression (BPB or rounds up, tokens/s down); a change in the
good direction is reported as an improvement and is a hint to refresh the golden file.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from ladder.errors import LadderInputError
from ladder.orchestrate import SweepOutcome, connect_ray, run_sweep
from sweeps.spec import SWEEPS_DIR, SweepSpec

GOLDENS_DIR = SWEEPS_DIR / "goldens"
SAFETY_FACTOR = 4.0
# Floors: what repeats on one machine cannot measure. BPB in deterministic mode repeats bit for bit
# on one machine, but bf16 kernels differ across CPU models by ~1e-3. Throughput noise is
# multiplicative (compared in log space); on the shared 2-core box two repeats differed by a factor
# 2.0 (log 0.70) when neighbours were busy, so the floor flags only a slowdown beyond 2.5x there.
FLOOR_BPB_ABS = 0.01
FLOOR_TOKENS_PER_SECOND_LOG_RATIO = math.log(2.5)
FLOOR_ROUNDS_ABS = 0.05


@dataclass
class TrialMeasurement:
    bpb: dict[str, float]
    tokens_per_second: float
    moe_rounds_mean: float
    key: str
    run_id: str | None


@dataclass
class Comparison:
    trial: str
    metric: str
    golden: float
    current: float
    tolerance: float
    verdict: str  # ok, regression, improvement, missing

    @property
    def delta(self) -> float:
        return self.current - self.golden


@dataclass
class NightlyReport:
    spec: str
    comparisons: list[Comparison] = field(default_factory=list)
    measurements: dict[str, TrialMeasurement] = field(default_factory=dict)

    @property
    def regressions(self) -> list[Comparison]:
        return [c for c in self.comparisons if c.verdict in ("regression", "missing")]

    def to_json(self) -> dict:
        return {"spec": self.spec, "ok": not self.regressions, "regressions": len(self.regressions),
                "comparisons": [{"trial": c.trial, "metric": c.metric, "golden": c.golden, "current": c.current,
                                 "delta": c.delta, "tolerance": c.tolerance, "verdict": c.verdict}
                                for c in self.comparisons]}


def trial_name(row_label: str, coordinates: dict) -> str:
    """A name that survives config-field additions (the trial key does not): block/L/arm/seed."""
    return f"{coordinates['block']}/L{coordinates['L']}/{coordinates['arm']}/s{coordinates['seed']}"


def measure(outcome: SweepOutcome, spec_trials: dict[str, dict]) -> dict[str, TrialMeasurement]:
    """Final BPB per domain, tokens/s and mean MoE rounds of each finished trial, from MLflow."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(outcome.tracking_uri)
    out = {}
    for row in outcome.rows:
        if row.state != "finished" or row.run_id is None:
            continue
        metrics = client.get_run(row.run_id).data.metrics
        rounds = [m.value for m in client.get_metric_history(row.run_id, "moe_rounds_mean")]
        # The median step rate: one slow step (a busy neighbour, an eval) does not move it.
        rates = [m.value for m in client.get_metric_history(row.run_id, "tokens_per_second")]
        out[trial_name(row.label, spec_trials[row.key])] = TrialMeasurement(
            bpb={k.split("/", 1)[1]: v for k, v in metrics.items() if k.startswith("final_bpb/")},
            tokens_per_second=statistics.median(rates) if rates else float("nan"),
            moe_rounds_mean=statistics.fmean(rounds) if rounds else float("nan"),
            key=row.key, run_id=row.run_id)
    return out


def run_once(spec: SweepSpec, *, where: str, out_dir: Path, address: str | None, progress) -> dict[str, TrialMeasurement]:
    from ladder.sweep_plan import plan_sweep

    store = f"sqlite:///{(out_dir / 'mlflow.db').resolve()}"
    outcome = run_sweep(spec, where=where, address=address, tracking_uri=store, progress=progress)
    coords = {p.key: p.trial.coordinates() for p in plan_sweep(spec, where=where)}
    failed = [r.label for r in outcome.rows if r.state != "finished"]
    if failed:
        progress(f"nightly: trials did not finish: {failed}")
    return measure(outcome, coords)


def run_repeats(spec: SweepSpec, *, where: str, root: Path, repeats: int, address: str | None,
                progress) -> list[dict[str, TrialMeasurement]]:
    started = connect_ray(address)  # one Ray for all repeats
    try:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        return [run_once(spec, where=where, out_dir=root / f"{stamp}-{i}", address=address, progress=progress)
                for i in range(repeats)]
    finally:
        if started:
            import ray

            ray.shutdown()


def _spread(values: list[float]) -> float:
    return max(values) - min(values) if len(values) > 1 else 0.0


def build_golden(spec: SweepSpec, runs: list[dict[str, TrialMeasurement]], machine: dict) -> dict:
    """Golden values (the first repeat's) and tolerances from the spread across repeats."""
    names = sorted(set.intersection(*(set(r) for r in runs)))
    if not names:
        raise LadderInputError("no trial finished in every repeat; cannot set a baseline", field="--update-baseline")
    bpb_spread = max(_spread([r[n].bpb[d] for r in runs]) for n in names for d in runs[0][n].bpb)
    tps_log = max(_spread([math.log(r[n].tokens_per_second) for r in runs]) for n in names)
    rounds_spread = max(_spread([r[n].moe_rounds_mean for r in runs]) for n in names)
    return {
        "spec": spec.name, "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine,
        "repeats": len(runs),
        "noise": {"bpb_abs_spread": bpb_spread, "tokens_per_second_log_ratio_spread": tps_log,
                  "moe_rounds_abs_spread": rounds_spread},
        "tolerances": {"bpb_abs": max(SAFETY_FACTOR * bpb_spread, FLOOR_BPB_ABS),
                       "tokens_per_second_log_ratio": max(SAFETY_FACTOR * tps_log, FLOOR_TOKENS_PER_SECOND_LOG_RATIO),
                       "moe_rounds_abs": max(SAFETY_FACTOR * rounds_spread, FLOOR_ROUNDS_ABS)},
        "trials": {n: {"bpb": runs[0][n].bpb, "tokens_per_second": runs[0][n].tokens_per_second,
                       "moe_rounds_mean": runs[0][n].moe_rounds_mean, "key": runs[0][n].key} for n in names},
    }


def compare(golden: dict, current: dict[str, TrialMeasurement], spec_name: str) -> NightlyReport:
    tol = golden["tolerances"]
    report = NightlyReport(spec=spec_name, measurements=current)
    for name, want in golden["trials"].items():
        got = current.get(name)
        if got is None:
            report.comparisons.append(Comparison(name, "finished", 1.0, 0.0, 0.0, "missing"))
            continue
        for domain, value in want["bpb"].items():
            now = got.bpb.get(domain, float("nan"))
            report.comparisons.append(_judge(name, f"bpb/{domain}", value, now, tol["bpb_abs"], higher_is_worse=True))
        # Judged as log(tokens/s): a slowdown by a factor f is a change of log f whatever the base rate.
        report.comparisons.append(_judge(name, "log_tokens_per_second", math.log(want["tokens_per_second"]),
                                         math.log(got.tokens_per_second) if got.tokens_per_second > 0 else math.nan,
                                         tol["tokens_per_second_log_ratio"], higher_is_worse=False))
        report.comparisons.append(_judge(name, "moe_rounds_mean", want["moe_rounds_mean"], got.moe_rounds_mean,
                                         tol["moe_rounds_abs"], higher_is_worse=True))
    return report


def _judge(trial: str, metric: str, golden: float, current: float, tolerance: float, *,
           higher_is_worse: bool) -> Comparison:
    if not math.isfinite(current):
        return Comparison(trial, metric, golden, current, tolerance, "missing")
    worse = (current - golden) if higher_is_worse else (golden - current)
    verdict = "regression" if worse > tolerance else "improvement" if -worse > tolerance else "ok"
    return Comparison(trial, metric, golden, current, tolerance, verdict)


def load_golden(path: Path) -> dict:
    if not path.is_file():
        raise LadderInputError("no golden file; create one with `ladder nightly SPEC --update-baseline`",
                               where=str(path), field="--baseline")
    try:
        golden = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise LadderInputError(f"not valid JSON: {err}", where=str(path)) from None
    for key in ("tolerances", "trials"):
        if key not in golden:
            raise LadderInputError(f"missing {key!r}; regenerate with --update-baseline", where=str(path), field=key)
    return golden
