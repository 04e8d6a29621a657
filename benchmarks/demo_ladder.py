"""Training-step FLOP rate of every rung of the demo ladder (`sweeps/demo.yaml`) against cpu-demo L8 at
TPP 4, measured in the same run, and the demo's idle training time that follows.

The reference, cpu-demo L8 (depth 8, d_model 128), ran at 3.3e10 FLOP/s per trial on these two cores
with two trials at once in the L4-L9 science check (21 min for 4.15e13 FLOPs;
docs/backtest_diagnosis/). A demo rung's idle time is its planned steps × its step time here × (the
reference's step rate here / that idle rate): a ratio, so other jobs on the shared machine cancel.
Steps only: the held-out evaluations every `eval_interval` steps and the job's set-up are not in it.
Timed in process CPU seconds with one thread, the rungs interleaved, the median of the repeats.

    python -m benchmarks.demo_ladder --quick --json [--spec sweeps/demo_cpu_demo.yaml]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from benchmarks.common import Report, main_for, random_token_batch, torch_train_step
from ladder.plan.resolve import resolve_train_config
from rungs.agc import ActivationGradClipper
from rungs.config import parse_config
from rungs.model import Transformer
from rungs.optim import build_optimizer
from sweeps.plan import plan_sweep
from sweeps.spec import load_spec

DEMO_SPEC = "demo"
REFERENCE = ("cpu-demo", 8, 4.0)  # recipe, rung, TPP
REFERENCE_IDLE_FLOPS_PER_SECOND = 3.3e10  # per trial, two trials on two cores (science check, 2026-11-30)
# `make demo` on 2 idle cores is <= 15 min; install (~70 s), corpus preparation (~70 s) and Ray,
# MLflow and the fits (~1.2 min) leave about 11 min for training.
TRAINING_BUDGET_SECONDS = 11 * 60


class Stepper:
    """One rung's real training step (`rungs.train._train_step`) on a fixed random batch."""

    def __init__(self, config: dict) -> None:
        self.cfg = parse_config({**config, "tracking_uri": None})
        torch.manual_seed(0)
        tokens = torch.randint(0, self.cfg.vocab_size, (self.cfg.batch_sequences, self.cfg.seq_len + 1))
        self.batch = random_token_batch(tokens)
        self.model = Transformer(self.cfg.architecture())
        self.optimizer = build_optimizer(self.model, lr=self.cfg.lr, weight_decay=self.cfg.weight_decay)
        settings = self.cfg.agc_settings()  # None with agc off: the job installs no clipper either
        self.clipper = ActivationGradClipper(settings) if settings else None
        if self.clipper is not None:
            self.model.activation_clip = self.clipper
        self.flops_per_step = config["flops_per_token"] * self.cfg.batch_sequences * self.cfg.seq_len
        self.steps = config["steps"]
        self.seconds: list[float] = []

    def step(self) -> float:
        t0 = time.process_time()
        torch_train_step(self.cfg, self.model, self.optimizer, self.batch, self.clipper)
        return time.process_time() - t0

    @property
    def median_seconds(self) -> float:
        return sorted(self.seconds)[len(self.seconds) // 2]


def run(quick: bool, spec_name: str = DEMO_SPEC) -> Report:
    report = Report("demo_ladder")
    torch.set_num_threads(1)
    planned = plan_sweep(load_spec(spec_name))
    # One stepper per rung any trial trains (a grid point steps as its rung does): the `ladder` block's
    # config where it has the rung, else the first trial's on it (a spec need not name a block `ladder`).
    ladder: dict[int, dict] = {}
    for p in sorted(planned, key=lambda p: "ladder" not in p.blocks):
        ladder.setdefault(p.config["L"], p.config)
    recipe, rung, tpp = REFERENCE
    steppers = {"reference": Stepper(resolve_train_config(recipe, rung, {"tpp": tpp}))}
    steppers.update({f"L{L}": Stepper(config) for L, config in sorted(ladder.items())})
    repeats = 3 if quick else 7
    for s in steppers.values():
        s.step()  # warm-up: first-call allocations
    for _ in range(repeats):
        for s in steppers.values():
            s.seconds.append(s.step())
    ref = steppers.pop("reference")
    ref_rate = ref.flops_per_step / ref.median_seconds
    idle_scale = ref_rate / REFERENCE_IDLE_FLOPS_PER_SECOND  # idle seconds per second measured here
    rungs = {}
    for name, s in steppers.items():
        rate = s.flops_per_step / s.median_seconds
        rungs[name] = {"steps": s.steps, "step_cpu_seconds": s.median_seconds, "flops_per_second": rate,
                       "rate_over_reference": rate / ref_rate,
                       "idle_train_seconds_estimate": s.steps * s.median_seconds * idle_scale}
    # Every trial of the sweep (grid points train as long as their rung), on two cores: the largest
    # trial on one, the rest on the other, whichever is longer sets the training time.
    per_trial = [rungs[f"L{p.config['L']}"]["idle_train_seconds_estimate"] for p in planned]
    largest = max(per_trial)
    training_seconds = max(largest, sum(per_trial) - largest)
    report.results = {"spec": spec_name, "repeats": repeats, "clock": "process_time", "threads": 1,
                      "reference": {"recipe": recipe, "rung": rung, "tpp": tpp, "flops_per_second": ref_rate,
                                    "idle_flops_per_second_assumed": REFERENCE_IDLE_FLOPS_PER_SECOND},
                      "rungs": rungs, "trials": len(planned),
                      "idle_training_seconds_estimate": training_seconds}
    report.check("demo_idle_training_seconds_estimate", training_seconds, "<=", TRAINING_BUDGET_SECONDS)
    return report


def main(argv: list[str] | None = None) -> int:
    """`--spec NAME_OR_PATH` measures another sweep's ladder (a candidate demo); the rest is main_for's."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--spec", default=DEMO_SPEC)
    known, rest = parser.parse_known_args(argv)
    return main_for("demo_ladder", lambda quick: run(quick, known.spec), rest)


if __name__ == "__main__":
    sys.exit(main())
