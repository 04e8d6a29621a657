"""The sharded model from the meta device (`rungs.parallel.distributed.build_model`), FSDP2 mixed
precision, and gradient accumulation with one reduce per step.

- Initialised shard by shard, each layout (FSDP alone with rows that do not split evenly, FSDP x EP)
  holds exactly the single-process model of the same seed, and leaves the generator where the
  single-process build leaves it.
- L18 of mai-base-2 at its real widths with 1 layer and all 512 experts, over 4 ranks: each rank's
  peak resident memory while building is a quarter of the whole model's parameters (within 10%).
  No rank ever holds the whole model.
- The same structure (L18's heads, GQA, latent MoE with a shared expert, 512 experts, top-7) at
  reduced widths and vocabulary: 3 steps from the meta device on 4 ranks equal the single-process
  run, and the sharded checkpoint they write loads into a freshly materialised model. (At the real
  widths the 3 steps do not fit the test machine: the single-process reference needs ~30 GB with
  gradients and optimizer states, and one Newton-Schulz of a 2048 x 1536 attention matrix takes
  ~6 s on a CPU core, 18 of them per step.)
- Accumulating two micro-batches with FSDP's gradient sync off until the last equals reducing each
  micro-batch, with half the reduce-scatters.
- bf16 mixed precision (bf16 gathers, fp32 reductions and master weights) stays close to fp32.

The 4-rank tests share one launch, and so do the 2-rank tests (tests/rungs/parallel/shared_launch.py):
each test's rank function, with every assertion it makes, runs in turn in the same rank processes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from ladder.plan.resolve import resolve_train_config
from rungs.architecture import parameter_shapes
from rungs.config import parse_config
from rungs.model import ModelConfig, Transformer
from rungs.optim import build_optimizer as single_optimizer
from rungs.optim import clip_grad_norm_
from rungs.parallel import dist_checkpoint
from rungs.parallel.distributed import build_model, build_optimizer, setup, train_step
from rungs.router import load_balancing_loss
from tests.rungs.parallel.shared_launch import PartTable, SharedLaunch, launch_selected
from tests.rungs.parallel.test_distributed_train import CFG, _whole

# vocab 49 over 4 ranks: FSDP's chunks are 13, 13, 13, 10 rows
UNEVEN = dataclasses.replace(CFG, vocab_size=49)
LR, WD, LB, CLIP, STEPS = 0.02, 0.1, 0.01, 0.5, 3


def l18(n_layers: int = 2) -> ModelConfig:
    """mai-base-2 L18's architecture (what `ladder plan mai-base-2 --rungs 18 --json` prints) with fewer layers."""
    cfg = parse_config(resolve_train_config("mai-base-2", 18, {"tracking_uri": None}))
    return dataclasses.replace(cfg.architecture(), n_layers=n_layers)


def l18_reduced() -> ModelConfig:
    """L18's structure and expert count at widths a CPU trains in seconds; global_every=2 so both
    attention kinds are in the two layers."""
    return dataclasses.replace(l18(), d_model=48, head_dim=8, n_heads=4, n_kv_heads_global=2, n_kv_heads_local=4,
                               global_every=2, window_tokens=4, seq_len=8, latent_dim=16, expert_hidden=16,
                               shared_hidden=24, vocab_size=96)


def _init_worker(rank: int, world: int) -> None:
    torch.manual_seed(5)
    ref = Transformer(UNEVEN)
    after = torch.get_rng_state()
    ref_buffers = dict(ref.named_buffers())
    for dp, ep in ((world, 1), (2, 2)):  # FSDP with uneven rows; FSDP x expert-parallel slices
        par = setup(dp, ep)
        torch.manual_seed(5)
        model = build_model(UNEVEN, par)
        assert torch.equal(torch.get_rng_state(), after), f"dp={dp} ep={ep}: the generator moved differently"
        for name, p in model.named_parameters():
            assert torch.equal(_whole(p.detach(), par, ep), ref.state_dict()[name]), f"dp={dp} ep={ep} {name}"
        for name, b in model.named_buffers():
            assert torch.equal(b, ref_buffers[name]), f"dp={dp} ep={ep} buffer {name}"


def test_meta_built_shards_hold_the_single_process_model_in_each_layout(four_ranks: SharedLaunch):
    four_ranks.check("test_meta_built_shards_hold_the_single_process_model_in_each_layout")


def _resident_bytes() -> tuple[int, int]:
    """(current, peak) resident set size of this process, from /proc (peak: VmHWM)."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024


def _memory_worker(rank: int, world: int, arch: ModelConfig, whole_bytes: int) -> None:
    par = setup(world, 1)
    before, peak_before = _resident_bytes()
    model = build_model(arch, par)
    _, peak = _resident_bytes()
    local = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    quarter = whole_bytes / world
    assert local == quarter, f"rank {rank}: {local} bytes of parameters, a quarter of the whole is {quarter}"
    # The peak is the build's only if it set a new high-water mark (it allocates GBs above the start).
    assert peak > peak_before, f"rank {rank}: the build never rose above the earlier peak {peak_before}"
    grown = peak - before
    assert 0.9 * quarter <= grown <= 1.1 * quarter, (
        f"rank {rank}: resident memory rose by {grown / 2**30:.2f} GiB while building, a quarter of the whole "
        f"model is {quarter / 2**30:.2f} GiB")
    print(f"rank {rank}: peak growth {grown / 2**30:.3f} GiB, quarter {quarter / 2**30:.3f} GiB, "
          f"maxrss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


# ~18 s on two idle cores: every rank walks the random stream once over the whole model (1.3e9 draws
# at ~5 ns of CPU each, rungs.init_stream), four ranks on two cores.
# One layer, not two: the walk is CPU time and never memory, and the memory checked here (each parameter's
# local rows allocated, then drawn a bounded chunk at a time) is the same per parameter in any number of
# blocks; one block holds every kind of parameter of L18 (its layers are all local-attention blocks with
# the same shapes), at its real widths and 512 experts. What a bug would add (the embedding or an expert
# stack drawn whole: +0.56 or +0.84 GiB; a block gathered; the model held) is over the 10% bound at either
# depth (0.12 GiB with one layer, 0.21 with two). Measured (2026-12-06): growth 1.285 GiB for a 1.237 GiB
# quarter with one layer, 2.149 for 2.098 with two; 43 instead of 72 CPU-seconds for the four ranks.
@pytest.mark.slow
def test_l18_widths_512_experts_from_meta_device_each_rank_holds_a_quarter(four_ranks: SharedLaunch):
    arch = l18(n_layers=1)
    assert (arch.d_model, arch.n_experts, arch.latent_dim, arch.expert_hidden, arch.vocab_size) == (
        1536, 512, 768, 768, 131072)
    four_ranks.check("test_l18_widths_512_experts_from_meta_device_each_rank_holds_a_quarter")


def _l18_memory_part(rank: int, world: int) -> None:
    arch = l18(n_layers=1)
    whole = sum(torch.Size(s).numel() for s in parameter_shapes(arch).values()) * 4  # fp32
    _memory_worker(rank, world, arch, whole)


def _batches(arch: ModelConfig, sequences: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(11)
    return [torch.randint(0, arch.vocab_size, (sequences, arch.seq_len + 1), generator=gen) for _ in range(STEPS)]


def _sharded_run(rank: int, world: int, arch: ModelConfig, dp: int, ep: int, ckpt: Path | None):
    par = setup(dp, ep)
    torch.manual_seed(0)
    model = build_model(arch, par)
    opt = build_optimizer(model, par, lr=LR, weight_decay=WD, comm_dtype=torch.float32, ns_dtype=None)
    rows = slice(rank, rank + 1)
    for batch in _batches(arch, world):
        train_step(model, opt, par, batch[rows, :-1], batch[rows, 1:], n_experts=arch.n_experts, top_k=arch.top_k,
                   lb_loss_coef=LB, grad_clip=CLIP)
    trained = {n: _whole(p, par, ep) for n, p in model.named_parameters()}
    if ckpt is not None:  # the sharded checkpoint loads straight into a freshly materialised model
        dist_checkpoint.save(ckpt, model, opt, par, extra={"step": STEPS})
        torch.manual_seed(1)
        fresh = build_model(arch, par)
        fresh_opt = build_optimizer(fresh, par, lr=LR, weight_decay=WD, comm_dtype=torch.float32, ns_dtype=None)
        assert dist_checkpoint.load(ckpt, fresh, fresh_opt, par) == {"step": STEPS}
        for name, p in fresh.named_parameters():
            assert torch.equal(_whole(p, par, ep), trained[name]), f"rank {rank}: {name} not restored"
    return trained


def _steps_worker(rank: int, world: int, tmp: Path) -> None:
    arch = l18_reduced()
    # The single-process reference is deterministic (seeded, one thread): rank 0 computes it once for
    # every rank instead of each of the four computing the same numbers.
    shared = [_single_run(arch, world, autocast=False)[0] if rank == 0 else None]
    dist.broadcast_object_list(shared, src=0)
    ref = shared[0]
    for dp, ep, ckpt in ((world, 1, tmp / "fsdp"), (2, 2, None)):
        got = _sharded_run(rank, world, arch, dp, ep, ckpt)
        for name, r in ref.items():
            rel = float((got[name] - r).norm() / r.norm())
            assert rel < 1e-5, f"rank {rank} dp={dp} ep={ep} {name}: relative error {rel:.2e}"


@pytest.mark.slow
def test_l18_structure_three_steps_from_meta_device_equal_single_process(four_ranks: SharedLaunch):
    arch = l18_reduced()
    assert arch.n_experts == 512 and arch.top_k == 7
    four_ranks.check("test_l18_structure_three_steps_from_meta_device_equal_single_process")


@contextlib.contextmanager
def _count_reduce_scatters() -> Iterator[list[int]]:
    """Count FSDP2's reduce-scatters (it calls dist.reduce_scatter_single) in this process while the
    block runs; the real function is put back after it (the rank process runs other tests' parts)."""
    calls = [0]
    real = dist.reduce_scatter_single

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)
    dist.reduce_scatter_single = counted
    try:
        yield calls
    finally:
        dist.reduce_scatter_single = real


def _accumulation_worker(rank: int, world: int) -> None:
    with _count_reduce_scatters() as calls:
        _accumulate(rank, world, calls)


def _accumulate(rank: int, world: int, calls: list[int]) -> None:
    batches = _batches(CFG, 2 * world)  # 2 sequences per rank: 2 micro-batches of 1
    results, counts = {}, {}
    for defer in (False, True):
        par = setup(world, 1)
        torch.manual_seed(0)
        model = build_model(CFG, par)
        opt = build_optimizer(model, par, lr=LR, weight_decay=WD, comm_dtype=torch.float32, ns_dtype=None)
        rows = slice(2 * rank, 2 * rank + 2)
        calls[0] = 0
        losses = [train_step(model, opt, par, b[rows, :-1], b[rows, 1:], n_experts=CFG.n_experts, top_k=CFG.top_k,
                             lb_loss_coef=LB, grad_clip=CLIP, micro_batches=2, defer_grad_sync=defer)["loss"]
                  for b in batches]
        counts[defer] = calls[0]
        results[defer] = {n: _whole(p, par, 1) for n, p in model.named_parameters()} | {
            "losses": torch.tensor(losses)}
    assert counts[True] * 2 == counts[False] > 0, f"reduce-scatters: deferred {counts[True]}, each micro-batch {counts[False]}"
    for name, synced in results[False].items():
        rel = float((results[True][name] - synced).norm() / synced.norm())
        assert rel < 1e-5, f"rank {rank} {name}: deferred sync differs by {rel:.2e} relative"


def test_accumulation_without_a_reduce_per_micro_batch_equals_reducing_each(two_ranks: SharedLaunch):
    two_ranks.check("test_accumulation_without_a_reduce_per_micro_batch_equals_reducing_each")


def _single_run(arch: ModelConfig, sequences: int, autocast: bool) -> tuple[dict[str, torch.Tensor], list[float]]:
    """The single-process run (fp32, or bf16 autocast as `rungs.torch_engine` runs it); params and losses."""
    torch.manual_seed(0)
    model = Transformer(arch)
    opt = single_optimizer(model, lr=LR, weight_decay=WD)
    opt.muon.ns_dtype = None
    losses = []
    for batch in _batches(arch, sequences):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits, routes = model(batch[:, :-1])
        ce = F.cross_entropy(logits.float().view(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
        (ce + LB * load_balancing_loss(routes, arch.n_experts, arch.top_k)).backward()
        losses.append(float(ce))
        clip_grad_norm_(model, CLIP)
        opt.step()
        opt.zero_grad()
    return {n: p.detach() for n, p in model.named_parameters()}, losses


def _distance(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> float:
    """|got - ref| / |ref| over all parameters together."""
    diff = sum(float((got[n] - r).square().sum()) for n, r in ref.items())
    return (diff / sum(float(r.square().sum()) for r in ref.values())) ** 0.5


def _precision_worker(rank: int, world: int) -> None:
    batches = _batches(CFG, world)
    rows = slice(rank, rank + 1)
    par = setup(world, 1)
    torch.manual_seed(0)
    model = build_model(CFG, par, param_dtype=torch.bfloat16)
    seen = []
    model.layers[0].register_forward_pre_hook(lambda m, args: seen.append(m.attn.wq.weight.dtype))
    opt = build_optimizer(model, par, lr=LR, weight_decay=WD, comm_dtype=torch.float32, ns_dtype=None)
    losses = [train_step(model, opt, par, b[rows, :-1], b[rows, 1:], n_experts=CFG.n_experts, top_k=CFG.top_k,
                         lb_loss_coef=LB, grad_clip=CLIP, autocast_dtype=torch.bfloat16)["loss"] for b in batches]
    # the block computes with the bf16 parameters FSDP gathered; the shards the optimizer updates stay fp32
    assert set(seen) == {torch.bfloat16}, f"block 0 computed with {seen}"
    assert all(p.dtype == torch.float32 for p in model.parameters())
    mixed = {n: _whole(p, par, 1) for n, p in model.named_parameters()}
    fp32, fp32_losses = _single_run(CFG, world, autocast=False)
    autocast, _ = _single_run(CFG, world, autocast=True)
    # bf16 rounding moves a loss by ~1e-4 here (measured: one-process autocast 1.2e-4, sharded 5e-5)
    assert max(abs(a - b) for a, b in zip(losses, fp32_losses)) < 1e-3, f"losses {losses} vs fp32 {fp32_losses}"
    # Muon turns bf16 rounding of these small random-batch gradients into ~1-8% changes of single
    # matrices; mixed precision must stay as close to fp32 as bf16 autocast on one process does.
    ours, theirs = _distance(mixed, fp32), _distance(autocast, fp32)
    assert 0 < ours <= 1.5 * theirs, f"mixed precision is {ours:.2e} from fp32, one-process autocast {theirs:.2e}"


def test_bf16_mixed_precision_is_close_to_fp32(two_ranks: SharedLaunch):
    two_ranks.check("test_bf16_mixed_precision_is_close_to_fp32")


# The shared launches: each selected test's part, in the order below. The memory part goes first, in
# fresh rank processes as when it had its own launch: its peak is measured from the build's start.
FOUR_RANK_PARTS: PartTable = {
    "test_l18_widths_512_experts_from_meta_device_each_rank_holds_a_quarter": (_l18_memory_part, lambda tmp: ()),
    "test_meta_built_shards_hold_the_single_process_model_in_each_layout": (_init_worker, lambda tmp: ()),
    "test_l18_structure_three_steps_from_meta_device_equal_single_process": (_steps_worker, lambda tmp: (tmp,)),
}
TWO_RANK_PARTS: PartTable = {
    "test_accumulation_without_a_reduce_per_micro_batch_equals_reducing_each": (_accumulation_worker, lambda tmp: ()),
    "test_bf16_mixed_precision_is_close_to_fp32": (_precision_worker, lambda tmp: ()),
}


@pytest.fixture(scope="module")
def four_ranks(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> SharedLaunch:
    return launch_selected(request, tmp_path_factory.mktemp("four_ranks"), 4, FOUR_RANK_PARTS)


@pytest.fixture(scope="module")
def two_ranks(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> SharedLaunch:
    return launch_selected(request, tmp_path_factory.mktemp("two_ranks"), 2, TWO_RANK_PARTS)
