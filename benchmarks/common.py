"""Shared pieces of the benchmarks contract (DESIGN.md):

`python -m benchmarks.NAME [--quick] --json` prints one JSON object
{"benchmark", "machine", "results", "checks": [{"name", "value", "op", "target", "ok"}]}.
Timings are ratios against a reference measured in the same run wherever one exists.
"""

from __future__ import annotations

import argparse
import json
import operator
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from ladder.machine import machine_info as ladder_machine_info

_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt, "==": operator.eq,
}


@dataclass
class Check:
    name: str
    value: float
    op: str
    target: float

    @property
    def ok(self) -> bool:
        return bool(_OPS[self.op](self.value, self.target))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "op": self.op, "target": self.target, "ok": self.ok}


@dataclass
class Report:
    benchmark: str
    results: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)

    def check(self, name: str, value: float, op: str, target: float) -> Check:
        c = Check(name, float(value), op, float(target))
        self.checks.append(c)
        return c

    def to_dict(self, *, quick: bool = False) -> dict[str, Any]:
        return {"benchmark": self.benchmark, "machine": machine_info(quick=quick), "results": self.results,
                "checks": [c.to_dict() for c in self.checks]}


def time_call(fn: Callable[[], Any], *, repeats: int = 5, warmup: int = 1,
              clock: Callable[[], float] = time.perf_counter) -> float:
    """Median seconds of `fn` over `repeats` runs after `warmup` runs, by `clock` (wall by default;
    `time.process_time` counts this process's CPU in every thread, which other jobs on the machine do not inflate)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        samples.append(clock() - t0)
    samples.sort()
    return samples[len(samples) // 2]


# --quick checks the contract, not the numbers: a CPU without bf16 units multiplies bf16 at ~1.2 GFLOP/s
# (this project's 2-core AMD EPYC), so the 2048 matmuls took ~100 s of CPU there and 512 ones take ~1.5 s.
QUICK_PEAK_MATMUL_SIZE = 512
PEAK_MATMUL_SIZE = 2048


_PEAK_CACHE: dict[int, float] = {}


def measured_peak_bf16_flops(size: int = PEAK_MATMUL_SIZE, repeats: int = 5) -> float:
    """bf16 matmul FLOP/s on this device, measured with size x size matrices (the MFU denominator)."""
    if size not in _PEAK_CACHE:
        import torch

        a = torch.randn(size, size, dtype=torch.bfloat16)
        b = torch.randn(size, size, dtype=torch.bfloat16)
        seconds = time_call(lambda: a @ b, repeats=repeats, warmup=2)
        _PEAK_CACHE[size] = 2.0 * size**3 / seconds
    return _PEAK_CACHE[size]


def random_token_batch(tokens: Any) -> SimpleNamespace:
    """A batch for the torch engine's training step from random tokens (B, T + 1): inputs, targets, and
    `locate`, which activation clipping asks where a clipped token came from (no document behind it)."""
    return SimpleNamespace(inputs=tokens[:, :-1], targets=tokens[:, 1:],
                           locate=lambda r, p: SimpleNamespace(source="random", doc_id=-1, token_offset=p))


def torch_train_step(cfg: Any, model: Any, optimizer: Any, batch: Any, clipper: Any) -> dict[str, Any]:
    """The torch engine's own training step (`rungs.torch_engine._train_step`) as a job runs it: inside
    the activation clipper's step (if any), its clip events drained and dropped. Returns the step's stats."""
    from rungs.torch_engine import _train_step

    if clipper is not None:
        clipper.begin_step(0)
    out = _train_step(cfg, model, optimizer, batch, clipper, None)
    if clipper is not None:
        clipper.end_step()
        clipper.drain_events()
    return out


def machine_info(*, quick: bool = False) -> dict[str, Any]:
    """The machine (`ladder.machine`, shared with the nightly) plus the bf16 peak measured here."""
    info = ladder_machine_info()
    if "torch" in info:
        size = QUICK_PEAK_MATMUL_SIZE if quick else PEAK_MATMUL_SIZE
        info["peak_bf16_flops_measured"] = measured_peak_bf16_flops(size)
        info["peak_bf16_matmul_size"] = size
    return info


def main_for(name: str, run: Callable[[bool], Report], argv: list[str] | None = None) -> int:
    """Standard entry point: parse --quick/--json, run, print the JSON object (or a summary)."""
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks.{name}")
    parser.add_argument("--quick", action="store_true", help="small sizes, a minute or less")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    args = parser.parse_args(argv)
    print_report(run(args.quick), quick=args.quick, as_json=args.json)
    return 0


def print_report(report: Report, *, quick: bool, as_json: bool) -> None:
    """The contract's JSON object on stdout (indented), or one line per check."""
    payload = report.to_dict(quick=quick)
    if as_json:
        sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")
        return
    for c in payload["checks"]:
        mark = "ok " if c["ok"] else "FAIL"
        sys.stdout.write(f"[{mark}] {c['name']}: {c['value']:.4g} {c['op']} {c['target']:g}\n")
