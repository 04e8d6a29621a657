"""The JAX engine (`rungs.engine.Engine`): the rung in JAX + optax under the one training loop.

Everything except the arithmetic is shared with the PyTorch engine: the prepared corpus, the
source-scaled sampler (the same token stream, batch for batch), `rungs.evaluation.score_domains`,
the unigram baseline, the clip-event records. The arithmetic is `rungs.jaxjob`'s: the model
(`model.loss`), Muon + AdamW by role (`optim.build_optimizer`), activation gradient clipping
(`agc.AGC` + `agc.ClipRecorder`), global grad-norm clipping (`optim.clip_by_global_norm`).

One step, as `rungs.torch_engine._train_step`: per micro-batch one compiled forward+backward
(gradients of (ce + aux) / n_micro summed over micro-batches), then one compiled update: clip
the global norm, Muon/AdamW at the loop's LR multiplier. The LR and WD are traced optimizer
hyperparameters (`optim.with_hyperparams`), set each step to multiplier x the configured rates,
so the schedule is the loop's and nothing recompiles. Both functions are compiled ahead of time
in `build()` and the seconds that took are reported apart (tag `jax_compile_seconds`), so the
first step's tokens/s is not a compile time. With a `mesh` (`rungs.jaxjob.sharding`) parameters,
optimizer state and batches are sharded over its (data, expert) axes.

Several processes (`rungs.jaxjob.distributed`): the mesh spans every process's devices and each
process runs this same engine (multi-controller JAX): the same sampler stream, the same host
batches put on the global mesh, the same calls in the same order. A process can read only its own
devices' shards, so every value the host reads (losses, router counts, the AGC readout, eval
logits) goes through `_host`, which gathers an array that spans other processes first; every
process then holds the same numbers, which the loop's divergence rule and evaluation rely on.
`rank` is `jax.process_index()`: process 0 alone writes files and tracks.
"""

from __future__ import annotations

import logging
import os
import random
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding

from rungs.agc import event_record
from rungs.checkpoint import refuse_other_engines_checkpoint, remove_checkpoint
from rungs.config import TrainConfig, TrainConfigError
from rungs.data.corpus import PreparedCorpus
from rungs.data.prepare import ensure_prepared
from rungs.data.sampler import SourceScaledSampler
from rungs.evaluation import DomainScore, score_domains, unigram_bpb
from rungs.jaxjob import checkpoint as jax_ckpt
from rungs.jaxjob import model as jmodel
from rungs.jaxjob import sharding
from rungs.jaxjob.agc import AGC, ClipRecorder
from rungs.jaxjob.moe import BACKENDS
from rungs.jaxjob.optim import Schedule, build_optimizer, with_hyperparams
from rungs.jaxjob.programs import MemoryFigures, grads_function, memory_figures, update_function
from rungs.jaxjob.params import init_buffers, init_params
from rungs.metrics import DevicePeak, device_peak
from rungs.torch_engine import muon_update_scale

log = logging.getLogger(__name__)

# The loop hands the engine the schedule's multiplier each step; the optimizer's own schedule is
# flat at 1 (cosine with min_lr_ratio 1) and the multiplier enters through the traced LR.
FLAT_SCHEDULE = Schedule(total_steps=1, warmup_steps=0, schedule="cosine", min_lr_ratio=1.0)


# XLA's flag that makes its GPU programs reproducible (scatter-adds and reductions without atomics); read
# from XLA_FLAGS when the backend starts, so a job cannot turn it on itself once JAX is running.
DETERMINISTIC_GPU_FLAG = "--xla_gpu_deterministic_ops=true"


def jax_device() -> str:
    """The device type the JAX job runs on, "cuda" or "cpu": JAX's default backend (not torch's)."""
    return "cuda" if jax.default_backend() in ("gpu", "cuda") else "cpu"


def xla_cpu_cores() -> int:
    """The cores XLA's CPU thread pool spreads over: every core this process may run on. `threads` is
    torch's intra-op setting; XLA sizes its own pool when the backend starts."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def check_config(cfg: TrainConfig) -> None:
    """Refuse, naming the field, a config the JAX job cannot train as written: called before the job
    touches its run directory, so a bad setting is one line, not a traceback from the first compile.

    `device` is JAX's platform, fixed when its backend starts: a config that names the other one is
    refused rather than run where it did not ask (a `cuda` job silently on the CPU, in emulated bf16).
    `deterministic` on a GPU needs XLA's deterministic-ops flag in XLA_FLAGS before JAX starts."""
    if cfg.dropout:
        raise TrainConfigError(f"the JAX job has no dropout, got {cfg.dropout} (set dropout=0, or backend=torch)",
                               key="dropout")
    device = jax_device()
    if cfg.device not in ("auto", device):
        how = ("set JAX_PLATFORMS=cpu in the job's environment" if cfg.device == "cpu"
               else "install JAX with its CUDA plugin (jax[cuda12])")
        raise TrainConfigError(f"device={cfg.device}, but JAX runs on {jax.default_backend()} here: {how}, or set "
                               "device=auto (JAX's default platform)", key="device")
    if cfg.deterministic and device == "cuda" and DETERMINISTIC_GPU_FLAG not in os.environ.get("XLA_FLAGS", ""):
        raise TrainConfigError(f"deterministic=true on a GPU needs XLA_FLAGS={DETERMINISTIC_GPU_FLAG} in the job's "
                               "environment before JAX starts (or deterministic=false)", key="deterministic")


class JaxEngine:
    """The JAX job on a mesh of devices, this process's or several processes' (`rungs.engine.Engine`).

    `mesh`: a (data, expert) `jax.sharding.Mesh` (None: one device). `ns_dtype`: Muon's
    Newton-Schulz dtype (bf16 as rungs.muon; fp32 for parity tests against a fp32 torch Muon).
    `initial_params`: (params, buffers) to start from instead of a fresh init (e.g. a torch state
    dict converted with `rungs.jaxjob.params.from_torch_state_dict`). `moe_backend`: the routed
    experts' grouped-matmul path (`rungs.jaxjob.moe.BACKENDS`; None: the platform's default).
    `phase` names what the engine is doing (set-up, compiling which program, stepping), so a
    failure can say where it happened; `memory` holds XLA's memory analysis of each compiled program.
    """

    def __init__(self, cfg: TrainConfig, *, mesh: Any = None, ns_dtype: Any = jnp.bfloat16,
                 initial_params: tuple[dict, dict] | None = None, moe_backend: str | None = None) -> None:
        if moe_backend is not None and moe_backend not in BACKENDS:
            raise ValueError(f"moe_backend must be one of {BACKENDS} or None, got {moe_backend!r}")
        check_config(cfg)
        self.cfg = cfg
        self.moe_backend = moe_backend
        self.phase = "set-up"
        self.memory: dict[str, MemoryFigures] = {}
        self.mesh = mesh
        self.rank = jax.process_index()
        self.processes = jax.process_count()
        # devices, not processes: the loop's MFU multiplies one device's peak by `world`
        self.world = 1 if mesh is None else int(mesh.devices.size)
        if self.processes > 1 and mesh is None:
            raise ValueError(f"a job of {self.processes} processes needs a mesh over their devices")
        self.ns_dtype = ns_dtype
        # The MFU denominator's cores on the CPU: the ones XLA's pool uses (it does not read `threads`)
        self.cpu_cores = xla_cpu_cores()
        if cfg.threads and cfg.threads != self.cpu_cores and jax_device() == "cpu":
            log.info("threads=%d is torch's setting: XLA's CPU pool uses the %d cores this process may run on",
                     cfg.threads, self.cpu_cores)
        self.initial_params = initial_params
        self.compile_seconds = 0.0
        self.recorder: ClipRecorder | None = None

    # --- set-up -----------------------------------------------------------------------------
    def tags(self) -> dict[str, str]:
        return {"backend": "jax", "jax_version": jax.__version__, "jax_platform": jax.default_backend(),
                "jax_compile_seconds": f"{self.compile_seconds:.2f}",
                "muon_update_scale": muon_update_scale(self.cfg, None)} | (
            # dp/ep only on a mesh, as only the sharded PyTorch job tags them: one schema per kind of job
            sharding.describe(self.mesh) | {"workers": str(self.processes)} if self.mesh is not None else {})

    def discard_checkpoint(self, run_dir: Path) -> None:
        remove_checkpoint(run_dir)  # every engine's: a fresh start leaves none to refuse a resume

    def build(self) -> None:
        cfg = self.cfg
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.arch = cfg.architecture()
        self.corpus = PreparedCorpus.open(ensure_prepared(cfg.data_manifest, vocab_size=cfg.vocab_size,
                                                          cache_root=Path(cfg.data_cache_root)))
        self.sampler = SourceScaledSampler(self.corpus, cfg.sources_plan(), seq_len=cfg.seq_len,
                                           batch_sequences=cfg.batch_sequences, seed=cfg.order_seed, subset=cfg.subset,
                                           order=cfg.data_order)
        self.decode = self.corpus.tokenizer.decode
        if self.initial_params is not None:
            params, buffers = self.initial_params
        else:
            params, buffers = init_params(self.arch, jax.random.PRNGKey(cfg.seed)), init_buffers(self.arch)
        self.init_state(params, buffers)

    def init_state(self, params: dict, buffers: dict) -> None:
        """Place (params, buffers), build the optimizer and the clipper, compile the step (no data)."""
        cfg = self.cfg
        self.arch = cfg.architecture()
        params = {n: jnp.asarray(p, jnp.float32) for n, p in params.items()}
        buffers = {n: jnp.asarray(b, jnp.float32) for n, b in buffers.items()}
        if self.mesh is not None:
            params = sharding.shard_params(params, self.mesh)
            buffers = jax.device_put(buffers, sharding.replicated(self.mesh))
        self.tx = build_optimizer(params, lr=cfg.lr, weight_decay=cfg.weight_decay, schedule=FLAT_SCHEDULE,
                                  adam_lr=cfg.adam_lr, adam_betas=(cfg.adam_beta1, cfg.adam_beta2),
                                  muon_momentum=cfg.muon_momentum, adjust_lr=cfg.adjust_lr, ns_dtype=self.ns_dtype)
        self.params, self.buffers = params, buffers
        self.opt_state = jax.jit(self.tx.init)(params)
        settings = cfg.agc_settings()
        self.agc = AGC(settings) if settings else None
        self.recorder = ClipRecorder(settings) if settings else None
        # precision=auto: bf16 on a GPU, fp32 on the CPU, as the torch job does on the device it runs on
        self.compute_dtype = jnp.bfloat16 if cfg.bf16_on(jax_device()) else jnp.float32
        t0 = time.perf_counter()
        with sharding.use_mesh(self.mesh):  # traced on the mesh: expert parallelism, distributed Muon
            self._compile()
        self.compile_seconds = time.perf_counter() - t0
        log.info("JAX step compiled in %.1fs (%s, %d device(s))", self.compile_seconds, jax.default_backend(),
                 self.world)

    def _batch_put(self, array: np.ndarray) -> jax.Array:
        if self.mesh is None:
            return jnp.asarray(array)
        return self._put(array, sharding.batch_sharding(self.mesh, array.shape[0]))

    def _replicated_put(self, array: np.ndarray) -> jax.Array:
        # committed to the whole mesh: with several processes, an array on this process's default
        # device could not enter a step whose other arguments span every process
        if self.mesh is None:
            return jnp.asarray(array)
        return self._put(array, sharding.replicated(self.mesh))

    def _put(self, array: np.ndarray, where: NamedSharding) -> jax.Array:
        if self.processes == 1:
            return jax.device_put(array, where)
        # Each process fills its own devices' shards from its host copy (the same on every process:
        # one sampler stream). Not device_put: across processes it first checks that every process
        # passed the same value, an all-gather per call, and one that fails on NaN (AGC's "no
        # threshold yet"), which never equals itself.
        array = np.asarray(array)
        return jax.make_array_from_callback(array.shape, where, lambda index: array[index])

    def _host(self, tree: Any) -> Any:
        """`tree`'s arrays as numpy (collective with several processes: every process calls it in the
        same order). An array split over other processes' devices is all-gathered first, so each
        process reads the whole value; one process's or a replicated array is read as it is."""
        def read(x: Any) -> np.ndarray:
            if self.processes == 1 or not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated:
                return np.asarray(x)
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return jax.tree.map(read, tree)

    def _compile(self) -> None:
        cfg, arch, agc, dtype = self.cfg, self.arch, self.agc, self.compute_dtype
        micro = cfg.micro_batch_sequences or cfg.batch_sequences
        p_shardings = None if self.mesh is None else sharding.param_shardings(self.params, self.mesh)
        grads = grads_function(cfg, agc, dtype, param_shardings=p_shardings, moe_backend=self.moe_backend)
        update = update_function(cfg, self.tx)

        L = arch.n_layers
        probes = agc.probes(L, micro, cfg.seq_len) if agc is not None else None
        thresholds = self._replicated_put(np.zeros((L, len(agc.points)), np.float32)) if agc is not None else None
        tokens = self._batch_put(np.zeros((micro, cfg.seq_len), np.int32))
        self._probes = probes
        self.phase = "compile: gradient program"
        self._grads = jax.jit(grads).lower(self.params, probes, self.buffers, thresholds, tokens, tokens).compile()
        self.memory = {"grads": memory_figures(self._grads)}
        out_shardings = None
        if self.mesh is not None:  # the state keeps its layout from step to step (the compiled step expects it)
            # leaves made from constants (step counts, LR) come out on one device: replicate them
            self._opt_shardings = jax.tree.map(
                lambda a: a.sharding if isinstance(a.sharding, NamedSharding) else sharding.replicated(self.mesh),
                self.opt_state)
            self.opt_state = jax.device_put(self.opt_state, self._opt_shardings)
            out_shardings = (p_shardings, self._opt_shardings, sharding.replicated(self.mesh))
        self.phase = "compile: update program"
        self._update = jax.jit(update, donate_argnums=(0, 1), out_shardings=out_shardings).lower(
            self.params, self.opt_state, self.params).compile()
        self.memory["update"] = memory_figures(self._update)
        self.phase = "compiled"
        self._add = jax.jit(lambda a, b: jax.tree.map(jnp.add, a, b))
        self._logits = jax.jit(lambda params, buffers, x: jmodel.forward(
            jmodel.compute_params(params, dtype), buffers, x, arch, backend=self.moe_backend)[0].astype(jnp.float32))
        self._bias_rate = float(cfg.bias_update_rate)

    # --- checkpoints ------------------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        return {"params": self.params, "buffers": self.buffers, "opt_state": self.opt_state}

    def load(self, run_dir: Path) -> dict[str, Any] | None:
        got = jax_ckpt.load(run_dir, template=self._state(), config_key=self.cfg.resume_keys())
        if got is None:
            refuse_other_engines_checkpoint(run_dir, own=jax_ckpt.CHECKPOINT_DIR)  # every process: none goes on alone
            return None
        state, meta = got
        self.params, self.buffers, self.opt_state = state["params"], state["buffers"], state["opt_state"]
        self.sampler.load_state_dict(meta["sampler"])
        if self.recorder is not None and meta.get("agc") is not None:
            self.recorder.load_state_dict(meta["agc"])
        return meta["loop"]

    def save(self, run_dir: Path, loop_state: dict[str, Any]) -> None:
        meta = {"step": loop_state["step"], "loop": loop_state, "sampler": self.sampler.state_dict(),
                "agc": self.recorder.state_dict() if self.recorder is not None else None}
        jax_ckpt.save(run_dir, state=self._state(), config_key=self.cfg.key(), meta=meta)

    # --- one step ---------------------------------------------------------------------------
    def train_step(self, step: int, lr_multiplier: float) -> dict[str, float]:
        cfg = self.cfg
        self.opt_state = with_hyperparams(
            self.opt_state, lr=cfg.lr * lr_multiplier,
            adam_lr=(cfg.lr if cfg.adam_lr is None else cfg.adam_lr) * lr_multiplier)
        if self.mesh is not None:
            self.opt_state = jax.device_put(self.opt_state, self._opt_shardings)
        batch = self.sampler.next_batch()
        return self.step_on(step, batch.inputs.numpy().astype(np.int32), batch.targets.numpy().astype(np.int32),
                            locate=batch.locate)

    def step_on(self, step: int, inputs_all: np.ndarray, targets_all: np.ndarray, locate=None) -> dict[str, float]:
        """`train_step` on a given batch (int32 arrays (batch_sequences, seq_len)); the LR is already set."""
        cfg = self.cfg
        micro = cfg.micro_batch_sequences or cfg.batch_sequences
        if self.recorder is not None:
            self.recorder.begin_step(step)
        total_grads = None
        ce_sum = aux_sum = 0.0
        rounds: list[int] = []
        overload: list[float] = []
        counts_sum = None
        decode = getattr(self, "decode", None)
        for m in range(cfg.accumulation_steps):
            rows = slice(m * micro, (m + 1) * micro)
            inputs, targets = inputs_all[rows], targets_all[rows]
            thresholds = None
            if self.recorder is not None:
                thresholds = self._replicated_put(self.recorder.thresholds(self.arch.n_layers))
            # the phase a failure reports: the program runs asynchronously, so a device error (out
            # of memory) surfaces at the host read of its statistics, still in this phase
            self.phase = f"step {step}: gradient program, micro-batch {m}"
            g, readout, stats = self._grads(self.params, self._probes, self.buffers, thresholds,
                                            self._batch_put(inputs), self._batch_put(targets))
            total_grads = g if total_grads is None else self._add(total_grads, g)
            readout, stats = self._host((readout, stats))
            if self.recorder is not None:
                offset = m * micro
                self.recorder.record(readout, inputs, decode=decode,
                                     locate=None if locate is None else lambda r, p, o=offset: locate(r + o, p))
            ce_sum += float(stats["ce"])
            aux_sum += float(stats["aux_loss"])
            counts = np.asarray(stats["tokens_per_expert"])                      # (L, E)
            counts_sum = counts if counts_sum is None else counts_sum + counts
            rounds += [int(r) for r in np.asarray(stats["rounds"])]
            overload += [float(c.max()) / max(float(c.astype(np.float64).mean()), 1e-9) for c in counts]
        self.phase = f"step {step}: update program"
        self.params, self.opt_state, norm = self._update(self.params, self.opt_state, total_grads)
        norm = self._host(norm)
        self.phase = f"step {step}: done"
        self._counts = counts_sum
        n = cfg.accumulation_steps
        return {"loss": ce_sum / n, "aux_loss": aux_sum / n, "grad_norm": float(norm),
                "moe_rounds_mean": sum(rounds) / len(rounds), "moe_rounds_max": float(max(rounds)),
                "moe_overload_max": max(overload),
                "agc_clip_rate": self.recorder.end_step() if self.recorder is not None else 0.0}

    def update_router_bias(self) -> None:
        if getattr(self, "_counts", None) is None:
            return
        self.buffers = jmodel.update_expert_bias(self.buffers, self._replicated_put(self._counts), self._bias_rate)
        self._counts = None

    def drain_clip_events(self) -> list[dict[str, Any]]:
        return [event_record(ev) for ev in self.recorder.drain_events()] if self.recorder is not None else []

    # --- evaluation and reports -------------------------------------------------------------
    def evaluate(self, *, final: bool) -> dict[str, DomainScore]:
        cfg = self.cfg

        def logits_fn(inputs: torch.Tensor) -> torch.Tensor:
            # Padded to one (eval_batch_size, seq_len) shape, so the eval compiles once: the model is
            # causal, so positions after a window's end change none of its logits.
            B, T = inputs.shape
            x = np.zeros((max(B, cfg.eval_batch_size), cfg.seq_len), np.int32)
            x[:B, :T] = inputs.numpy()
            logits = self._host(self._logits(self.params, self.buffers, self._batch_put(x)))
            return torch.from_numpy(np.array(logits[:B, :T]))

        # Traced on the mesh as the step is: off it, the forward's MoE layers fall back to XLA's generic
        # partitioning instead of expert parallelism (a final eval on a (2, 2) mesh: 20.5 -> 6.4 CPU s,
        # the same BPB to 5 decimals).
        with sharding.use_mesh(self.mesh):
            return score_domains(logits_fn, self.corpus, cfg, final=final)

    def unigram_bpb(self) -> dict[str, float]:
        return unigram_bpb(self.corpus, self.cfg)

    def data_report(self) -> dict[str, Any]:
        return self.sampler.report()

    def device_peak(self) -> DevicePeak:
        """One device's peak. On the CPU the process's host devices (`--xla_force_host_platform_device_count`)
        share its cores: each has `cpu_cores / local devices` of them, so `world` devices' peaks add up to
        the cores' and not to world times them."""
        kind = jax_device()
        name = str(jax.devices()[0].device_kind) if kind == "cuda" else None  # JAX's GPU, which torch may not see
        cores = self.cpu_cores / jax.local_device_count() if kind == "cpu" else None
        return device_peak(kind, override=self.cfg.peak_flops_per_device, cores=cores, device_name=name)

    def barrier(self) -> None:
        if self.processes > 1:
            multihost_utils.sync_global_devices("rungs.loop barrier")

    # --- for tests and conversions ----------------------------------------------------------
    def host_params(self) -> dict[str, np.ndarray]:
        return self._host(dict(self.params))
