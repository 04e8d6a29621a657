"""Shared pieces of the benchmarks contract (docs/architecture.md):

`python -m benchmarks.NAME [--quick] --json` prints one JSON object
{"benchmark", "machine", "results", "checks": [{"name", "value", "op", "target", "ok"}]}.
Timings are ratios against a reference measured in the same run wherever one exists.
"""

from __future__ import annotations

import argparse
import json
import math
import operator
import re
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


# A check whose name says it is a utilisation (achieved over peak) measures a fraction of what the
# hardware can do: above 1 the measurement or its peak is wrong (a CPU without bf16 units "measured"
# its bf16 peak at ~1 GFLOP/s and a step then read 95x of it), so such a value fails whatever its op.
_UTILISATION = re.compile(r"(^|_)(mfu|utilisation|utilization)(_|$)")


def valid_range(name: str) -> tuple[float, float] | None:
    """The physically possible values of a check named `name`: [0, 1] for a utilisation, else None."""
    return (0.0, 1.0) if _UTILISATION.search(name) else None


@dataclass
class Check:
    """A target the benchmark checks. `valid`: the values a correct measurement can take (a utilisation's
    [0, 1]); a value outside it, or not finite, fails as a failed measurement, never passes."""

    name: str
    value: float
    op: str
    target: float
    valid: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise ValueError(f"check {self.name!r}: op must be one of {sorted(_OPS)}, got {self.op!r}")
        if self.valid is None:
            self.valid = valid_range(self.name)

    @property
    def invalid(self) -> str | None:
        """Why the value cannot be a correct measurement, or None."""
        if not math.isfinite(self.value):
            return f"not a finite measurement ({self.value})"
        if self.valid is not None and not self.valid[0] <= self.value <= self.valid[1]:
            return (f"{self.value:.4g} is outside the possible [{self.valid[0]:g}, {self.valid[1]:g}]: "
                    "a failed measurement (a wrong peak or clock)")
        return None

    @property
    def ok(self) -> bool:
        return self.invalid is None and bool(_OPS[self.op](self.value, self.target))

    def to_dict(self) -> dict[str, Any]:
        out = {"name": self.name, "value": self.value, "op": self.op, "target": self.target, "ok": self.ok}
        if self.invalid is not None:
            out["invalid"] = self.invalid
        return out


@dataclass
class Report:
    benchmark: str
    results: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    # where the benchmark computed: machine_info times its reference matmul there ("cuda": on the
    # GPU, with CUDA events; never on the host CPU while a GPU run waits). None: "cuda" where this
    # process has used a GPU, else "cpu".
    device: str | None = None

    def check(self, name: str, value: float, op: str, target: float, *,
              valid: tuple[float, float] | None = None) -> Check:
        c = Check(name, float(value), op, float(target), valid)
        self.checks.append(c)
        return c

    def computed_on(self) -> str:
        """The device the reference matmul is timed on: `device` if set, else "cuda" where this process
        has initialised CUDA (it ran its work there), else "cpu"."""
        if self.device is not None:
            return self.device
        torch = sys.modules.get("torch")
        return "cuda" if torch is not None and torch.cuda.is_initialized() else "cpu"

    def ran(self) -> bool:
        """False for the report of a run that did not happen (`results["ran"] is False`: no GPU, say)."""
        return not (isinstance(self.results, dict) and self.results.get("ran") is False)

    def to_dict(self, *, quick: bool = False) -> dict[str, Any]:
        # a run that did not happen has nothing to compare with a reference matmul: none is timed (a
        # GPU benchmark without a GPU once spent minutes timing 2048³ bf16 matmuls on the host CPU)
        machine = machine_info(quick=quick, device=self.computed_on(), measure=self.ran())
        return {"benchmark": self.benchmark, "machine": machine,
                "results": self.results, "checks": [c.to_dict() for c in self.checks]}


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


# 8192^3 on a GPU: large enough for the tensor cores' full rate (805 TFLOP/s on an H200), ~1.4 ms a call.
GPU_PEAK_MATMUL_SIZE = 8192

_PEAK_CACHE: dict[tuple[int, str], float] = {}


def measured_peak_bf16_flops(size: int = PEAK_MATMUL_SIZE, repeats: int = 5, device: str = "cpu") -> float:
    """bf16 matmul FLOP/s on `device`, measured with size x size matrices: on the CPU by the host clock,
    on CUDA by CUDA events around each call (the host never waits inside the timed region)."""
    key = (size, device)
    if key not in _PEAK_CACHE:
        import torch

        a = torch.randn(size, size, dtype=torch.bfloat16, device=device)
        b = torch.randn(size, size, dtype=torch.bfloat16, device=device)
        if device == "cuda":
            seconds = cuda_seconds(lambda: a @ b, repeats=repeats, warmup=2)
        else:
            seconds = time_call(lambda: a @ b, repeats=repeats, warmup=2)
        _PEAK_CACHE[key] = 2.0 * size**3 / seconds
    return _PEAK_CACHE[key]


def cuda_seconds(fn: Callable[[], Any], *, repeats: int, warmup: int) -> float:
    """Median device seconds of `fn` by CUDA events (one synchronisation, after all the calls)."""
    import torch

    for _ in range(warmup):
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    samples = sorted(start.elapsed_time(end) / 1e3 for start, end in events)
    return samples[len(samples) // 2]


_cuda_seconds = cuda_seconds  # the name benchmarks/block_kernels.py and benchmarks/muon.py import


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


def machine_info(*, quick: bool = False, device: str = "cpu", measure: bool = True) -> dict[str, Any]:
    """The machine (`ladder.machine`, shared with the nightly) plus the bf16 peak measured on the
    device the benchmark ran on (a CUDA run times the GPU, never the host CPU); `measure=False`: the
    machine alone, nothing timed."""
    info = ladder_machine_info()
    if "torch" in info and measure:
        if device == "cuda":
            size = GPU_PEAK_MATMUL_SIZE
        else:
            size = QUICK_PEAK_MATMUL_SIZE if quick else PEAK_MATMUL_SIZE
        info["peak_bf16_flops_measured"] = measured_peak_bf16_flops(size, device=device)
        info["peak_bf16_matmul_size"] = size
        info["peak_bf16_matmul_device"] = device
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
