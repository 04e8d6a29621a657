"""Nightly rung regressions: run a small deterministic sweep fresh, compare with a golden file.

Each night's run gets its own store and run directories (`runs/nightly/<stamp>/`), so nothing is
skipped as already finished. Per trial we compare the final BPB of every held-out domain, the
training throughput (tokens/s) and the mean MoE round count per step with the golden values.
Tolerances are not guessed: `--update-baseline` runs the sweep `repeats` times and sets each
tolerance from the spread it measured (times a safety factor), with a floor for what a repeat on
the same machine cannot show (another machine's kernels, a busier machine). Only a change in the
bad direction beyond tolerance is a regression (BPB or rounds up, tokens/s down); a change in the
good direction is reported as an improvement and is a hint to refresh the golden file.

Throughput is compared only within one machine class (`ladder.machine`: the GPU model and count, else
the CPU model and core count). BPB in deterministic mode and the MoE round count are properties of
the code and the data, so they are compared on any machine; tokens/s is a property of the code and
the hardware, so a golden recorded on another class (or a golden too old to record its class) has
its throughput reported as "not comparable" with a note, never as a regression. We chose a class
per golden over a ratio to a reference timed in the same run: a reference kernel's ratio to a
training step still depends on the machine (cache sizes, memory bandwidth, core count, bf16 units),
so a ratio would not make two classes comparable either, and it would add a second noisy timing to
every night. A team with several machine classes keeps one golden file per class (`--baseline`).
The class is measured by a Ray task that holds the trials' resources, so on a cluster it names the
kind of node the trials ran on (with `gpus: 0` the task, like the trials, sees no GPU).

A trial's golden name (`trial_name`) is block/L/arm/seed plus whatever its block varies (TPP, grid offsets,
dropout), so every trial of a grid is measured and judged on its own; two trials of one name are refused
before anything runs (`nightly_names`), as is a golden with no trials or a trial with no BPB (`load_golden`).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from ladder.errors import LadderInputError
from ladder.machine import machine_info
from ladder.run.orchestrate import SweepOutcome, connect_ray, run_sweep
from sweeps.expand import Trial
from sweeps.plan import PlannedTrial
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
    verdict: str  # ok, regression, improvement, missing, not comparable (throughput from another machine class)

    @property
    def delta(self) -> float:
        return self.current - self.golden


NOT_COMPARABLE = "not comparable"
THROUGHPUT_METRIC = "log_tokens_per_second"


@dataclass
class NightlyReport:
    spec: str
    comparisons: list[Comparison] = field(default_factory=list)
    measurements: dict[str, TrialMeasurement] = field(default_factory=dict)
    golden_machine_class: str | None = None
    machine_class: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> list[Comparison]:
        return [c for c in self.comparisons if c.verdict in ("regression", "missing")]

    @property
    def throughput_compared(self) -> bool:
        return _same_class(self.golden_machine_class, self.machine_class)

    def to_json(self) -> dict:
        return {"spec": self.spec, "ok": not self.regressions, "regressions": len(self.regressions),
                "machine_class": self.machine_class, "golden_machine_class": self.golden_machine_class,
                "throughput_compared": self.throughput_compared, "notes": self.notes,
                "comparisons": [{"trial": c.trial, "metric": c.metric, "golden": c.golden, "current": c.current,
                                 "delta": c.delta, "tolerance": c.tolerance, "verdict": c.verdict}
                                for c in self.comparisons]}


def _same_class(golden: str | None, current: str | None) -> bool:
    return golden is not None and golden == current


def golden_machine_class(golden: dict) -> str | None:
    """The class a golden file was measured on; None for a file written before classes existed."""
    return (golden.get("machine") or {}).get("class")


def trial_name(trial: Trial) -> str:
    """A name that survives config-field additions (the trial key does not): block/L/arm/seed, with the
    coordinates the trial's block varies between them, as its label shows them: the TPP where the block
    lists several, the grid offsets (natural logs) where they are not the centre, the dropout where the
    block sets one. A trial at the centre of a one-TPP block keeps the plain `rungs/L3/base/s0`."""
    parts = [trial.block, f"L{trial.L}"]
    if trial.tpp_in_label:
        parts.append(f"tpp{trial.tpp:g}")
    if trial.log_lr_offset != 0:
        parts.append(f"dlr{trial.log_lr_offset:+g}")
    if trial.log_lr_wd_offset != 0:
        parts.append(f"dlrwd{trial.log_lr_wd_offset:+g}")
    if trial.dropout is not None:
        parts.append(f"p{trial.dropout:g}")
    return "/".join([*parts, trial.arm, f"s{trial.seed}"])


def nightly_names(planned: list[PlannedTrial], *, where: str) -> dict[str, str]:
    """Each planned trial's golden name (`trial_name`), by trial key. Two trials of one name would be
    measured as one (the later overwriting the earlier, so a regression in one could pass): refused,
    before anything runs."""
    names: dict[str, str] = {}
    by_name: dict[str, PlannedTrial] = {}
    for p in planned:
        name = trial_name(p.trial)
        other = by_name.setdefault(name, p)
        if other is not p:
            raise LadderInputError(f"trials {other.label!r} and {p.label!r} both have the nightly name {name!r} (their "
                                   "coordinates agree to the digits a name shows), so one would hide the other's "
                                   "regression; space their grid points further apart", where=where,
                                   field=f"blocks.{p.trial.block}")
        names[p.key] = name
    return names


def measure(outcome: SweepOutcome, names: dict[str, str]) -> dict[str, TrialMeasurement]:
    """Final BPB per domain, tokens/s and mean MoE rounds of each finished trial, from MLflow, by its
    nightly name (`names`: trial key → name, `nightly_names`)."""
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
        out[names[row.key]] = TrialMeasurement(
            bpb={k.split("/", 1)[1]: v for k, v in metrics.items() if k.startswith("final_bpb/")},
            tokens_per_second=statistics.median(rates) if rates else float("nan"),
            moe_rounds_mean=statistics.fmean(rounds) if rounds else float("nan"),
            key=row.key, run_id=row.run_id)
    return out


def run_once(spec: SweepSpec, *, where: str, out_dir: Path, address: str | None, progress,
             names: dict[str, str]) -> dict[str, TrialMeasurement]:
    store = f"sqlite:///{(out_dir / 'mlflow.db').resolve()}"
    outcome = run_sweep(spec, where=where, address=address, tracking_uri=store, progress=progress)
    failed = [r.label for r in outcome.rows if r.state != "finished"]
    if failed:
        progress(f"nightly: trials did not finish: {failed}")
    return measure(outcome, names)


def trial_machine(spec: SweepSpec) -> dict:
    """`machine_info()` of a Ray worker holding one trial worker's resources (see the module docstring)."""
    import ray

    task = ray.remote(machine_info).options(num_cpus=spec.resources.cpus, num_gpus=spec.resources.gpus)
    return ray.get(task.remote())


def run_repeats(spec: SweepSpec, *, where: str, root: Path, repeats: int, address: str | None,
                progress) -> tuple[list[dict[str, TrialMeasurement]], dict]:
    """Each repeat's measurements, and the machine the trials ran on."""
    from sweeps.plan import plan_sweep

    names = nightly_names(plan_sweep(spec, where=where), where=where)  # before Ray starts
    started = connect_ray(address)  # one Ray for all repeats
    try:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        machine = trial_machine(spec)
        progress(f"nightly: machine class {machine['class']}")
        runs = [run_once(spec, where=where, out_dir=root / f"{stamp}-{i}", address=address, progress=progress,
                         names=names)
                for i in range(repeats)]
        return runs, machine
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


def compare(golden: dict, current: dict[str, TrialMeasurement], spec_name: str,
            machine: dict | None = None) -> NightlyReport:
    """Judge tonight's measurements against the golden file; `machine` is tonight's `machine_info()`
    (None: unknown, so throughput is not compared)."""
    tol = golden["tolerances"]
    report = NightlyReport(spec=spec_name, measurements=current, golden_machine_class=golden_machine_class(golden),
                           machine_class=(machine or {}).get("class"))
    if not report.throughput_compared:
        report.notes.append(_not_comparable_note(report.golden_machine_class, report.machine_class))
    unjudged = sorted(set(current) - set(golden["trials"]))
    if unjudged:  # e.g. a trial added to the spec (the JAX rung) before its golden entry was measured
        report.notes.append(f"no golden entry for {', '.join(unjudged)}: measured, not compared; add one with "
                            "--update-baseline")
    for name, want in golden["trials"].items():
        got = current.get(name)
        if got is None:
            report.comparisons.append(Comparison(name, "finished", 1.0, 0.0, 0.0, "missing"))
            continue
        for domain, value in want["bpb"].items():
            now = got.bpb.get(domain, float("nan"))
            report.comparisons.append(_judge(name, f"bpb/{domain}", value, now, tol["bpb_abs"], higher_is_worse=True))
        # Judged as log(tokens/s): a slowdown by a factor f is a change of log f whatever the base rate.
        want_log = math.log(want["tokens_per_second"])
        got_log = math.log(got.tokens_per_second) if got.tokens_per_second > 0 else math.nan
        # An entry refreshed alone on another machine (a trial added later) records its own class.
        trial_class = want.get("machine_class", report.golden_machine_class)
        if trial_class != report.golden_machine_class and not _same_class(trial_class, report.machine_class):
            report.notes.append(f"throughput of {name} not compared: its golden was measured on {trial_class}")
        if _same_class(trial_class, report.machine_class):
            report.comparisons.append(_judge(name, THROUGHPUT_METRIC, want_log, got_log,
                                             tol["tokens_per_second_log_ratio"], higher_is_worse=False))
        else:
            report.comparisons.append(Comparison(name, THROUGHPUT_METRIC, want_log, got_log,
                                                 tol["tokens_per_second_log_ratio"], NOT_COMPARABLE))
        report.comparisons.append(_judge(name, "moe_rounds_mean", want["moe_rounds_mean"], got.moe_rounds_mean,
                                         tol["moe_rounds_abs"], higher_is_worse=True))
    return report


def _not_comparable_note(golden_class: str | None, current_class: str | None) -> str:
    if golden_class is None:
        return ("throughput not compared: the golden file records no machine class (written before classes "
                "existed); refresh it on this machine with --update-baseline. BPB and MoE rounds were compared.")
    if current_class is None:
        return "throughput not compared: tonight's machine class is unknown. BPB and MoE rounds were compared."
    return (f"throughput not compared: the golden was measured on {golden_class}, tonight ran on {current_class}; "
            "keep a golden per machine class (--baseline). BPB and MoE rounds were compared.")


def _judge(trial: str, metric: str, golden: float, current: float, tolerance: float, *,
           higher_is_worse: bool) -> Comparison:
    if not math.isfinite(current):
        return Comparison(trial, metric, golden, current, tolerance, "missing")
    worse = (current - golden) if higher_is_worse else (golden - current)
    verdict = "regression" if worse > tolerance else "improvement" if -worse > tolerance else "ok"
    return Comparison(trial, metric, golden, current, tolerance, verdict)


_GoldenNumber = Annotated[float, Field(strict=True, allow_inf_nan=False)]


class _GoldenTolerances(BaseModel):
    model_config = ConfigDict(extra="allow")
    bpb_abs: _GoldenNumber
    tokens_per_second_log_ratio: _GoldenNumber
    moe_rounds_abs: _GoldenNumber


class _GoldenTrial(BaseModel):
    model_config = ConfigDict(extra="allow")
    # At least one domain: a trial with no BPB to compare would pass whatever tonight's BPB.
    bpb: Annotated[dict[str, _GoldenNumber], Field(min_length=1)]
    tokens_per_second: Annotated[_GoldenNumber, Field(gt=0)]  # compared as its logarithm
    moe_rounds_mean: _GoldenNumber


class GoldenFile(BaseModel):
    """What `compare` reads of a golden file (written by `build_golden`); other keys are kept as written.
    At least one trial, each with at least one domain's BPB: an empty golden would judge nothing and pass."""
    model_config = ConfigDict(extra="allow")
    tolerances: _GoldenTolerances
    trials: Annotated[dict[str, _GoldenTrial], Field(min_length=1)]
    machine: dict | None = None


def load_golden(path: Path) -> dict:
    """The golden file, checked before anything runs: a JSON object that `GoldenFile` validates; anything
    else is bad input naming the file and the key."""
    from ladder.plan.yaml_input import validate_mapping

    if not path.is_file():
        raise LadderInputError("no golden file; create one with `ladder nightly SPEC --update-baseline`",
                               where=str(path), field="--baseline")
    try:
        golden = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise LadderInputError(f"not UTF-8 text (byte {err.start} is 0x{err.object[err.start]:02x}); regenerate it with "
                               f"--update-baseline", where=str(path), field="--baseline") from None
    except json.JSONDecodeError as err:
        raise LadderInputError(f"not valid JSON: {err}", where=str(path)) from None
    except OSError as err:
        raise LadderInputError(f"cannot read: {err.strerror or err}", where=str(path), field="--baseline") from None
    if not isinstance(golden, dict):
        raise LadderInputError(f"a golden file is a JSON object, this holds {_json_kind(golden)}; regenerate with "
                               f"--update-baseline", where=str(path), field="--baseline")
    validate_mapping(GoldenFile, golden, where=str(path), what="a golden file", schema="ladder/run/nightly.py",
                     messages={"missing": "missing", "model_type": "must be a JSON object",
                               "dict_type": "must be a JSON object", "float_type": "must be a number",
                               "too_short": "is empty: a golden with nothing in it would judge nothing and pass"},
                     suffix="; regenerate with --update-baseline")
    return golden


def _json_kind(value: object) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
             float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


