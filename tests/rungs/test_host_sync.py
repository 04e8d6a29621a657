"""No host synchronisation in a MoE training step: counted by op on the CPU (rungs.host_sync)."""

from __future__ import annotations

import math

import pytest
import torch

from rungs.host_sync import HostSyncCounter
from rungs.moe import RoutedExperts

torch.set_num_threads(1)

SMALL = dict(n_layers=2, d_model=32, n_heads=2, head_dim=16, n_kv_heads_global=1, n_kv_heads_local=2,
             global_every=2, window_tokens=8, seq_len=16, n_experts=4, top_k=2, n_shared_experts=1,
             latent_dim=16, expert_hidden=16, shared_hidden=32, vocab_size=64)


def test_counter_sees_every_kind_of_host_read():
    x = torch.randn(5, 3)
    with HostSyncCounter() as counter:
        x.sum().item()
        x.tolist()
        int(x[0, 0])
        bool(x[0, 0] > 0)
        torch.nonzero(x)
        x[x > 0]
        torch.bincount(torch.tensor([1, 2]))
        torch.repeat_interleave(torch.tensor([1, 2]))
    keys = "".join(counter.counts)
    for op in ("_local_scalar_dense", "tolist", "nonzero", "aten::index", "bincount", "repeat_interleave"):
        assert op in keys, counter.counts
    assert counter.total == 8, counter.counts                    # item, int, bool: three reads
    assert all(path.rsplit(":", 1)[0] == __file__ for path in counter.where.values()), counter.where
    with HostSyncCounter() as counter:     # static-size equivalents are not syncs
        torch.repeat_interleave(torch.tensor([1, 2]), output_size=3)
        torch.zeros(3, dtype=torch.long).scatter_add_(0, torch.tensor([1, 1]), torch.ones(2, dtype=torch.long))
        x.sum()
    assert counter.total == 0, counter.counts


@pytest.mark.parametrize("capacity,group_size", [(None, None), (1, 2), (3, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_routed_experts_forward_and_backward_have_no_host_sync(capacity, group_size, dtype):
    torch.manual_seed(0)
    module = RoutedExperts(4, 8, 16, capacity_per_expert=capacity, group_size=group_size)
    x = torch.randn(24, 8, requires_grad=True)
    gate = torch.rand(24, 2, requires_grad=True)
    idx = torch.full((24, 2), 3)                                   # worst skew: every pair on one expert
    with HostSyncCounter() as counter:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            out = module(x, idx, gate)
        out.float().square().sum().backward()
    assert counter.total == 0, (counter.counts, counter.where)
    assert int(module.last_rounds) == module.last_stats["rounds"]               # the device copy of the stat
    assert module.last_stats["computed_rounds"] == (1 if capacity is None else -(-48 // module.last_stats["buffer_rows"]))


def test_the_loop_backend_reads_offsets_on_the_host():
    """The reference path (one mm per expert) needs host offsets: the counter must see them."""
    module = RoutedExperts(4, 8, 16, backend="loop")
    with HostSyncCounter() as counter:
        module(torch.randn(6, 8), torch.randint(0, 4, (6, 2)), torch.rand(6, 2)).sum()
    assert counter.total > 0


@pytest.mark.parametrize("extra", [{}, {"capacity_per_expert": 1, "group_size": 2}])
def test_model_training_step_has_no_host_sync(extra):
    """Router, experts, losses, backward and the Muon step of the whole model. (AdamW reads its
    step counter, a CPU tensor even on a GPU, so no device sync there; on the CPU the counter cannot
    tell, so AdamW steps outside it.)"""
    from rungs.model import ModelConfig, Transformer
    from rungs.muon import Muon
    from rungs.router import load_balancing_loss, z_loss

    torch.manual_seed(0)
    cfg = ModelConfig(**SMALL, **extra)
    model = Transformer(cfg)
    matrices = [p for n, p in model.named_parameters() if p.ndim in (2, 3) and not n.startswith(("embed", "lm_head"))]
    others = [p for n, p in model.named_parameters() if not (p.ndim in (2, 3) and not n.startswith(("embed", "lm_head")))]
    muon = Muon(matrices, lr=0.01)
    adam = torch.optim.AdamW(others, lr=1e-3)
    tokens = torch.randint(0, 64, (2, 17))
    for step in range(2):                                         # the first step creates optimizer state
        counter = HostSyncCounter()
        with counter:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits, routes = model(tokens[:, :-1])
            ce = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
            loss = ce + 0.01 * load_balancing_loss(routes, cfg.n_experts, cfg.top_k) + 1e-3 * z_loss(routes)
            loss.backward()
            muon.step()
            muon.zero_grad(set_to_none=True)
        adam.step()
        adam.zero_grad(set_to_none=True)
        assert counter.total == 0, (step, counter.counts, counter.where)
        assert all(p.grad is None for p in matrices)


def test_accelerator_only_ignores_reads_of_cpu_tensors():
    with HostSyncCounter(accelerator_only=True) as counter:
        torch.ones(3).sum().item()
        torch.nonzero(torch.ones(3))
    assert counter.total == 0


@pytest.mark.parametrize("accelerator_only", [False, True])
def test_counter_sees_blocking_copies_of_host_memory_to_a_device(accelerator_only):
    """A blocking host-to-device copy waits for every queued kernel (CUDA copies pageable memory with
    a stream synchronisation). The meta device stands in for a GPU: the copies are the same aten calls."""
    host = torch.ones(3)
    with HostSyncCounter(accelerator_only=accelerator_only) as counter:
        host.to("meta")
        torch.empty(3, device="meta").copy_(host)
    assert counter.counts == {"aten::_to_copy (to-device)": 1, "aten::copy_ (to-device)": 1}, counter.counts
    with HostSyncCounter(accelerator_only=accelerator_only) as counter:     # what a step may do instead
        host.to("meta", non_blocking=True)
        torch.empty(3, device="meta").copy_(host, non_blocking=True)
        torch.full((), 0.5, dtype=torch.float64, device="meta")             # a fill on the device, no copy
        torch.ones(3, device="meta") * 0.5
        host.to(torch.float64)
    assert counter.total == 0, counter.counts


def test_counter_sees_device_tensors_made_from_host_data():
    """`torch.as_tensor(0.5, device=x.device)` copies inside one C++ call that no dispatch mode sees
    (activation clipping's history threshold did this once per clip and micro-batch: a sync each on a
    GPU); the counter sees the call itself, on the CPU with any device, as it sees reads."""
    x = torch.ones(3)
    with HostSyncCounter() as counter:
        torch.as_tensor(0.5, dtype=torch.float64, device=x.device)
        torch.tensor([1.0, 2.0], device="meta")
        torch.asarray([3.0], device=x.device)
    assert counter.counts == {"torch.as_tensor (to-device)": 1, "torch.tensor (to-device)": 1,
                              "torch.asarray (to-device)": 1}, counter.counts
    assert counter.where["torch.as_tensor (to-device)"].rsplit(":", 1)[0] == __file__
    with HostSyncCounter() as counter:                                      # host tensors, device tensors
        torch.as_tensor(0.5)
        torch.tensor([1.0])
        torch.as_tensor(x, device=x.device)
    assert counter.total == 0, counter.counts


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA device: torch.cuda.set_sync_debug_mode exists only there; the CPU "
                           "tests above count the same ops by dispatch")
def test_a_cuda_training_step_never_synchronises():
    """The job's step (micro-batches, activation clipping with a history threshold, grad-norm clip,
    Muon + AdamW) under `set_sync_debug_mode("error")`, which raises at any synchronising CUDA call;
    its statistics are read after it, as the loop reads them."""
    from rungs.config import TrainConfig
    from rungs.torch_engine import TorchEngine, read_step_stats, train_step_on_device
    from tests.rungs.train_helpers import tiny_config

    cfg = TrainConfig(**tiny_config(device="cuda", micro_batch_sequences=2, precision="bf16"))
    engine = TorchEngine(cfg)
    engine.build()
    for step in range(2):          # optimizer state, AGC history, compiled attention, cuBLAS handles
        engine.train_step(step, 1.0)
    batch = engine.sampler.next_batch()
    engine.clipper.begin_step(2)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        stats = train_step_on_device(cfg, engine.model, engine.optimizer, batch, engine.clipper, None)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert engine.clipper.history_threshold(0, "residual") is not None      # the history path ran
    engine.clipper.end_step()
    assert all(map(math.isfinite, read_step_stats(stats).values()))



def _counting_compile():
    """torch.compile with a backend that counts its compilations and the runs of what it compiled."""
    calls = {"compiled": 0, "ran_compiled": 0}

    def backend(graph, example_inputs):
        calls["compiled"] += 1

        def run(*args):
            calls["ran_compiled"] += 1
            return graph.forward(*args)
        return run

    return calls, lambda fn: torch.compile(fn, backend=backend)


@pytest.mark.parametrize("accelerator_only", [False, True])
def test_compiled_code_runs_compiled_under_the_counter(accelerator_only):
    """FlexAttention on CUDA is compiled: under the counter it must run its compiled kernel, not the
    eager fallback that materialises every score (Dynamo's default under a user dispatch mode)."""
    calls, compile_ = _counting_compile()
    f = compile_(lambda x: (x.sin() * 2).cos())
    x = torch.randn(8)
    want = f(x)
    with HostSyncCounter(accelerator_only=accelerator_only) as counter:
        got = f(x)
        got.sum().item()                                           # a read outside the compiled region
    assert torch.equal(got, want) and calls["ran_compiled"] == 2
    # no torch-function mode on a GPU run: the cached code serves, nothing is recompiled
    assert calls["compiled"] == (2 if not accelerator_only else 1)
    assert counter.total == (1 if not accelerator_only else 0), counter.counts


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_a_higher_order_op_runs_whole_under_the_counter_and_is_named():
    """Eager FlexAttention is a higher-order op: torch refuses a dispatch mode that does not handle
    them (the GPU benchmark's counted step died on it); the counter runs it whole and names it."""
    from torch.nn.attention.flex_attention import flex_attention

    from rungs.attention import sliding_window_block_mask

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 128, 16, generator=g) for _ in range(3))
    block_mask = sliding_window_block_mask(128, 32, "cpu")
    want = flex_attention(q, k, v, block_mask=block_mask)
    with HostSyncCounter() as counter:
        got = flex_attention(q, k, v, block_mask=block_mask)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert counter.uninspected["flex_attention"] == 1 and counter.total == 0, (counter.uninspected, counter.counts)


@pytest.mark.parametrize("mode,granularity", [("median", "token"), ("fixed", "sequence")])
def test_activation_gradient_clipping_reads_the_host_only_after_the_step(mode, granularity):
    """AGC clips on the device in backward; its statistics and events are read once, at end_step,
    and equal those of a clipper that reads them at every clip (same events, rates, history)."""
    from rungs.agc import ActivationGradClipper, AGCSettings, event_record
    from rungs.model import ModelConfig, Transformer

    class ReadAtEveryClip(ActivationGradClipper):
        def _clip(self, grad, layer, point):
            out = super()._clip(grad, layer, point)
            self.flush()
            return out

    settings = AGCSettings(mode=mode, threshold=1.5 if mode == "median" else 1e-3, granularity=granularity,
                           max_logged_events_per_step=5)
    tokens = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    runs = []
    for cls in (ActivationGradClipper, ReadAtEveryClip):
        torch.manual_seed(0)
        model = Transformer(ModelConfig(**SMALL))
        clipper = cls(settings)
        model.activation_clip = clipper
        rates = []
        for step in range(3):
            clipper.begin_step(step)
            clipper.begin_micro_batch(tokens)
            with HostSyncCounter() as counter:
                logits, _ = model(tokens)
                logits.square().mean().backward()
            if cls is ActivationGradClipper:
                assert counter.total == 0, (counter.counts, counter.where)
                assert clipper._pending                           # statistics still on the device
            rates.append(clipper.end_step())
            assert not clipper._pending
            model.zero_grad(set_to_none=True)
        runs.append((rates, [event_record(e) for e in clipper.drain_events()], clipper.state_dict()))
    assert runs[0] == runs[1]
    rates, events, _ = runs[0]
    assert 0 < rates[-1] <= 1 and 0 < len(events) <= 15 and all(e["ratio"] > 1 for e in events)
    assert all(sum(e["step"] == s for e in events) <= 5 for s in range(3))      # the per-step budget


class _EveryPlace(HostSyncCounter):
    """Records every place a sync happens (the base class keeps only each op's first)."""

    def __init__(self) -> None:
        super().__init__()
        self.places: list[tuple[str, str]] = []

    def _record(self, key: str) -> None:
        super()._record(key)
        frames = [f for f in __import__("traceback").extract_stack() if "/torch/" not in f.filename
                  and not f.filename.endswith("host_sync.py") and f.filename != __file__]
        self.places.append((key, f"{frames[-1].name}:{frames[-1].line}"))


@pytest.mark.parametrize("overrides", [{"agc": False}, {"micro_batch_sequences": 2, "grad_clip": 1e-3},
                                       {"agc_mode": "fixed", "agc_threshold": 1e-4, "grad_clip": None},
                                       {"micro_batch_sequences": 2, "precision": "bf16"}])  # expert stacks held
def test_the_single_process_step_reads_the_host_once_after_the_optimizer(overrides):
    """`TorchEngine.train_step`: micro-batches, losses, MoE statistics, the grad-norm clip and Muon
    leave their numbers on the device, read in one transfer at the step's end, and activation gradient
    clipping reads its statistics once, after that. (AdamW reads its step counter, a CPU tensor even on
    a GPU: the only other read, inside the optimizer.)"""
    from rungs.config import TrainConfig
    from rungs.torch_engine import TorchEngine
    from tests.rungs.train_helpers import tiny_config

    engine = TorchEngine(TrainConfig(**tiny_config(**overrides)))
    engine.build()
    engine.train_step(0, 1.0)                                     # creates the optimizer state
    counter = _EveryPlace()
    with counter:
        stats = engine.train_step(1, 1.0)
    assert all(isinstance(v, float) for v in stats.values()), stats
    # Clip events decode their context from the batch's host copy (a CPU tensor on a GPU too).
    outside_optimizer = [(k, where) for k, where in counter.places
                         if not where.startswith(("step:", "_single", "_record:ids = cur.inputs"))]
    agc_read = ["flush"] if engine.clipper is not None else []
    assert [where.split(":")[0] for _, where in outside_optimizer] == ["read_step_stats", *agc_read], outside_optimizer
