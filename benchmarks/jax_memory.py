"""The JAX job's memory at mai-base-2 L18 widths, from XLA's own analysis: compile only, no step.

`python -m benchmarks.jax_memory [--quick] --json` compiles the engine's gradient program
(`rungs.jaxjob.programs.grads_function`, the one `JaxEngine` runs) on abstract arguments (nothing
is allocated, so it runs on any machine) for each routed-experts path:

- "blocks": the XLA:CPU path (batched einsums over the blocks' gathered weights);
- "pallas": the GPU path (Pallas grouped kernels; on a machine without a CUDA GPU they compile
  interpreted, with the same buffers around them);
- "ragged": `lax.ragged_dot`, the GPU path before, as a reference (no check): XLA expands it into
  a dense (E, rows, K) operand, the ~170 GiB that stopped the L18 step on an H200.

and reports `Compiled.memory_analysis()` (arguments, outputs, temporaries, their total) at 1, 2 and
4 sequences of 4,096 tokens with 2 of L18's layers, the program's largest buffers (from its HLO),
and the update program's figures once. Checks, per checked path: the total at 2 sequences
<= 48 GB (the bound; the PyTorch job peaks at 33 GB there), and the growth of the
temporaries from 2 to 4 sequences over their growth from 1 to 2, halved: 1.0 when they grow
linearly with the tokens, above 1 when some buffer grows faster (check <= 1.1).
`--quick` does the same at reduced widths (the code path and the contract, not the numbers).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from benchmarks.common import Report, print_report
from benchmarks.hlo_buffers import largest_buffers
from benchmarks.jax_gpu_rung import train_config

RECIPE, RUNG = "mai-base-2", 18
TOTAL_BYTES_TARGET = 48e9
GROWTH_TARGET = 1.1
CHECKED_PATHS = ("blocks", "pallas")
REFERENCE_PATHS = ("ragged",)
SEQUENCES = (1, 2, 4)


def rung_config(quick: bool, layers: int, batch_sequences: int, **overrides: Any):
    """The resolved L18 training config (`rungs.config.TrainConfig`) the programs are built for."""
    from rungs.config import parse_config

    return parse_config(train_config(quick, layers, batch_sequences) | overrides)


def grads_memory(cfg: Any, moe_backend: str) -> dict[str, Any]:
    """Compile the gradient program of `cfg` with `moe_backend`; its memory figures and largest buffers."""
    import jax
    import jax.numpy as jnp

    from rungs.jaxjob.agc import AGC
    from rungs.jaxjob.programs import abstract_arguments, grads_function, memory_figures

    settings = cfg.agc_settings()
    agc = AGC(settings) if settings else None
    t0 = time.process_time()
    compiled = jax.jit(grads_function(cfg, agc, jnp.bfloat16, moe_backend=moe_backend)).lower(
        *abstract_arguments(cfg, agc)).compile()
    return memory_figures(compiled).as_dict() | {"compile_cpu_seconds": time.process_time() - t0,
                                                 "largest_buffers": largest_buffers(compiled.as_text())}


def update_memory(cfg: Any) -> dict[str, Any]:
    """The update program's figures (Muon + AdamW over every parameter, donated state)."""
    import jax
    import jax.numpy as jnp

    from rungs.jaxjob.engine import FLAT_SCHEDULE
    from rungs.jaxjob.optim import build_optimizer
    from rungs.jaxjob.programs import abstract_arguments, memory_figures, update_function

    params = abstract_arguments(cfg, None)[0]
    tx = build_optimizer(params, lr=cfg.lr, weight_decay=cfg.weight_decay, schedule=FLAT_SCHEDULE, adam_lr=cfg.adam_lr,
                         adam_betas=(cfg.adam_beta1, cfg.adam_beta2), muon_momentum=cfg.muon_momentum,
                         adjust_lr=cfg.adjust_lr, ns_dtype=jnp.bfloat16)
    state = jax.eval_shape(tx.init, params)
    compiled = jax.jit(update_function(cfg, tx), donate_argnums=(0, 1)).lower(params, state, params).compile()
    return memory_figures(compiled).as_dict() | {"largest_buffers": largest_buffers(compiled.as_text())}


def growth_ratio(temps: dict[int, int]) -> float:
    """(t4 - t2) / (2 (t2 - t1)) of the temporaries at 1, 2, 4 sequences: 1 for linear growth."""
    rise = temps[2] - temps[1]
    return (temps[4] - temps[2]) / (2 * rise) if rise > 0 else float("inf") if temps[4] > temps[2] else 1.0


def run(quick: bool, *, layers: int = 2, paths: tuple[str, ...] = CHECKED_PATHS + REFERENCE_PATHS) -> Report:
    report = Report("jax_memory")
    unknown = set(paths) - set(CHECKED_PATHS + REFERENCE_PATHS)
    if unknown or not 1 <= layers <= RUNG:
        raise ValueError(f"paths must be among {CHECKED_PATHS + REFERENCE_PATHS} and 1 <= layers <= {RUNG}; got "
                         f"paths={sorted(unknown)} unknown, layers={layers}")
    base = rung_config(quick, layers, 2)
    results: dict[str, Any] = {"quick": quick, "recipe": RECIPE, "rung": RUNG, "layers": layers,
                               "seq_len": base.seq_len, "d_model": base.d_model, "n_experts": base.n_experts,
                               "top_k": base.top_k, "precision": "bf16", "paths": {}}
    for path in paths:
        sizes = SEQUENCES if path in CHECKED_PATHS else (2,)
        per: dict[str, Any] = {}
        for seqs in sizes:
            sys.stderr.write(f"jax_memory: compiling the gradient program, {path}, {seqs} sequence(s)\n")
            per[str(seqs)] = grads_memory(rung_config(quick, layers, seqs), path)
        results["paths"][path] = per
        if path in CHECKED_PATHS:
            report.check(f"grads_total_bytes_{path}", per["2"]["total_bytes"], "<=", TOTAL_BYTES_TARGET)
            ratio = growth_ratio({s: per[str(s)]["temp_bytes"] for s in SEQUENCES})
            results["paths"][path + "_temp_growth_ratio"] = ratio
            report.check(f"temp_growth_ratio_{path}", ratio, "<=", GROWTH_TARGET)
    sys.stderr.write("jax_memory: compiling the update program\n")
    results["update"] = update_memory(base)
    report.results = results
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.jax_memory", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="reduced widths (the contract, not the numbers)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--layers", type=int, default=2, help="how many of L18's layers (default 2)")
    p.add_argument("--paths", default=",".join(CHECKED_PATHS + REFERENCE_PATHS),
                   help="routed-experts paths, comma-separated (default: blocks,pallas,ragged)")
    a = p.parse_args(argv)
    try:
        report = run(a.quick, layers=a.layers, paths=tuple(filter(None, a.paths.split(","))))
    except ValueError as e:
        sys.stderr.write(f"jax_memory: {e}\n")
        return 2
    print_report(report, quick=a.quick, as_json=a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
