"""The XLA flags every JAX computation of the suite compiles under, and the environment of a JAX subprocess.

`--xla_backend_optimization_level=0`: XLA:CPU hands its LLVM code generator the lowest optimisation
level (XLA's default is 3). The suite's JAX programs are tiny and run a few steps, so compiling them
is most of their time. Measured on the 2-core dev machine (jax 0.10.2): one engine build of the test
model 12.3 -> 7.9 s on one device and 13.3 -> 7.2 s on a (2, 2) mesh; a step of it 15 -> 38 ms; the
JAX test files (tests/rungs/jaxjob, the JAX golden, one-loop, loop and sweep files) 905 -> 762 s of
test time. The level changes the generated code's rounding, not what it computes: the golden config's
20 JAX losses differ between levels 0 and 3 by at most 3.7e-4 (7.7e-5 relative), the size of the
variation measured between single- and multi-threaded Eigen (4e-4), which the golden tolerance covers
10 times. The JAX test files pass at both levels (run at 0 and at 3, 2026-12-03). Benchmarks and the
product compile at XLA's default: nothing outside tests/ reads this. A flag given in XLA_FLAGS wins:
run the suite at XLA's default with `XLA_FLAGS=--xla_backend_optimization_level=3 make test`.

`--xla_cpu_use_fusion_emitters=false`: XLA:CPU emits its fused loops with its older LLVM IR emitters
instead of the MLIR fusion emitters, which take longer to compile these small programs than they save
in their few steps. Measured on the 2-core dev machine under load (jax 0.10.2, CPU seconds, run back to
back): a build of test_sharding's engine 10.2 -> 6.3 s and a step of it 102 -> 151 ms; test_seed_noise's
L2 engine 9.9 -> 5.9 s and 41 -> 61 ms (its 3 builds -12 s, its 360 JAX steps +7 s);
tests/rungs/jaxjob/test_model.py and test_moe.py 75.4 -> 54.7 s. The emitters change rounding only (that
engine's 4 losses move by at most 6.4e-6 relative): the JAX test files, the JAX golden, one-loop, loop and
JAX benchmark files pass with the flag (2026-12-06). A flag given in XLA_FLAGS wins here too.
"""

from __future__ import annotations

import os

SUITE_XLA_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")
_DEVICE_COUNT = "--xla_force_host_platform_device_count"


def with_suite_flags(flags: str = "") -> str:
    """`flags` with the suite's flags added (a flag already given keeps its given value)."""
    given = flags.split()
    names = {f.split("=", 1)[0] for f in given}
    return " ".join([*given, *(f for f in SUITE_XLA_FLAGS if f.split("=", 1)[0] not in names)])


def jax_subprocess_env(host_devices: int | None = None, **extra: str) -> dict[str, str]:
    """os.environ for a JAX subprocess on the CPU: its XLA flags (the suite's added), with the host
    device count replaced by `host_devices` (XLA needs it before jax is imported; None: one device)."""
    given = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(_DEVICE_COUNT)]
    if host_devices:
        given.append(f"{_DEVICE_COUNT}={host_devices}")
    return {**os.environ, "XLA_FLAGS": with_suite_flags(" ".join(given)), "JAX_PLATFORMS": "cpu", **extra}
