"""The JAX training step against the PyTorch one on a GPU, in bf16, at mai-base-2's L18 widths (#19's
GPU half: JAX tokens/s >= 0.9x the PyTorch job's at the same rung).

Both steps are the engines' own, on one resolved training config: `rungs.torch_engine._train_step`
(the Transformer under bf16 autocast, multi-round MoE with grouped matmuls, activation gradient
clipping, global-norm clipping, Muon + AdamW) and `rungs.jaxjob.engine.JaxEngine.step_on` (the same,
compiled: bf16 matmuls with fp32 master weights, `ragged_dot` experts and cuDNN attention where they
lower). The config is L18 of mai-base-2 (`ladder plan mai-base-2 --rungs 18`: d_model 1536, 512
latent experts, top-7, seq 4096, vocab 131,072) with `--layers` of its 18 layers (default 2, ~2.2B
parameters: both engines' fp32 state fits one 80-GB device) and `--batch-sequences` sequences a
step, `precision: bf16`. Each engine draws its own initial weights (same rules) and trains on the
same random tokens.

Each engine runs in a child process of its own, one after the other, so each has the whole device
(XLA preallocates most of it). Per engine: warm-up steps (compiling, creating optimizer state), then
`--steps` timed steps; every step ends with the engine's own host read of its
statistics, so the wall clock sees finished device work. Reported: tokens/s of each, their ratio
(the check), JAX's compile seconds, the peak device memory of each, both frameworks' versions.
Without a GPU in torch, or without a CUDA jaxlib in JAX, the full mode reports `ran: false` and why.
`--quick` runs the same two children on the CPU at reduced widths (`benchmarks.gpu_rung.QUICK_WIDTHS`),
bf16 too: the contract and the code path, not the numbers (its test: tests/benchmarks).

On the project's GPU machine (an image with torch, jax[cuda], optax, orbax, but not the project's
other needs), see docs/performance/jax.md for the one prepared command.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from benchmarks.common import Report, print_report, random_token_batch, torch_train_step

RECIPE, RUNG = "mai-base-2", 18
RATIO_TARGET = 0.9
ENGINES = ("torch", "jax")


def train_config(quick: bool, layers: int, batch_sequences: int) -> dict[str, Any]:
    """The resolved training config both engines step (a JSON-able dict)."""
    from benchmarks.gpu_rung import QUICK_WIDTHS
    from ladder.plan.resolve import resolve_train_config

    overrides: dict[str, Any] = dict(QUICK_WIDTHS) if quick else {}
    overrides |= {"n_layers": layers, "batch_sequences": batch_sequences, "micro_batch_sequences": None,
                  "precision": "bf16", "tracking_uri": None, "threads": 1 if quick else None}
    return resolve_train_config(RECIPE, RUNG, overrides)


def _tokens(cfg: Any):
    import numpy as np

    rng = np.random.default_rng(0)
    return rng.integers(0, cfg.vocab_size, (cfg.batch_sequences, cfg.seq_len + 1), dtype=np.int64)


def _torch_stepper(cfg: Any) -> tuple[Any, dict[str, Any]]:
    import torch

    from benchmarks.gpu_rung import build_model
    from rungs.agc import ActivationGradClipper
    from rungs.optim import build_optimizer

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        torch.set_num_threads(1)
    model = build_model(cfg.architecture(), device)       # the init policy, drawn on the device
    optimizer = build_optimizer(model, lr=cfg.lr, weight_decay=cfg.weight_decay, adam_lr=cfg.adam_lr,
                                muon_momentum=cfg.muon_momentum, adjust_lr=cfg.adjust_lr)
    clipper = ActivationGradClipper(cfg.agc_settings()) if cfg.agc else None
    model.activation_clip = clipper
    batch = random_token_batch(torch.from_numpy(_tokens(cfg)))

    def step() -> float:
        return torch_train_step(cfg, model, optimizer, batch, clipper)["loss"]

    def peak() -> int | None:
        return int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    info = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch_version": torch.__version__}
    return SimpleNamespace(step=step, peak=peak), info


def _jax_stepper(cfg: Any) -> tuple[Any, dict[str, Any]]:
    import jax
    import numpy as np

    from rungs.jaxjob.engine import JaxEngine
    from rungs.jaxjob.params import init_buffers, init_params

    engine = JaxEngine(cfg)
    arch = cfg.architecture()
    engine.init_state(init_params(arch, jax.random.PRNGKey(cfg.seed)), init_buffers(arch))
    tokens = _tokens(cfg).astype(np.int32)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def step() -> float:
        out = engine.step_on(0, inputs, targets)
        engine.drain_clip_events()
        return out["loss"]

    def peak() -> int | None:
        stats = jax.devices()[0].memory_stats() or {}
        return int(stats["peak_bytes_in_use"]) if "peak_bytes_in_use" in stats else None

    info = {"device": str(jax.devices()[0].device_kind), "jax_version": jax.__version__,
            "jax_platform": jax.default_backend(), "compile_seconds": engine.compile_seconds,
            "compute_dtype": str(np.dtype(engine.compute_dtype))}
    return SimpleNamespace(step=step, peak=peak), info


def _child(engine: str, config_path: str, warmup: int, steps: int) -> dict[str, Any]:
    """Build one engine, step it `warmup` times, then time `steps` steps (wall clock)."""
    from rungs.config import parse_config

    cfg = parse_config(json.loads(Path(config_path).read_text()))
    t0 = time.perf_counter()
    stepper, info = (_torch_stepper if engine == "torch" else _jax_stepper)(cfg)
    info["setup_seconds"] = time.perf_counter() - t0
    for _ in range(warmup):
        loss = stepper.step()
    start = time.perf_counter()
    for _ in range(steps):
        loss = stepper.step()
    elapsed = time.perf_counter() - start
    return info | {"steps": steps, "seconds": elapsed, "seconds_per_step": elapsed / steps,
                   "tokens_per_second": cfg.batch_tokens * steps / elapsed, "last_loss": loss,
                   "peak_device_bytes": stepper.peak()}


def _spawn(engine: str, config_path: str, warmup: int, steps: int, timeout_s: float) -> dict:
    env = dict(os.environ)
    if engine == "jax":
        env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")   # the device is this child's alone
    args = [sys.executable, "-m", "benchmarks.jax_gpu_rung", "--child", engine, config_path,
            str(warmup), str(steps)]
    try:
        proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout_s,
                              cwd=Path(__file__).resolve().parents[1])
    except subprocess.TimeoutExpired:
        return {"failed": f"timed out after {timeout_s:g} s"}
    if proc.returncode != 0:
        return {"failed": f"exit {proc.returncode}", "stderr_tail": proc.stderr[-3000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def gpu_missing() -> str | None:
    """Why the full mode cannot run here (None: torch sees a CUDA device and JAX a GPU backend).
    Asked in a child: a JAX that found a GPU would hold most of its memory in this process."""
    code = ("import json, torch, jax\n"
            "try:\n    gpus = len(jax.devices('gpu'))\nexcept Exception:\n    gpus = 0\n"
            "print(json.dumps({'cuda': torch.cuda.is_available(), 'jax_gpus': gpus, 'jax': jax.__version__}))")
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        return f"probing torch and jax failed: {proc.stderr[-500:]}"
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    if not seen["cuda"]:
        return "no CUDA device in torch: run `python -m benchmarks.jax_gpu_rung --json` on a GPU machine"
    if not seen["jax_gpus"]:
        return f"torch sees a GPU but jax {seen['jax']} has no GPU backend (no CUDA jaxlib/plugin installed)"
    return None


def run(quick: bool, *, layers: int | None = None, batch_sequences: int | None = None, warmup: int = 2,
        steps: int | None = None, timeout_s: float = 240.0) -> Report:
    report = Report("jax_gpu_rung")
    layers = 2 if layers is None else layers
    batch_sequences = (2 if quick else 8) if batch_sequences is None else batch_sequences
    steps = (3 if quick else 20) if steps is None else steps
    if min(layers, batch_sequences, steps) < 1 or warmup < 0 or layers > RUNG:
        raise ValueError(f"need 1 <= layers <= {RUNG}, batch_sequences and steps >= 1, warmup >= 0; got "
                         f"layers={layers}, batch_sequences={batch_sequences}, steps={steps}, warmup={warmup}")
    if not quick:
        reason = gpu_missing()
        if reason is not None:
            report.results = {"ran": False, "reason": reason}
            return report
    config = train_config(quick, layers, batch_sequences)
    with tempfile.TemporaryDirectory(prefix="jax-gpu-rung-") as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(json.dumps(config))
        got = {engine: _spawn(engine, str(path), warmup, steps, timeout_s) for engine in ENGINES}
    results: dict[str, Any] = {"ran": True, "quick": quick, "recipe": RECIPE, "rung": RUNG, "layers": layers,
                               "batch_sequences": batch_sequences, "seq_len": config["seq_len"],
                               "batch_tokens": batch_sequences * config["seq_len"], "precision": "bf16",
                               "torch": got["torch"], "jax": got["jax"]}
    failed = {e: got[e]["failed"] for e in ENGINES if "failed" in got[e]}
    if failed:
        results["failed"] = failed
    else:
        ratio = got["jax"]["tokens_per_second"] / got["torch"]["tokens_per_second"]
        results["jax_over_torch_tokens_per_second"] = ratio
        report.check("jax_over_torch_tokens_per_second", ratio, ">=", RATIO_TARGET)
    report.results = results
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.jax_gpu_rung", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="reduced widths on the CPU (the contract, not the numbers)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--layers", type=int, help="how many of L18's layers (default 2)")
    p.add_argument("--batch-sequences", type=int, help="sequences a step (default 8 on a GPU, 2 quick)")
    p.add_argument("--steps", type=int, help="timed steps per engine (default 20 on a GPU, 3 quick)")
    p.add_argument("--child-timeout", type=float, default=240.0,
                   help="seconds each engine's child may take, set-up and compile included (default 240)")
    a = p.parse_args(argv)
    report = run(a.quick, layers=a.layers, batch_sequences=a.batch_sequences, steps=a.steps,
                 timeout_s=a.child_timeout)
    print_report(report, quick=a.quick, as_json=a.json)
    if not a.json and ("failed" in report.results or not report.results.get("ran", True)):
        sys.stdout.write(json.dumps(report.results, indent=2, default=str) + "\n")
    return 1 if "failed" in report.results else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        engine, config_path, warmup, steps = sys.argv[2:6]
        sys.stdout.write(json.dumps(_child(engine, config_path, int(warmup), int(steps))) + "\n")
        sys.exit(0)
    sys.exit(main())
