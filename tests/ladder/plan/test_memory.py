"""The memory planner against measured memory at small shapes on CPU (one process, 2 gloo ranks
dp=2, 2 gloo ranks ep=2 with and without a capacity factor, one expert-parallel layer call on its
own). Its arithmetic, search and input checks: tests/ladder/plan/test_memory_layout.py.

Measured, not derived: parameter, gradient and optimizer bytes are the storages of the real
tensors after a step; activation bytes are the storages autograd saves during one micro-batch
(`saved_tensors_hooks`, each storage once; parameters, gathered parameters and module buffers
excluded) plus the logits the step holds; the peak is torch's MemTracker over a whole optimizer step of two micro-batches
(so gradients exist while the second micro-batch's activations do, the steady state of
accumulation). The planner must land within 15% of each.
"""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.tensor import DTensor

from ladder.plan.memory import Layout, job_loss, memory_breakdown
from rungs.architecture import ModelConfig
from rungs.model import Transformer
from rungs.held_weights import held_expert_weights
from rungs.router import load_balancing_loss
from tests.rungs.parallel.spawn import run_ranks

# window = seq_len: every layer takes the flash (is_causal) kernel the GPU path uses for all layers
# (on CPU a narrower window runs a chunked SDPA that saves key/value copies a GPU does not make).
ARCH = ModelConfig(n_layers=2, d_model=64, n_heads=4, head_dim=16, n_kv_heads_global=1, n_kv_heads_local=2,
                   global_every=2, window_tokens=64, seq_len=64, n_experts=8, top_k=2, n_shared_experts=1,
                   latent_dim=32, expert_hidden=48, shared_hidden=40, vocab_size=2048)
MICRO, N_MICRO = 2, 2  # per rank: two micro-batches of two sequences
LB = 0.01
BF16 = [False]  # set by the bf16 test for the duration of its measurement


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if isinstance(t, DTensor) else t


def _storage_bytes(tensors) -> int:
    seen = {}
    for t in tensors:
        s = _local(t).untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def _loss(model, inputs, targets, loss: str, lbl_reduce=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The micro-batch's loss, and the logits the step holds until backward (None when chunked).
    bf16: under CPU autocast, as the job runs precision=bf16."""
    logits = None
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=BF16[0]):
        if loss == "chunked":
            ce, routes = model(inputs, targets)
        else:
            logits, routes = model(inputs)
    if loss != "chunked":
        ce = F.cross_entropy(logits.float().view(-1, ARCH.vocab_size), targets.reshape(-1))
    return ce + LB * load_balancing_loss(routes, ARCH.n_experts, ARCH.top_k, reduce_fn=lbl_reduce), logits


def _measure(model, optimizer, step_fn, batches, loss: str, lbl_reduce=None) -> dict[str, int]:
    """Step once (optimizer states exist), then measure the saved tensors of one micro-batch and the
    MemTracker peak of a whole step."""
    step_fn(batches, lambda: None)
    skip = {_local(t).untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    saved: dict[int, int] = {}

    def pack(t):
        # parameters, module buffers and FSDP2's gathered (unsharded) parameters, leaves that require
        # grad, are not activations: FSDP frees the gathered ones after forward (the planner's buffers)
        s, base = t.untyped_storage(), t if t._base is None else t._base
        if s.data_ptr() not in skip and not (base.is_leaf and base.requires_grad):
            saved[s.data_ptr()] = s.nbytes()
        return t

    inputs, targets = batches[0]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        value, logits = _loss(model, inputs, targets, loss, lbl_reduce)
    activations = sum(saved.values()) + (logits.untyped_storage().nbytes() if logits is not None else 0)
    del value, logits
    tracker = MemTracker()
    tracker.track_external(model, *optimizer.optimizers)
    with tracker:  # its module statistics are per forward: cleared before each micro-batch (the peak stays)
        step_fn(batches, tracker.reset_mod_stats)
    peak = tracker.get_tracker_snapshot("peak")
    params = _storage_bytes(model.parameters())
    states = [v for st in optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor) and v.ndim]
    return {"params": params, "grads": params, "optimizer": _storage_bytes(states), "activations": activations,
            "peak": sum(v["Total"] for v in peak.values())}


def _batches(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(rank)
    tokens = torch.randint(0, ARCH.vocab_size, (N_MICRO * MICRO, ARCH.seq_len + 1), generator=gen)
    return [(tokens[m * MICRO:(m + 1) * MICRO, :-1], tokens[m * MICRO:(m + 1) * MICRO, 1:]) for m in range(N_MICRO)]


def _single_process(loss: str, checkpointing: str = "none") -> dict[str, int]:
    from rungs.optim import build_optimizer

    torch.manual_seed(0)
    model = Transformer(dataclasses.replace(ARCH, activation_checkpointing=checkpointing))
    optimizer = build_optimizer(model, lr=1e-3, weight_decay=0.1)

    def step(batches, before_micro_batch):
        # as the job accumulates under bf16: the expert stacks cast once a step (rungs.torch_engine)
        with held_expert_weights(model) if BF16[0] and len(batches) > 1 else contextlib.nullcontext():
            for inputs, targets in batches:
                before_micro_batch()
                value, logits = _loss(model, inputs, targets, loss)  # the step holds the logits, as the jobs do
                (value / len(batches)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return _measure(model, optimizer, step, _batches(0), loss)


def _sharded(rank: int, world: int, ep: int, loss: str, precision: str, capacity_factor: float | None) -> dict[str, int]:
    from rungs.parallel.distributed import (build_optimizer, clip_grad_norm, lbl_reduce, parallelize,
                                            reduce_expert_grads, setup)

    BF16[0] = precision == "bf16"  # bf16: autocast, and FSDP's mixed precision (bf16 gathers, fp32 reduce)
    par = setup(ep=ep, device_type="cpu")
    torch.manual_seed(0)
    arch = dataclasses.replace(ARCH, capacity_factor=capacity_factor)
    model = parallelize(Transformer(arch), par, param_dtype=torch.bfloat16 if BF16[0] else None)
    optimizer = build_optimizer(model, par, lr=1e-3, weight_decay=0.1)

    def step(batches, before_micro_batch):  # rungs.parallel.distributed.train_step's collectives, loss path chosen here
        hold = BF16[0] and ep > 1 and len(batches) > 1  # as train_step: the local expert stacks held for the step
        with held_expert_weights(model) if hold else contextlib.nullcontext():
            for m, (inputs, targets) in enumerate(batches):
                before_micro_batch()
                model.set_requires_gradient_sync(m == len(batches) - 1)  # reduce once, in the last backward
                value, logits = _loss(model, inputs, targets, loss, lbl_reduce(par))  # logits held, as train_step
                (value / len(batches)).backward()
        reduce_expert_grads(par)
        clip_grad_norm(model, par, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    measured = _measure(model, optimizer, step, _batches(rank), loss, lbl_reduce(par))
    del measured["grads"]  # held unsharded between micro-batches, inside FSDP: in the MemTracker peak
    return measured


def _check(measured: dict[str, int], layout: Layout, loss: str) -> None:
    planned = memory_breakdown(ARCH, layout, accumulation_steps=N_MICRO, loss=loss).to_dict()
    print(layout, {k: (planned["total" if k == "peak" else k], v) for k, v in measured.items()})
    for key, value in measured.items():
        plan = planned["total" if key == "peak" else key]
        assert plan == pytest.approx(value, rel=0.15), f"{layout}: {key} planned {plan}, measured {value}"


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["chunked", "logits"])
def test_single_process_within_15_percent(loss):
    _check(_single_process(loss), Layout(dp=1, ep=1, micro_batch_sequences=MICRO, precision="fp32"), loss)


@pytest.mark.slow
def test_single_process_bf16_autocast_within_15_percent():
    BF16[0] = True
    try:
        measured = _single_process("chunked")
    finally:
        BF16[0] = False
    _check(measured, Layout(dp=1, ep=1, micro_batch_sequences=MICRO, precision="bf16"), "chunked")


@pytest.mark.slow
@pytest.mark.parametrize("checkpointing", ["selective", "full"])
def test_checkpointing_within_15_percent(checkpointing):
    layout = Layout(dp=1, ep=1, micro_batch_sequences=MICRO, checkpointing=checkpointing, precision="fp32")
    _check(_single_process("chunked", checkpointing), layout, "chunked")


TWO_RANK_LAYOUTS = [(1, "fp32", None), (2, "fp32", None), (1, "bf16", None), (2, "bf16", None), (2, "fp32", 1.5)]
EP_CAPACITY_FACTORS = [None, 1.5]
EP_SHAPE = (8, 2, 128, 256, 512)  # experts, top-k, latent, hidden, tokens a rank


def _two_layout(ep: int, precision: str, capacity_factor: float | None) -> Layout:
    return Layout(dp=2 // ep, ep=ep, micro_batch_sequences=MICRO, precision=precision, capacity_factor=capacity_factor)


# The two-rank measurements of a group of tests run one after another in one pair of gloo ranks: each
# builds its own model, optimizer (or layer) and process groups, and measures the bytes a pair of ranks
# of its own measures (checked, every layout); the pair pays the rank start and this module's imports
# (FSDP, DTensor, MemTracker: seconds a rank on a busy machine) once a group instead of once a test.
# Two groups, so that `-m "not slow"` runs the expert-parallel calls without the slow layouts.

def _measure_in_turn(rank: int, world: int, measurements: list[tuple], out) -> None:
    for key, fn, args in measurements:
        out[(key, rank)] = fn(rank, world, *args)


def _on_two_ranks(measurements: list[tuple]) -> dict:
    """{(key, rank): what `fn(rank, 2, *args)` returned} for each (key, fn, args)."""
    with torch.multiprocessing.Manager() as manager:
        out = manager.dict()
        run_ranks(_measure_in_turn, 2, measurements, out)
        return dict(out)


@pytest.fixture(scope="module")
def two_rank_layouts() -> dict:
    return _on_two_ranks([(layout, _sharded, (layout[0], job_loss(_two_layout(*layout)), *layout[1:]))
                          for layout in TWO_RANK_LAYOUTS])


@pytest.fixture(scope="module")
def expert_parallel_calls() -> dict:
    return _on_two_ranks([(factor, _ep_call, ((*EP_SHAPE, factor),)) for factor in EP_CAPACITY_FACTORS])


@pytest.mark.slow
@pytest.mark.parametrize("ep,precision,capacity_factor", TWO_RANK_LAYOUTS)
def test_two_ranks_within_15_percent(ep, precision, capacity_factor, two_rank_layouts):
    layout = _two_layout(ep, precision, capacity_factor)
    loss = job_loss(layout)  # the sharded step gives the model the targets: the chunked loss path
    for rank in range(2):
        _check(two_rank_layouts[((ep, precision, capacity_factor), rank)], layout, loss)


def _ep_call(rank: int, world: int, shape: tuple) -> dict[str, int]:
    """One ExpertParallelExperts call: its forward's transients (peak less what outlives the call) and
    its backward's peak, parameters and gradients left out (MemTracker's own categories)."""
    from rungs.moe import RoutedExperts
    from rungs.parallel.expert_parallel import ExpertParallelExperts

    E, k, lat, hid, tokens, factor = shape
    torch.manual_seed(0)
    ep = ExpertParallelExperts(RoutedExperts(E, lat, hid), torch.distributed.group.WORLD, capacity_factor=factor)
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(tokens, lat, generator=gen).requires_grad_(True)
    idx = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(tokens)])
    gate = torch.rand(tokens, k, generator=gen)
    ep(x, idx, gate).sum().backward()  # gradients exist, as from the second micro-batch on

    def measured(tracker: MemTracker, snapshot: str) -> int:
        (by_kind,) = tracker.get_tracker_snapshot(snapshot).values()
        return sum(v for kind, v in by_kind.items() if kind != "Total" and kind.value not in ("Parameter", "Gradient"))

    forward = MemTracker()
    forward.track_external(ep, x)
    with forward:
        y = ep(x, idx, gate)
    grad = torch.ones_like(y)
    backward = MemTracker()
    backward.track_external(ep, x)
    with backward:
        y.backward(grad)
    return {"forward": measured(forward, "peak") - measured(forward, "current"),
            "backward": measured(backward, "peak"), "rounds": ep.last_stats["rounds"]}


@pytest.mark.parametrize("capacity_factor", EP_CAPACITY_FACTORS)
def test_an_expert_parallel_call_within_15_percent(capacity_factor, expert_parallel_calls):
    """The exchange, compute and index buffers of one layer call (fp32, 2 gloo ranks, 8 experts top-2,
    512 tokens a rank): what the planner adds to a phase for the experts, against the measured call."""
    from ladder.plan.expert_memory import expert_backward, expert_forward

    E, k, lat, hid, tokens = EP_SHAPE
    out = {rank: expert_parallel_calls[(capacity_factor, rank)] for rank in range(2)}
    planned = {"forward": expert_forward(E, k, lat, hid, tokens, 2, 4, capacity_factor),
               "backward": expert_backward(E, k, lat, hid, tokens, 2, 4, capacity_factor)}
    for rank in range(2):
        assert out[rank]["rounds"] == 1
        for phase, plan in planned.items():
            assert plan == pytest.approx(out[rank][phase], rel=0.15), (capacity_factor, rank, phase, plan, out[rank])
