"""What the training loop asks of a backend: the `Engine` protocol.

`rungs.loop.run_job` owns everything a training job does besides arithmetic: the step cadence, the
LR multiplier, periodic and final evaluation, the divergence rule, when to checkpoint, MLflow
tracking, the result files (`result.json`, `eval.json`, `data_report.json`, `clip_events.jsonl`),
the progress bar, crash -> FAILED marking and wall-clock accounting across restarts. An engine owns
the arithmetic and its state: the model, the optimizer, the data stream (the shared source-scaled
sampler), activation gradient clipping, and how all of that is checkpointed. The loop imports no
framework; it sees numbers, strings and plain dicts.

Engines: `rungs.torch_engine.TorchEngine` (one process), `rungs.parallel.engine.ShardedTorchEngine`
(a torch.distributed process group: FSDP2 x expert parallel), and the JAX engine
(`rungs.jaxjob`). Every method below is called on every rank, in the same order; methods marked
*collective* must be entered by all ranks. The loop does its file and tracking work on rank 0 only.

Lifecycle, as the loop calls it:

    engine.discard_checkpoint(run_dir)          # resume=False only, rank 0: forget an old checkpoint
    engine.build()                              # collective: corpus, model, optimizer, data stream
    state = engine.load(run_dir)                # None, or the loop state saved with the checkpoint
    engine.device_peak(); engine.unigram_bpb()  # once per invocation
    for step in ...:
        metrics = engine.train_step(step, lr_multiplier)   # collective
        engine.update_router_bias()             # collective; only when the config asks for it
        events = engine.drain_clip_events()     # rank 0: every rank's events of that step
        engine.evaluate(final=...)              # collective, at the eval cadence and the last step
        engine.save(run_dir, state)             # collective, at the checkpoint cadence
    engine.data_report(); engine.barrier()      # after the last step (result.json, data_report.json)

The LR schedule is not the engine's: `run_job` takes `lr_multiplier(step)` (`rungs.optim.lr_at` with
the config's schedule fields, e.g. `rungs.torch_engine.lr_schedule(cfg)`) and passes the value in.

Contracts:
- `train_step` draws the step's global batch (the same on every rank), runs forward/backward over
  the config's micro-batches, clips and steps the optimizer at `lr_multiplier` x the configured
  rates, and returns the step's metrics, identical on every rank: at least "loss" (mean
  cross-entropy over the global batch), "aux_loss", "grad_norm" (before clipping), plus any of
  "moe_rounds_mean", "moe_rounds_max", "moe_overload_max", "agc_clip_rate". Names are MLflow metric
  names; an engine must not invent new ones for what these already mean.
- `save(run_dir, loop_state)` writes everything needed to continue bit-exactly after
  `loop_state["step"]` steps (engine state, data stream position, RNG) together with `loop_state`
  (plain JSON-able data) atomically; `load(run_dir)` restores it and returns that `loop_state`, or
  None when the run has no checkpoint. A checkpoint of another config (`config.key()`) is refused
  with an error naming the file.
- `evaluate(final)` is the eval per held-out domain (`rungs.evaluation.score_domains`: BPB and its
  standard error, over the final eval's documents when `final`, else the intermediate sample), the
  same dict on every rank.
- `device_peak()` is the MFU denominator of one device (`rungs.metrics.DevicePeak`); the loop
  multiplies it by `world`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rungs.metrics import DevicePeak


@runtime_checkable
class Engine(Protocol):
    rank: int  # this process's rank in the job (0 in a one-process job)
    world: int  # the number of devices/processes the job's global batch is split over
    processes: int  # the job's processes (1: one process, whatever its number of devices)

    def tags(self) -> dict[str, str]:
        """MLflow tags this engine adds to the run (e.g. workers, dp, ep, backend)."""
        ...

    def discard_checkpoint(self, run_dir: Path) -> None:
        """Remove the run directory's checkpoint (a fresh start in the same directory)."""
        ...

    def build(self) -> None:
        """Prepare/open the corpus, seed, build the model, optimizer, data stream and clipper."""
        ...

    def load(self, run_dir: Path) -> dict[str, Any] | None:
        """Restore the engine from `run_dir`'s checkpoint; the loop state saved with it, or None."""
        ...

    def save(self, run_dir: Path, loop_state: dict[str, Any]) -> None:
        """Checkpoint the engine with `loop_state` (collective; atomic)."""
        ...

    def train_step(self, step: int, lr_multiplier: float) -> dict[str, float]:
        """One optimizer step on the next global batch; the step's metrics (see the module docstring)."""
        ...

    def update_router_bias(self) -> None:
        """Aux-loss-free router bias step from the counts of the step just taken (job-wide)."""
        ...

    def drain_clip_events(self) -> list[dict[str, Any]]:
        """Activation-gradient clip events since the last call, as JSON-able dicts (rank 0: every
        rank's; other ranks: may be empty). Empty without activation gradient clipping."""
        ...

    def evaluate(self, *, final: bool) -> dict[str, Any]:
        """`rungs.evaluation.DomainScore` per held-out domain (collective)."""
        ...

    def unigram_bpb(self) -> dict[str, float]:
        """The unigram baseline's BPB on the final eval's documents (rungs.evaluation)."""
        ...

    def data_report(self) -> dict[str, Any]:
        """Per source: planned vs realised unique tokens and epochs (the sampler's report)."""
        ...

    def device_peak(self) -> DevicePeak:
        """Spec peak FLOP/s of one device (rungs.metrics.device_peak), the MFU denominator."""
        ...

    def barrier(self) -> None:
        """Wait for every rank (a no-op in a one-process job)."""
        ...
