"""The JAX training step against the PyTorch one on a GPU, in bf16, at mai-base-2's L18 widths: JAX
tokens/s >= 0.9x the PyTorch job's at the same rung, and the routed experts' grouped-matmul
candidates timed at L18's expert shapes.

Both steps are the engines' own, on one resolved training config: `rungs.torch_engine._train_step`
(the Transformer under bf16 autocast, multi-round MoE with grouped matmuls, activation gradient
clipping, global-norm clipping, Muon + AdamW) and `rungs.jaxjob.engine.JaxEngine.step_on` (the same,
compiled: bf16 matmuls with fp32 master weights, cuDNN attention where it lowers). The config is
L18 of mai-base-2 (`ladder plan mai-base-2 --rungs 18`: d_model 1536, 512 latent experts, top-7,
seq 4096, vocab 131,072) with `--layers` of its 18 layers (default 2, ~2.2B parameters) and
`--batch-sequences` sequences a step, `precision: bf16`. Each engine draws its own initial weights
(same rules) and trains on the same random tokens.

Three child processes, one after the other, so each has the whole device (XLA preallocates most
of it):
1. "gmm": the routed experts' forward and backward (`moe.local_routed_experts`: dispatch, the
   rounds, three grouped projections each way) on one layer's rows of the step (batch tokens x
   top-k), uniform routing, for each grouped-matmul candidate (`--candidates`, default
   blocks, pallas, ragged: `rungs.jaxjob.moe.BACKENDS`): XLA's memory analysis of the compiled
   program, the seconds of a call (median of 10 after 2), TFLOP/s of its 18 pairs x latent x hidden
   useful FLOPs, and its largest relative difference from the first candidate. A candidate whose
   program needs more than the device holds is not run (its figures say why).
2. "torch" and 3. "jax": warm-up steps (compiling, creating optimizer state), then `--steps` timed
   steps; every step ends with the engine's own host read of its statistics, so the wall clock
   sees finished device work. The JAX engine runs the candidate `--moe-backend` names, by default
   ("auto") the fastest candidate of child 1 within 2e-2 of the first.

Reported: tokens/s of each engine, their ratio (the check), JAX's compile seconds and the memory
analysis of its two programs, the peak device memory of each, both frameworks' versions, the
candidates' table. A child that fails reports the phase it was in (set-up, compiling which
program, which step), the error, and the memory analysis it had; a child killed or timed out,
the last phase it announced. Without a GPU in torch, or without a CUDA jaxlib in JAX, the full mode
reports `ran: false` and why. `--quick` runs the same three children on the CPU at reduced widths
(`benchmarks.gpu_rung.QUICK_WIDTHS`), bf16 too: the contract and the code path, not the numbers (its
test: tests/benchmarks). The command for the project's GPU image: docs/performance/jax.md.
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
CANDIDATES = ("blocks", "pallas", "ragged")
CANDIDATE_TOLERANCE = 2e-2   # bf16 products summed in different orders: a wrong kernel is off by O(1)
_PHASE = "phase: "           # a child's progress lines on stderr, so a killed child still says where it was


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


def _jax_stepper(cfg: Any, moe_backend: str | None, report: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    import jax
    import numpy as np

    from rungs.jaxjob.engine import JaxEngine
    from rungs.jaxjob.params import init_buffers, init_params

    engine = JaxEngine(cfg, moe_backend=moe_backend)
    report["engine"] = engine                    # for the failure report: its phase and memory analysis
    arch = cfg.architecture()
    _announce("set-up: initial parameters")
    params, buffers = init_params(arch, jax.random.PRNGKey(cfg.seed)), init_buffers(arch)
    _announce("compile: both programs")
    engine.init_state(params, buffers)
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
            "compute_dtype": str(np.dtype(engine.compute_dtype)), "moe_backend": moe_backend or "default",
            "memory_analysis": _memory(engine)}
    return SimpleNamespace(step=step, peak=peak), info


def _memory(engine: Any) -> dict[str, Any]:
    return {name: figures.as_dict() for name, figures in getattr(engine, "memory", {}).items()}


def _announce(phase: str) -> None:
    sys.stderr.write(f"{_PHASE}{phase}\n")
    sys.stderr.flush()


def _child(engine: str, config_path: str, warmup: int, steps: int, moe_backend: str | None = None) -> dict[str, Any]:
    """Build one engine, step it `warmup` times, then time `steps` steps (wall clock). On an error:
    {"failed": ..., "phase", "error", "memory_analysis"} (the JAX engine's phase and figures)."""
    from rungs.config import parse_config

    cfg = parse_config(json.loads(Path(config_path).read_text()))
    state: dict[str, Any] = {}
    phase = "set-up"
    try:
        t0 = time.perf_counter()
        if engine == "torch":
            stepper, info = _torch_stepper(cfg)
        else:
            stepper, info = _jax_stepper(cfg, moe_backend, state)
        info["setup_seconds"] = time.perf_counter() - t0
        for i in range(warmup):
            phase = f"warm-up step {i}"
            _announce(phase)
            loss = stepper.step()
        phase = "timed steps"
        _announce(phase)
        start = time.perf_counter()
        for _ in range(steps):
            loss = stepper.step()
        elapsed = time.perf_counter() - start
    except Exception as e:  # the report must say where and what, not only that the child failed
        jax_engine = state.get("engine")
        where = f"{phase} ({jax_engine.phase})" if jax_engine is not None else phase
        return {"failed": f"{where}: {type(e).__name__}", "phase": where,
                "error": f"{type(e).__name__}: {str(e)[-2000:]}",
                "memory_analysis": _memory(jax_engine) if jax_engine is not None else {}}
    return info | {"steps": steps, "seconds": elapsed, "seconds_per_step": elapsed / steps,
                   "tokens_per_second": cfg.batch_tokens * steps / elapsed, "last_loss": loss,
                   "peak_device_bytes": stepper.peak()}


def _candidates_child(config_path: str, candidates: list[str], repeats: int = 10) -> dict[str, Any]:
    """Time the routed experts' forward + backward for each grouped-matmul candidate (module docstring)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from benchmarks.hlo_buffers import largest_buffers
    from rungs.config import parse_config
    from rungs.jaxjob.moe import dispatch_for, local_routed_experts
    from rungs.jaxjob.programs import memory_figures

    cfg = parse_config(json.loads(Path(config_path).read_text()))
    n, k, E = cfg.batch_sequences * cfg.seq_len, cfg.top_k, cfg.n_experts
    latent, hidden = cfg.latent_dim or cfg.d_model, cfg.expert_hidden
    keys = jax.random.split(jax.random.PRNGKey(0), 6)
    idx = jax.lax.top_k(jax.random.uniform(keys[0], (n, E)), k)[1].astype(jnp.int32)   # uniform, distinct
    x = jax.random.normal(keys[1], (n, latent), jnp.bfloat16)
    gate = jax.nn.softmax(jax.random.normal(keys[2], (n, k)), -1).astype(jnp.bfloat16)
    up = jax.random.normal(keys[3], (n, latent), jnp.bfloat16)
    w_in = [0.02 * jax.random.normal(keys[4 + i], (E, hidden, latent), jnp.float32) for i in range(2)]
    w_down = 0.02 * jax.random.normal(keys[5], (E, latent, hidden), jnp.float32)
    useful_flops = 18.0 * n * k * latent * hidden          # 3 projections, forward and two backward products
    device_bytes = (jax.devices()[0].memory_stats() or {}).get("bytes_limit")
    out: dict[str, Any] = {"rows": n * k, "n_experts": E, "latent": latent, "hidden": hidden,
                           "device_bytes": device_bytes, "candidates": {}}
    first = None
    for name in candidates:
        _announce(f"candidate {name}: compile")
        d = dispatch_for(n, k, E, capacity_per_expert=cfg.capacity_per_expert, group_size=cfg.group_size,
                         backend=name)

        def loss(x, gate, wg, wu, wd, d=d):
            return (local_routed_experts(d, x, gate, idx, wg, wu, wd).astype(jnp.float32) * up).sum()
        row: dict[str, Any] = {}
        out["candidates"][name] = row
        try:
            compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4))).lower(
                x, gate, *w_in, w_down).compile()
            row["memory_analysis"] = memory_figures(compiled).as_dict()
            row["largest_buffers"] = largest_buffers(compiled.as_text())
            if device_bytes and row["memory_analysis"]["total_bytes"] > device_bytes:
                row["skipped"] = f"needs {row['memory_analysis']['total_bytes'] / 1e9:.1f} GB, the device holds " \
                                 f"{device_bytes / 1e9:.1f}"
                continue
            _announce(f"candidate {name}: run")
            args = (x, gate, *w_in, w_down)
            result = jax.block_until_ready(compiled(*args))
            times = []
            for _ in range(repeats + 2):
                t0 = time.perf_counter()
                jax.block_until_ready(compiled(*args))
                times.append(time.perf_counter() - t0)
            seconds = float(np.median(times[2:]))
        except Exception as e:
            row["failed"] = f"{type(e).__name__}: {str(e)[-1500:]}"
            continue
        flat = [np.asarray(a, np.float32) for a in jax.tree.leaves(result)]
        if first is None:
            first, row["max_relative_difference"] = flat, 0.0
        else:
            row["max_relative_difference"] = max(float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))
                                                 for a, b in zip(flat, first))
        row |= {"seconds": seconds, "tflops": useful_flops / seconds / 1e12}
    return out


def best_candidate(table: dict[str, Any]) -> str | None:
    """The fastest candidate that ran and agrees with the first within CANDIDATE_TOLERANCE."""
    ok = {name: row["seconds"] for name, row in table.get("candidates", {}).items()
          if "seconds" in row and row["max_relative_difference"] <= CANDIDATE_TOLERANCE}
    return min(ok, key=ok.__getitem__) if ok else None


MIN_CHILD_SECONDS = 30.0  # the least a child is started with (a JAX child compiles for ~10-20 s first)


def _spawn(args: list[str], timeout_s: float, *, jax_child: bool) -> dict:
    env = dict(os.environ)
    if jax_child:
        env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")   # the device is this child's alone
    command = [sys.executable, "-m", "benchmarks.jax_gpu_rung", "--child", *args]
    try:
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s,
                              cwd=Path(__file__).resolve().parents[1])
    except subprocess.TimeoutExpired as e:
        stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return {"failed": f"timed out after {timeout_s:g} s", "phase": _last_phase(stderr)}
    lines = proc.stdout.strip().splitlines()
    try:
        got = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        got = None
    if proc.returncode != 0 or got is None:
        failed = got if isinstance(got, dict) and "failed" in got else {"failed": f"exit {proc.returncode}"}
        return failed | {"phase": failed.get("phase") or _last_phase(proc.stderr), "stderr_tail": proc.stderr[-3000:]}
    return got


def _last_phase(stderr: str) -> str | None:
    phases = [line[len(_PHASE):] for line in stderr.splitlines() if line.startswith(_PHASE)]
    return phases[-1] if phases else None


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
        steps: int | None = None, timeout_s: float = 240.0, candidates: tuple[str, ...] = CANDIDATES,
        moe_backend: str = "auto", max_seconds: float = 480.0) -> Report:
    """`timeout_s`: each child's limit; `max_seconds`: all of them together, so the whole run fits a fixed
    device slot (gpu_suite kills it a little past its share): a child gets what is left less
    MIN_CHILD_SECONDS for each child after it, and is skipped, said in its entry, when that is under
    MIN_CHILD_SECONDS."""
    report = Report("jax_gpu_rung")
    deadline = time.monotonic() + max_seconds

    def spawn(args: list[str], *, jax_child: bool, children_after: int) -> dict:
        left = deadline - time.monotonic() - MIN_CHILD_SECONDS * children_after
        if left < MIN_CHILD_SECONDS:
            return {"failed": f"skipped: {max(left, 0.0):.0f} s of --max-seconds {max_seconds:g} left for it "
                              f"(under {MIN_CHILD_SECONDS:g} s)"}
        return _spawn(args, min(timeout_s, left), jax_child=jax_child)
    layers = 2 if layers is None else layers
    batch_sequences = (2 if quick else 8) if batch_sequences is None else batch_sequences
    steps = (3 if quick else 20) if steps is None else steps
    if min(layers, batch_sequences, steps) < 1 or warmup < 0 or layers > RUNG:
        raise ValueError(f"need 1 <= layers <= {RUNG}, batch_sequences and steps >= 1, warmup >= 0; got "
                         f"layers={layers}, batch_sequences={batch_sequences}, steps={steps}, warmup={warmup}")
    if set(candidates) - set(CANDIDATES) or moe_backend not in ("auto", *CANDIDATES):
        raise ValueError(f"candidates must be among {CANDIDATES} and moe_backend 'auto' or one of them; got "
                         f"candidates={list(candidates)}, moe_backend={moe_backend!r}")
    if not quick:
        reason = gpu_missing()
        if reason is not None:
            report.results = {"ran": False, "reason": reason}
            return report
        report.device = "cuda"  # the reference matmul, timed after the children, on the GPU (never the host CPU)
    config = train_config(quick, layers, batch_sequences)
    results: dict[str, Any] = {"ran": True, "quick": quick, "recipe": RECIPE, "rung": RUNG, "layers": layers,
                               "batch_sequences": batch_sequences, "seq_len": config["seq_len"],
                               "batch_tokens": batch_sequences * config["seq_len"], "precision": "bf16"}
    with tempfile.TemporaryDirectory(prefix="jax-gpu-rung-") as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(json.dumps(config))
        table: dict[str, Any] = {}
        if candidates:
            table = spawn(["gmm", str(path), ",".join(candidates)], jax_child=True, children_after=2)
            results["grouped_matmul"] = table
        chosen = best_candidate(table) if moe_backend == "auto" else moe_backend
        results["jax_moe_backend"] = chosen or "default"
        got = {"torch": spawn(["torch", str(path), str(warmup), str(steps)], jax_child=False, children_after=1)}
        got["jax"] = spawn(["jax", str(path), str(warmup), str(steps), chosen or "default"], jax_child=True,
                           children_after=0)
    results |= {"torch": got["torch"], "jax": got["jax"]}
    failed = {e: got[e]["failed"] for e in ENGINES if "failed" in got[e]}
    if "failed" in table:
        failed["grouped_matmul"] = table["failed"]
    if failed:
        results["failed"] = failed
    if not {"torch", "jax"} & set(failed):
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
                   help="seconds each child may take, set-up and compile included (default 240)")
    p.add_argument("--max-seconds", type=float, default=480.0,
                   help="seconds for all children together (default 480; each gets what is left, >= 30)")
    p.add_argument("--candidates", default=",".join(CANDIDATES),
                   help=f"grouped-matmul candidates to time, comma-separated (default {','.join(CANDIDATES)}; "
                        "empty: none)")
    p.add_argument("--moe-backend", default="auto",
                   help="the JAX engine's routed-experts path: auto (the fastest candidate) or one of "
                        f"{', '.join(CANDIDATES)}")
    a = p.parse_args(argv)
    try:
        report = run(a.quick, layers=a.layers, batch_sequences=a.batch_sequences, steps=a.steps,
                     timeout_s=a.child_timeout, candidates=tuple(filter(None, a.candidates.split(","))),
                     moe_backend=a.moe_backend, max_seconds=a.max_seconds)
    except ValueError as e:
        sys.stderr.write(f"jax_gpu_rung: {e}\n")
        return 2
    print_report(report, quick=a.quick, as_json=a.json)
    if not a.json and ("failed" in report.results or not report.results.get("ran", True)):
        sys.stdout.write(json.dumps(report.results, indent=2, default=str) + "\n")
    return 1 if "failed" in report.results else 0


def _child_main(args: list[str]) -> int:
    kind = args[0]
    if kind == "gmm":
        got = _candidates_child(args[1], list(filter(None, args[2].split(","))))
    else:
        config_path, warmup, steps = args[1:4]
        backend = args[4] if len(args) > 4 and args[4] != "default" else None
        got = _child(kind, config_path, int(warmup), int(steps), backend)
    sys.stdout.write(json.dumps(got, default=str) + "\n")
    return 1 if "failed" in got else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.exit(_child_main(sys.argv[2:]))
    sys.exit(main())
