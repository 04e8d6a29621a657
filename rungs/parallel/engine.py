"""The sharded PyTorch engine (`rungs.engine.Engine`) of a torch.distributed process group.

It composes the one-process engine's parts (corpus, source-scaled sampler, model, BPB evaluation)
with `rungs.parallel.distributed` (DP x EP, FSDP2, distributed Muon) and
`rungs.parallel.dist_checkpoint` (sharded checkpoints, resumable onto another number of workers).
Every rank draws the same global batch and trains on its contiguous share of the sequences; the
loss is all-reduced over the ranks, so every rank sees the same metrics and the loop's divergence
rule stops every rank at the same step. Evaluation is a collective (every rank runs the sharded
forward).

Activation gradient clipping runs on each rank's rows with job-wide statistics: the per-point
medians of every rank are gathered before they enter the running history (so every rank clips
against the same threshold), the clip rate counts the whole job, and rank 0 receives every rank's
clip events. A rank's loss is the mean over its own tokens, so its activation gradients are
`world` times the single-process ones: a fixed threshold is scaled by the worker count (a median
threshold is scale-free).
"""

from __future__ import annotations

import base64
import dataclasses
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from rungs.agc import ActivationGradClipper, event_record
from rungs.checkpoint import refuse_other_engines_checkpoint, remove_checkpoint
from rungs.config import TrainConfig
from rungs.data.corpus import PreparedCorpus
from rungs.data.prepare import ensure_prepared
from rungs.data.sampler import SourceScaledSampler
from rungs.evaluation import DomainScore, evaluate_model, unigram_bpb
from rungs.metrics import DevicePeak, device_peak
from rungs.parallel import dist_checkpoint
from rungs.parallel.distributed import DistributedError, Parallel, build_model, build_optimizer, rank_rows, train_step
from rungs.torch_engine import muon_update_scale, seed_everything

log = logging.getLogger(__name__)

CHECKPOINT_DIR = "dist_checkpoint"


def seed_rank_stream(seed: int, rank: int, step: int = 0) -> None:
    """Seed this process's torch generators (CPU and every GPU) from (seed, rank, step): dropout's stream."""
    torch.manual_seed(int(np.random.SeedSequence([seed, rank, step]).generate_state(1)[0]))


def gather_rng(par: Parallel) -> list[dict[str, str]]:
    """Every rank's torch generator states, in rank order (collective), as base64 text for the checkpoint's
    JSON record: a resume draws the dropout masks the uninterrupted job would have."""
    mine = {"cpu": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()}
    if par.device_type == "cuda":
        mine["cuda"] = base64.b64encode(torch.cuda.get_rng_state().numpy().tobytes()).decode()
    every: list[Any] = [None] * par.world
    dist.all_gather_object(every, mine)
    return every


def restore_rng(states: list[dict[str, str]] | None, par: Parallel, *, seed: int, step: int) -> None:
    """This rank's generator state from the checkpoint, where it was written by as many ranks; else (a resume
    onto another world size, or a checkpoint written before the states were kept) a stream of (seed, rank, step),
    reproducible but not the uninterrupted job's."""
    def tensor(text: str) -> torch.Tensor:
        return torch.from_numpy(np.frombuffer(base64.b64decode(text), dtype=np.uint8).copy())

    if states is not None and len(states) == par.world:
        own = states[par.rank]
        torch.set_rng_state(tensor(own["cpu"]))
        if "cuda" in own and par.device_type == "cuda":
            torch.cuda.set_rng_state(tensor(own["cuda"]))
        return
    if par.is_main:
        log.warning("checkpoint holds %s: dropout's streams restart from (seed, rank, step)", "no generator states"
                    if states is None else f"{len(states)} ranks' generator states, not {par.world}")
    seed_rank_stream(seed, par.rank, step)


class ShardedTorchEngine:
    """FSDP2 x expert parallelism over the initialised process group (`rungs.engine.Engine`)."""

    def __init__(self, cfg: TrainConfig, par: Parallel, *, comm_dtype: torch.dtype = torch.bfloat16,
                 restore_from: Path | None = None) -> None:
        """`restore_from`: the run directory of a resuming job. When it holds a checkpoint, `build`
        allocates the parameters without drawing them and `load` must fill them (or fail)."""
        self.cfg, self.par, self.comm_dtype = cfg, par, comm_dtype
        self.restore_from = restore_from
        self._weights_drawn = True
        self.rank, self.world = par.rank, par.world
        self.processes = par.world  # one device per process
        self.clipper: ActivationGradClipper | None = None
        self._events: list[dict[str, Any]] = []

    @property
    def bf16(self) -> bool:
        """The config's precision on the workers' device: bf16, or auto on a GPU (as one process)."""
        return self.cfg.precision == "bf16" or (self.cfg.precision == "auto" and self.par.device_type == "cuda")

    def tags(self) -> dict[str, str]:
        return {"workers": str(self.par.world), "dp": str(self.par.dp), "ep": str(self.par.ep),
                "muon_update_scale": muon_update_scale(self.cfg, getattr(self, "optimizer", None))}

    def discard_checkpoint(self, run_dir: Path) -> None:
        remove_checkpoint(run_dir)  # every engine's: a fresh start leaves none to refuse a resume

    def build(self) -> None:
        cfg, par = self.cfg, self.par
        if cfg.batch_sequences % par.world:
            raise DistributedError(f"batch_sequences={cfg.batch_sequences} must be divisible by the "
                                   f"{par.world} workers")
        if (cfg.batch_sequences // par.world) % cfg.accumulation_steps:
            raise DistributedError(f"{cfg.batch_sequences // par.world} sequences per worker do not split into "
                                   f"{cfg.accumulation_steps} micro-batches")
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        # every rank draws the single-process model's stream, keeping its shards; deterministic as configured
        seed_everything(cfg.seed, cfg.deterministic)
        self.corpus = self._open_corpus()
        self.sampler = SourceScaledSampler(self.corpus, cfg.sources_plan(), seq_len=cfg.seq_len,
                                           batch_sequences=cfg.batch_sequences, seed=cfg.order_seed, subset=cfg.subset,
                                           order=cfg.data_order)
        self.device = torch.device(par.device_type)
        # Built on the meta device and materialised shard by shard: no rank holds the whole model.
        # A resume skips drawing the weights its checkpoint replaces; `load` then must restore them.
        self._weights_drawn = not (self.restore_from is not None and _has_checkpoint(self.restore_from))
        self.model = build_model(cfg.architecture(), par, capacity_per_expert=cfg.capacity_per_expert,
                                 param_dtype=torch.bfloat16 if self.bf16 else None, draw_weights=self._weights_drawn)
        # Every rank walked the one weight stream; dropout then draws from a stream of each rank's own (rank 0
        # goes on with the single-process one), or every rank would mask its sequences as rank 0 does.
        if par.rank > 0:
            seed_rank_stream(cfg.seed, par.rank)
        self.optimizer = build_optimizer(self.model, par, lr=cfg.lr, weight_decay=cfg.weight_decay, adam_lr=cfg.adam_lr,
                                         muon_momentum=cfg.muon_momentum, adam_betas=(cfg.adam_beta1, cfg.adam_beta2),
                                         adjust_lr=cfg.adjust_lr, comm_dtype=self.comm_dtype)
        settings = cfg.agc_settings()
        if settings:
            if settings.mode == "fixed":  # per-rank mean loss: activation gradients are `world` x single-process
                settings = dataclasses.replace(settings, threshold=settings.threshold * par.world)
            self.clipper = ActivationGradClipper(settings)
            self.model.activation_clip = self.clipper
        # Its share of each of the one-process step's micro-batches (rank_rows), not a contiguous slice.
        self.rows = rank_rows(cfg.batch_sequences, cfg.accumulation_steps, par.rank, par.world)
        self._row_index = torch.tensor(self.rows, dtype=torch.long)
        self.model.train()

    def _open_corpus(self) -> PreparedCorpus:
        """Prepare the corpus once (rank 0), then every rank opens the cached shards."""
        cfg = self.cfg

        def prepare():
            return ensure_prepared(cfg.data_manifest, vocab_size=cfg.vocab_size, cache_root=Path(cfg.data_cache_root))
        path = prepare() if self.par.is_main else None
        dist.barrier()
        return PreparedCorpus.open(path if path is not None else prepare())

    def load(self, run_dir: Path) -> dict[str, Any] | None:
        ckpt = run_dir / CHECKPOINT_DIR
        if not _has_checkpoint(run_dir):
            if not self._weights_drawn:
                raise DistributedError(f"{ckpt} disappeared between build and load; the model's weights "
                                       "were not drawn, so the job cannot start fresh: rerun it")
            refuse_other_engines_checkpoint(run_dir, own=CHECKPOINT_DIR)  # every rank: none goes on alone
            return None
        extra = dist_checkpoint.load(ckpt, self.model, self.optimizer, self.par)
        if extra.get("config_key") not in self.cfg.resume_keys():  # its key, or the one older code wrote
            raise DistributedError(f"{ckpt} was written for another config ({extra.get('config_key')}, "
                                   f"now {self.cfg.key()})")
        self.sampler.load_state_dict(extra["sampler"])
        state = dict(extra["state"])
        restore_rng(extra.get("rng"), self.par, seed=self.cfg.seed, step=int(state.get("step", 0)))
        agc = state.pop("agc", None)
        if self.clipper is not None and agc:
            self.clipper.load_state_dict(agc)
        return state

    def save(self, run_dir: Path, loop_state: dict[str, Any]) -> None:
        state = loop_state | {"agc": self.clipper.state_dict() if self.clipper is not None else None}
        dist_checkpoint.save(run_dir / CHECKPOINT_DIR, self.model, self.optimizer, self.par,
                             extra={"config_key": self.cfg.key(), "sampler": self.sampler.state_dict(), "state": state,
                                    "rng": gather_rng(self.par)})

    def train_step(self, step: int, lr_multiplier: float) -> dict[str, float]:
        cfg, rows = self.cfg, self.rows
        self.optimizer.set_lr_multiplier(lr_multiplier)
        batch = self.sampler.next_batch()  # the same global batch on every rank; this rank trains on its rows
        if self.clipper is not None:
            self.clipper.begin_step(step)
        index = self._row_index
        inputs = batch.inputs[index]  # the host copy: AGC decodes an event's context from it, no device read
        stats = train_step(self.model, self.optimizer, self.par, inputs.to(self.device, non_blocking=True),
                           batch.targets[index].to(self.device, non_blocking=True), n_experts=cfg.n_experts, top_k=cfg.top_k,
                           lb_loss_coef=cfg.lb_loss_coef, z_loss_coef=cfg.z_loss_coef, grad_clip=cfg.grad_clip,
                           autocast_dtype=torch.bfloat16 if self.bf16 else None,
                           micro_batches=cfg.accumulation_steps, clipper=self.clipper, locate=batch.locate,
                           rows=rows, decode=self.corpus.tokenizer.decode, host_inputs=inputs)
        rate = self._end_agc_step() if self.clipper is not None else 0.0
        return stats | {"agc_clip_rate": rate, "workers": float(self.par.world)}

    def _end_agc_step(self) -> float:
        """Job-wide AGC statistics for this step; rank 0 keeps every rank's clip events. The clip rate."""
        def all_gather(obj: Any) -> list[Any]:
            out: list[Any] = [None] * self.par.world
            dist.all_gather_object(out, obj)
            return out

        self.clipper.synchronise(all_gather)
        rate = self.clipper.end_step()
        parts = all_gather([event_record(ev) for ev in self.clipper.drain_events()])
        if self.par.is_main:
            self._events += [ev for part in parts for ev in part]
        return rate

    @torch.no_grad()
    def update_router_bias(self) -> None:
        """Aux-loss-free bias step from the world's counts (all layers in one all-reduce)."""
        routers = [block.moe.router for block in self.model.layers]
        counts = torch.stack([r.pending_counts for r in routers]).clone()
        dist.all_reduce(counts)
        for router, c in zip(routers, counts):
            router.update_bias(c)

    def drain_clip_events(self) -> list[dict[str, Any]]:
        events, self._events = self._events, []
        return events

    def evaluate(self, *, final: bool) -> dict[str, DomainScore]:
        return evaluate_model(self.model, self.corpus, self.cfg, final=final)  # collective: the sharded forward

    def unigram_bpb(self) -> dict[str, float]:
        return unigram_bpb(self.corpus, self.cfg)

    def data_report(self) -> dict[str, Any]:
        return self.sampler.report()

    def device_peak(self) -> DevicePeak:
        # the workers' devices' spec peak (rungs.metrics), the same on every rank
        return device_peak(self.par.device_type, override=self.cfg.peak_flops_per_device,
                           cores=torch.get_num_threads())

    def barrier(self) -> None:
        dist.barrier()


def _has_checkpoint(run_dir: Path) -> bool:
    return (run_dir / CHECKPOINT_DIR / dist_checkpoint.EXTRA_FILE).is_file()
