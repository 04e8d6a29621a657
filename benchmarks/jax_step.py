"""The JAX training step against the PyTorch one at the largest cpu-demo rung, one thread.

Both steps are the engines' own: `rungs.torch_engine._train_step` (Transformer, multi-round MoE,
activation gradient clipping, Muon+AdamW, grad clipping) and `rungs.jaxjob.engine.JaxEngine.step_on`
(the same, compiled), from the same weights (torch state dict -> JAX params) on the same random
batch, interleaved, timed in process CPU seconds (one thread each: torch.set_num_threads(1), and
XLA:CPU's Eigen pool off and its executor pool made of one thread, see `_one_xla_thread`), medians. Also: the optimizer's share of the JAX step (the compiled
update alone) beside the PyTorch optimizer's (clip + step alone), and the CPU seconds to compile the step cold (empty persistent cache) and warm (a fresh
process reading the cache the cold one wrote).
Targets: JAX / PyTorch step time <= 1.0; optimizer <= 5% of the step; cold compile <= 30 s;
warm compile <= 5 s.

The measurement runs in child processes (`--child`), because XLA's thread flags and the cache
directory must be set before jax is imported.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import Report, main_for, random_token_batch, torch_train_step

# Only XLA flags here: a token that is not one ("intra_op_parallelism_threads=1" stood here) made XLA
# ignore the flags after it.
ONE_THREAD_XLA = "--xla_cpu_multi_thread_eigen=false"


def _one_xla_thread() -> None:
    """Start JAX's CPU client with a pool of one thread. Its executor and YNNPACK run a step's
    independent ops and loop partitions on a pool sized by the CPUs the process may use when the
    client starts (no flag sets it), so the process may use one CPU while it starts, and all of
    them again after: on 2 cores the JAX step had run on 2 threads (measured per thread from
    /proc: 0.44 s + 0.44 s a step) against PyTorch's one, and process time summed both."""
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})
    try:
        import jax

        jax.devices()
    finally:
        os.sched_setaffinity(0, allowed)


def _child(rung: int, repeats: int, cache: str, time_steps: bool) -> dict:
    # Both engines with freed host memory kept for reuse, as the `ladder` command and the sweep's
    # workers run them (rungs.host_memory): first, before any library starts a thread.
    from rungs.host_memory import keep_freed_host_memory

    host_memory_kept = keep_freed_host_memory()
    _one_xla_thread()
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    from ladder.plan.resolve import resolve_train_config
    from rungs.agc import ActivationGradClipper
    from rungs.config import parse_config
    from rungs.jaxjob.engine import JaxEngine
    from rungs.jaxjob.muon import narrow_products_native
    from rungs.jaxjob.params import from_torch_state_dict
    from rungs.jaxjob.train import enable_compilation_cache
    from rungs.model import Transformer
    from rungs.optim import build_optimizer

    enable_compilation_cache(Path(cache))
    torch.set_num_threads(1)
    cfg = parse_config(resolve_train_config("cpu-demo", rung, {"tracking_uri": None, "threads": 1}))
    torch.manual_seed(0)
    model = Transformer(cfg.architecture())
    optimizer = build_optimizer(model, lr=cfg.lr, weight_decay=cfg.weight_decay, adam_lr=cfg.adam_lr,
                                muon_momentum=cfg.muon_momentum, adjust_lr=cfg.adjust_lr)
    clipper = ActivationGradClipper(cfg.agc_settings())
    model.activation_clip = clipper
    engine = JaxEngine(cfg)
    initial = from_torch_state_dict(model.state_dict(), cfg.architecture())
    cpu0 = time.process_time()
    engine.init_state(*initial)
    # Compile time as process CPU seconds (one compiler thread): on a shared, loaded machine the wall
    # clock (the engine's own compile_seconds, also reported) counts the neighbours' time too.
    out = {"rung": rung, "compile_seconds": time.process_time() - cpu0, "compile_wall_seconds": engine.compile_seconds,
           "host_memory_kept": host_memory_kept,
           "jax_version": jax.__version__,
           "jax_newton_schulz": "native" if narrow_products_native() else "emulated",
           "batch_tokens": cfg.batch_tokens}
    if not time_steps:
        return out
    tokens = torch.randint(0, cfg.vocab_size, (cfg.batch_sequences, cfg.seq_len + 1))

    batch = random_token_batch(tokens)
    inputs, targets = (t.numpy().astype(np.int32) for t in (batch.inputs, batch.targets))

    def torch_step():
        torch_train_step(cfg, model, optimizer, batch, clipper)

    def jax_step():
        engine.step_on(0, inputs, targets)
        engine.drain_clip_events()

    grads = jax.tree.map(jnp.zeros_like, engine.params)

    def jax_update():
        engine.params, engine.opt_state, norm = engine._update(engine.params, engine.opt_state, grads)
        norm.block_until_ready()

    # The PyTorch optimizer alone (global-norm clip + Muon/AdamW step on fixed gradients), the
    # reference for the JAX update's share: the same work on the same shapes.
    def torch_update():
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip or float("inf"))
        optimizer.step()

    faults: dict[str, list[int]] = {"torch": [], "jax": []}

    def timed(fn, name=None):
        faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.process_time()
        fn()
        seconds = time.process_time() - t0
        if name is not None:  # pages the step touched for the first time (minor page faults)
            faults[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0)
        return seconds

    torch_step(), jax_step(), jax_update(), torch_update()
    samples: dict[str, list[float]] = {"torch": [], "jax": [], "update": [], "torch_update": []}
    for _ in range(repeats):
        samples["torch"].append(timed(torch_step, "torch"))
        samples["jax"].append(timed(jax_step, "jax"))
        samples["update"].append(timed(jax_update))
        samples["torch_update"].append(timed(torch_update))
    med = {k: sorted(v)[len(v) // 2] for k, v in samples.items()}
    return out | {"torch_step_seconds": med["torch"], "jax_step_seconds": med["jax"],
                  "jax_update_seconds": med["update"], "torch_update_seconds": med["torch_update"],
                  "torch_step_page_faults": sorted(faults["torch"])[repeats // 2],
                  "jax_step_page_faults": sorted(faults["jax"])[repeats // 2]}


def _spawn(rung: int, repeats: int, cache: str, time_steps: bool) -> dict:
    env = dict(os.environ, XLA_FLAGS=ONE_THREAD_XLA, JAX_PLATFORMS="cpu", OMP_NUM_THREADS="1")
    args = [sys.executable, "-m", "benchmarks.jax_step", "--child", str(rung), str(repeats), cache]
    if time_steps:
        args.append("--time-steps")
    proc = subprocess.run(args, env=env, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    if proc.returncode != 0:
        raise RuntimeError(f"benchmarks.jax_step child failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(quick: bool) -> Report:
    from ladder.plan.recipe import load_recipe

    report = Report("jax_step")
    rung = max(load_recipe("cpu-demo").ladder_rungs)
    with tempfile.TemporaryDirectory(prefix="jax-cache-") as cache:
        cold = _spawn(rung, 3 if quick else 10, cache, time_steps=True)
        warm = _spawn(rung, 0, cache, time_steps=False)
    ratio = cold["jax_step_seconds"] / cold["torch_step_seconds"]
    share = cold["jax_update_seconds"] / cold["jax_step_seconds"]
    report.results = {
        "rung": rung, "threads": 1, "clock": "process_time", "jax_version": cold["jax_version"],
        "jax_newton_schulz": cold["jax_newton_schulz"],
        "batch_tokens": cold["batch_tokens"], "torch_step_seconds": cold["torch_step_seconds"],
        "jax_step_seconds": cold["jax_step_seconds"], "jax_update_seconds": cold["jax_update_seconds"],
        "torch_update_seconds": cold["torch_update_seconds"],
        "jax_over_torch_step_time": ratio, "optimizer_share_of_jax_step": share,
        "optimizer_share_of_torch_step": cold["torch_update_seconds"] / cold["torch_step_seconds"],
        "jax_over_torch_update_time": cold["jax_update_seconds"] / cold["torch_update_seconds"],
        "host_memory_kept": cold["host_memory_kept"], "torch_step_page_faults": cold["torch_step_page_faults"],
        "jax_step_page_faults": cold["jax_step_page_faults"],
        "cold_compile_seconds": cold["compile_seconds"], "warm_compile_seconds": warm["compile_seconds"],
        "cold_compile_wall_seconds": cold["compile_wall_seconds"], "warm_compile_wall_seconds": warm["compile_wall_seconds"],
    }
    report.check("jax_over_torch_step_time", ratio, "<=", 1.0)
    report.check("optimizer_share_of_jax_step", share, "<=", 0.05)
    report.check("cold_compile_seconds", cold["compile_seconds"], "<=", 30.0)
    report.check("warm_compile_seconds", warm["compile_seconds"], "<=", 5.0)
    return report


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        p = argparse.ArgumentParser()
        p.add_argument("--child", type=int)
        p.add_argument("repeats", type=int)
        p.add_argument("cache")
        p.add_argument("--time-steps", action="store_true")
        a = p.parse_args()
        sys.stdout.write(json.dumps(_child(a.child, a.repeats, a.cache, a.time_steps)) + "\n")
        sys.exit(0)
    sys.exit(main_for("jax_step", run))
