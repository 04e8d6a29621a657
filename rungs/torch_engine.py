"""The PyTorch engine of one process (`rungs.engine.Engine`): the model, Muon+AdamW, the
source-scaled data stream and activation gradient clipping, with bf16 autocast, gradient
accumulation and global grad-norm clipping; checkpoints are `rungs.checkpoint`'s verified,
tensor-only files. The loop around it is `rungs.loop`; `rungs.train.train` wires the two.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import random
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from rungs.agc import ActivationGradClipper, event_record
from rungs.checkpoint import (CHECKPOINT_NAME, load_checkpoint, refuse_other_engines_checkpoint, remove_checkpoint,
                              restore, save_checkpoint)
from rungs.config import TrainConfig, TrainConfigError
from rungs.data.corpus import PreparedCorpus
from rungs.data.prepare import ensure_prepared
from rungs.data.sampler import SourceScaledSampler
from rungs.evaluation import DomainScore, evaluate_model, unigram_bpb
from rungs.metrics import DevicePeak, device_peak
from rungs.model import Transformer
from rungs.held_weights import held_expert_weights
from rungs.optim import build_optimizer, clip_grad_norm_on_device_, lr_at
from rungs.router import load_balancing_loss, z_loss

log = logging.getLogger(__name__)


def lr_schedule(cfg: TrainConfig) -> Callable[[int], float]:
    """The config's LR multiplier per 0-based step (what `rungs.loop.run_job` takes)."""
    return functools.partial(lr_at, total_steps=cfg.schedule_steps, warmup_steps=cfg.warmup, schedule=cfg.schedule,
                             min_lr_ratio=cfg.min_lr_ratio, decay_fraction=cfg.decay_fraction)


def muon_update_scale(cfg: TrainConfig, optimizer: Any) -> str:
    """The Muon update-scale convention in use (an MLflow tag): the optimizer's, else the config's."""
    return str(getattr(optimizer, "convention", cfg.adjust_lr))


def seed_everything(seed: int, deterministic: bool) -> None:
    """Python's, numpy's and torch's generators from `seed`; torch's deterministic algorithms as the config says."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:  # cuBLAS needs a fixed workspace to be deterministic (ignored on CPU)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # Only on a change: the call imports torch._inductor (~2 s a process), and every job sets it.
    if torch.are_deterministic_algorithms_enabled() != deterministic:
        torch.use_deterministic_algorithms(deterministic)


def resolve_device(cfg: TrainConfig) -> str:
    """The device type a torch job of this config runs on: `device=auto` is cuda when torch sees a
    GPU, else cpu. Resolved here, at the engine, not in the config (which planning imports torch-free).
    `device=cuda` where torch sees no GPU is refused."""
    if cfg.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise TrainConfigError("device is cuda but torch sees no GPU; use device=cpu or auto", key="device")
    return cfg.device


def _autocast(cfg: TrainConfig, device_type: str):
    return torch.autocast(device_type, dtype=torch.bfloat16, enabled=cfg.bf16_on(device_type))


def _pick_threads(cfg: TrainConfig) -> int:
    """The configured thread count, else the cores idle at start-up (at least 1).

    Oversubscribed OpenMP threads wait at every parallel region for a descheduled sibling: on 2
    shared cores with other jobs running, a step took 2-9 s with 2 threads and 0.5 s with 1.
    Deterministic runs use 1 unless told otherwise, so a rerun does not depend on the load.
    """
    cores = os.cpu_count() or 1
    if cfg.threads:
        if cfg.threads > cores:  # a config from a larger machine: it runs, each parallel region waiting
            log.warning("threads %d is more than this machine's %d cores: the threads take turns on them, and a "
                        "step can take several times as long as with %d (leave threads unset for the idle cores)",
                        cfg.threads, cores, cores)
        return cfg.threads
    if cfg.deterministic:
        return 1
    try:
        busy = os.getloadavg()[0]
    except OSError:
        busy = 0.0
    return max(1, min(cores, int(cores - busy + 0.5)))


# The statistics of one step, in the order `train_step_on_device` stacks them.
STEP_STATS = ("loss", "aux_loss", "grad_norm", "moe_rounds_mean", "moe_rounds_max", "moe_overload_max")


def train_step_on_device(cfg: TrainConfig, model: Transformer, optimizer, batch, clipper, decode) -> torch.Tensor:
    """Forward/backward over the micro-batches of one batch, then one optimizer step (the router-bias
    step is `TorchEngine.update_router_bias`, which the loop calls after it), without reading anything
    on the host: returns the step's statistics (`STEP_STATS`) as one fp32 device tensor, for
    `read_step_stats` after the step. A GPU runs the whole step without waiting for the host."""
    micro = cfg.micro_batch_sequences or cfg.batch_sequences
    n_micro = cfg.accumulation_steps
    # Statistics stay on the device during the step and are read once, after it.
    ce_parts: list[torch.Tensor] = []
    aux_parts: list[torch.Tensor] = []
    rounds: list[torch.Tensor] = []
    overload: list[torch.Tensor] = []  # per layer: busiest expert's assignments / the mean (1.0 = balanced)
    device = next(model.parameters()).device  # where the engine built the model (resolve_device)
    # Accumulating under bf16: the expert stacks are cast once a step, and later micro-batches add their
    # gradients into .grad in place (rungs.held_weights.held_expert_weights; the same values bit for bit).
    hold = held_expert_weights(model) if n_micro > 1 and cfg.bf16_on(device.type) else contextlib.nullcontext()
    with hold:
        for m in range(n_micro):
            rows = slice(m * micro, (m + 1) * micro)
            inputs = batch.inputs[rows].to(device, non_blocking=True)
            targets = batch.targets[rows].to(device, non_blocking=True)
            if clipper is not None:
                offset = m * micro
                # The host copy of the tokens: an event's context is decoded from it without a device read.
                clipper.begin_micro_batch(batch.inputs[rows], locate=lambda r, p, o=offset: batch.locate(r + o, p),
                                          decode=decode)
            with _autocast(cfg, device.type):
                # Mean CE over token chunks, never the whole (b·T, V) logits (rungs.loss); one RouterOutput per layer.
                ce, routes = model(inputs, targets)
            # Balancing statistics of all layers are combined in one reduction, as the report does.
            aux = cfg.lb_loss_coef * load_balancing_loss(routes, cfg.n_experts, cfg.top_k) if cfg.lb_loss_coef else ce.new_zeros(())
            if cfg.z_loss_coef:
                aux = aux + cfg.z_loss_coef * z_loss(routes)
            ((ce + aux) / n_micro).backward()
            ce_parts.append(ce.detach().float())
            aux_parts.append(aux.detach().float())
            rounds += [block.moe.experts.last_rounds.float() for block in model.layers]
            overload += [r.tokens_per_expert.float().max() / r.tokens_per_expert.float().mean().clamp_min(1e-9)
                         for r in routes]
    params = [p for p in model.parameters() if p.grad is not None]
    if cfg.grad_clip is not None:
        grad_norm = clip_grad_norm_on_device_(params, cfg.grad_clip)
    else:
        grad_norm = torch.linalg.vector_norm(torch.stack([p.grad.float().norm() for p in params]))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    rounds_t = torch.stack(rounds)
    return torch.stack([torch.stack(ce_parts).mean(), torch.stack(aux_parts).mean(), grad_norm.detach().float(),
                        rounds_t.mean(), rounds_t.max(), torch.stack(overload).max()])


def read_step_stats(stats: torch.Tensor) -> dict[str, float]:
    """The step's one host read: its statistics (`train_step_on_device`'s) after the optimizer step."""
    return dict(zip(STEP_STATS, stats.tolist()))


def _train_step(cfg: TrainConfig, model: Transformer, optimizer, batch, clipper, decode) -> dict[str, float]:
    """One step and its statistics on the host (what the loop logs and checks for divergence)."""
    return read_step_stats(train_step_on_device(cfg, model, optimizer, batch, clipper, decode))


class TorchEngine:
    """One process, one device (`rungs.engine.Engine`)."""

    rank = 0
    world = 1
    processes = 1

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.threads = _pick_threads(cfg)
        self.clipper: ActivationGradClipper | None = None

    def tags(self) -> dict[str, str]:
        return {"muon_update_scale": muon_update_scale(self.cfg, getattr(self, "optimizer", None))}

    def discard_checkpoint(self, run_dir: Path) -> None:
        remove_checkpoint(run_dir)

    def build(self) -> None:
        cfg = self.cfg
        torch.set_num_threads(self.threads)
        log.info("torch threads: %d", self.threads)
        seed_everything(cfg.seed, cfg.deterministic)
        self.corpus = PreparedCorpus.open(ensure_prepared(cfg.data_manifest, vocab_size=cfg.vocab_size,
                                                          cache_root=Path(cfg.data_cache_root)))
        self.sampler = SourceScaledSampler(self.corpus, cfg.sources_plan(), seq_len=cfg.seq_len,
                                           batch_sequences=cfg.batch_sequences, seed=cfg.order_seed, subset=cfg.subset,
                                           order=cfg.data_order)
        self.device_type = resolve_device(cfg)
        self.model = Transformer(cfg.architecture()).to(self.device_type)
        self.optimizer = build_optimizer(self.model, lr=cfg.lr, weight_decay=cfg.weight_decay, adam_lr=cfg.adam_lr,
                                         muon_momentum=cfg.muon_momentum, adam_betas=(cfg.adam_beta1, cfg.adam_beta2),
                                         adjust_lr=cfg.adjust_lr)
        settings = cfg.agc_settings()
        self.clipper = ActivationGradClipper(settings) if settings else None
        if self.clipper is not None:
            self.model.activation_clip = self.clipper
        self.model.train()

    def load(self, run_dir: Path) -> dict[str, Any] | None:
        payload = load_checkpoint(run_dir, config_key=self.cfg.resume_keys())
        if payload is None:
            refuse_other_engines_checkpoint(run_dir, own=CHECKPOINT_NAME)
            return None
        restore(payload, model=self.model, optimizer=self.optimizer, sampler=self.sampler)
        extra = dict(payload["extra"])
        agc = extra.pop("agc", None)
        if self.clipper is not None and agc is not None:
            self.clipper.load_state_dict(agc)
        return extra

    def save(self, run_dir: Path, loop_state: dict[str, Any]) -> None:
        extra = loop_state | {"agc": self.clipper.state_dict() if self.clipper is not None else None}
        save_checkpoint(run_dir, step=loop_state["step"], config_key=self.cfg.key(), model=self.model,
                        optimizer=self.optimizer, sampler=self.sampler, extra=extra)

    def train_step(self, step: int, lr_multiplier: float) -> dict[str, float]:
        self.optimizer.set_lr_multiplier(lr_multiplier)
        batch = self.sampler.next_batch()
        if self.clipper is not None:
            self.clipper.begin_step(step)
        stats = _train_step(self.cfg, self.model, self.optimizer, batch, self.clipper, self.corpus.tokenizer.decode)
        return stats | {"agc_clip_rate": self.clipper.end_step() if self.clipper is not None else 0.0}

    def update_router_bias(self) -> None:
        for block in self.model.layers:  # counts accumulated by each router over this step's micro-batches
            block.moe.router.update_bias()

    def drain_clip_events(self) -> list[dict[str, Any]]:
        return [event_record(ev) for ev in self.clipper.drain_events()] if self.clipper is not None else []

    def evaluate(self, *, final: bool) -> dict[str, DomainScore]:
        return evaluate_model(self.model, self.corpus, self.cfg, final=final)

    def unigram_bpb(self) -> dict[str, float]:
        return unigram_bpb(self.corpus, self.cfg)

    def data_report(self) -> dict[str, Any]:
        return self.sampler.report()

    def device_peak(self) -> DevicePeak:
        return device_peak(self.device_type, override=self.cfg.peak_flops_per_device, cores=self.threads)

    def barrier(self) -> None:
        pass
