"""Three training steps sharded (DP only, EP only, DP × EP) equal the single-process run.

Real gloo processes; a tiny rung model (2 layers, 4 experts, top-2, latent MoE, shared expert)
with the load-balancing loss and gradient clipping on, Muon for matrices and expert stacks, AdamW
for the rest. The reference is `rungs.optim.build_optimizer` on one process over the whole batch.
FP32 communication must agree within 1e-5 relative; BF16 communication within bf16 rounding (for the Muon
matrices, as Newton-Schulz amplifies it at each matrix's spectrum: see NS_DIFF_BF16).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from rungs.parallel.distributed import build_optimizer, lbl_reduce, parallelize, reduce_expert_grads, setup, train_step
from rungs.model import ModelConfig, Transformer
from rungs.muon import SIMPLE_COEFFICIENTS
from rungs.optim import MUON_ROLES, clip_grad_norm_, param_role
from rungs.optim import build_optimizer as single_optimizer
from rungs.router import load_balancing_loss
from tests.rungs.parallel.spawn import run_ranks

CFG = ModelConfig(n_layers=2, d_model=16, n_heads=2, head_dim=8, n_kv_heads_global=1, n_kv_heads_local=2,
                  global_every=2, window_tokens=4, seq_len=8, n_experts=4, top_k=2, n_shared_experts=1,
                  latent_dim=8, expert_hidden=12, shared_hidden=12, vocab_size=48,
                  capacity_per_expert=3, group_size=1)
LR, WD, LB, CLIP, STEPS, SEQS_PER_RANK = 0.02, 0.1, 0.01, 0.5, 3, 2
# The 1-D parameters (norms, router, biases) are AdamW's: a step moves an entry by about LR (m̂/√v̂ is O(1)),
# and with bf16 communication the reduced gradient that step reads is rounded (unit roundoff 2^-8), so each
# step may differ from the float32 reference by ~LR·2^-8, and STEPS steps by their sum: 2.3e-4. Measured on a
# 2-core AVX2 machine: 1.23e-4 and 1.38e-4 (layers.0.moe_norm.weight, dp=2 ep=2), which the former ad hoc
# 1e-4 refused. (That bound had never run in `make test`: the folder was named `dist`, one of pytest's
# default norecursedirs, so the suite skipped every test in it; tests/test_collection.py now guards that.)
ADAMW_BF16_BOUND = STEPS * LR * 2.0**-8
# The Muon matrices: a step moves an entry by lr·scale·O, O = NS(U) the Newton-Schulz of the update U. Both runs
# round U to bf16 (the single process to run Newton-Schulz in bf16, the sharded one to send it, the same cast of
# the same float32 value) and run the same bf16 Newton-Schulz (bit for bit equal outputs for equal inputs), so
# they part only where a float32 reduction-order difference in the gradient flips a bf16 rounding (step 1 of the
# dp=2 x ep=2 run: one-unit flips in 2 of 126 matrices) and then by the weights' drift. Newton-Schulz amplifies an input
# difference by its sensitivity at U: it maps each singular value s of U/||U||_F to q(s) = p(p(p(p(p(s))))),
# p(x) = a x + b x^3 + c x^5, and the derivative of such a matrix function is bounded by the divided differences
# of q over the spectrum: q'(s) and, for the singular vectors' rotations, q(s)/s, both largest at the smallest
# singular value (a^5 = 487 at 0). Rounding moves U/||U||_F by about eps = 2^-8/sqrt(m n) along any one
# singular direction (a unit roundoff's Frobenius norm spread over m n entries), so each run's output there may
# move by gain·eps and the two differ by up to 2·gain·eps, on top of O's own bf16 rounding (2^-6, a few bf16
# units of a unit-scale entry). `_ns_gain` evaluates the gain on the spectrum of the first step's gradient (the
# first update is a multiple of it; later updates average it with the next gradients, measured to keep its
# smallest singular values: layers.1.attn.wo's 5.8e-5 at step 1, 5.7e-5 at step 2). The MoE and latent
# matrices have s_min of 6e-3 to 0.12 and gains of 16-170, the attention projections gains of 32-485.
# layers.1.attn.wo's gradient has s_min = 4.8e-5, below eps = 2.4e-4 (its input, two query heads sharing one
# key/value head under nearly uniform attention at init, has eight directions at <1e-3 of the largest), so
# rounding alone sets those singular values and Newton-Schulz multiplies them by 487: measured 2.75e-3 against
# a bound of 1.2e-2 there (dp=2 x ep=2 on a 2-core AVX2 machine, bf16 emulated in float32, equal to native bf16
# on these inputs), at most 0.34 of its bound elsewhere. Rank 0 applying its shards' updates twice, or rank 1's
# shards dropped from the exchange, puts each of the 24 Muon matrices past its bound (by 1.2x to 20x).
NS_DIFF_BF16 = 2.0**-6


def _ns_gain(grad: torch.Tensor) -> tuple[float, float]:
    """(gain, eps): the largest of q'(s) and q(s)/s over the spectrum of grad / ||grad||_F (each matrix of a
    stack) widened down by eps, and eps = 2^-8 / sqrt(m n), the bf16 rounding's reach on one direction."""
    m, n = grad.shape[-2:]
    eps = 2.0**-8 / (m * n) ** 0.5
    g = grad.double().reshape(-1, m, n)
    s_min = float((torch.linalg.svdvals(g) / g.norm(dim=(-2, -1), keepdim=True)[..., 0]).min())
    s = torch.linspace(max(s_min - eps, 1e-12), 1.0, 4001, dtype=torch.float64)
    q, slope = s.clone(), torch.ones_like(s)
    a, b, c = SIMPLE_COEFFICIENTS
    for _ in range(5):
        q, slope = a * q + b * q**3 + c * q**5, (a + 3 * b * q**2 + 5 * c * q**4) * slope
    return max(float(q[0] / s[0]), float(slope.abs().max())), eps


def _batches(world: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(11)
    return [torch.randint(0, CFG.vocab_size, (world * SEQS_PER_RANK, CFG.seq_len + 1), generator=gen)
            for _ in range(STEPS)]


def _loss(model, inputs, targets, reduce_fn=None):
    logits, routes = model(inputs)
    ce = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
    return ce + LB * load_balancing_loss(routes, CFG.n_experts, CFG.top_k, reduce_fn=reduce_fn)


def _single(world: int, ns_dtype) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = Transformer(CFG)
    batch = _batches(world)[0]
    _loss(model, batch[:, :-1], batch[:, 1:]).backward()
    first_grads = {f"grad:{n}": p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    opt = single_optimizer(model, lr=LR, weight_decay=WD)
    if ns_dtype is None:
        opt.muon.ns_dtype = None
    norms = []
    for batch in _batches(world):
        logits, routes = model(batch[:, :-1])
        ce = F.cross_entropy(logits.view(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
        (ce + LB * load_balancing_loss(routes, CFG.n_experts, CFG.top_k)).backward()
        norms.append(clip_grad_norm_(model, CLIP))
        opt.step()
        opt.zero_grad()
    # Muon and Adam hardly see a uniform gradient scale; the gradient norm does
    return {n: p.detach() for n, p in model.named_parameters()} | {"grad_norms": torch.tensor(norms)} | first_grads


def _sharded(rank: int, world: int, dp: int, ep: int, comm) -> dict[str, torch.Tensor]:
    par = setup(dp, ep)
    torch.manual_seed(0)
    model = parallelize(Transformer(CFG), par)
    ns_dtype = None if comm == torch.float32 else torch.bfloat16
    opt = build_optimizer(model, par, lr=LR, weight_decay=WD, comm_dtype=comm, ns_dtype=ns_dtype)
    rows = slice(rank * SEQS_PER_RANK, (rank + 1) * SEQS_PER_RANK)
    batch = _batches(world)[0]
    _loss(model, batch[rows, :-1], batch[rows, 1:], lbl_reduce(par)).backward()
    reduce_expert_grads(par)
    first_grads = {f"grad:{n}": _whole(p.grad, par, ep) for n, p in model.named_parameters()}
    model.zero_grad()
    norms = []
    for batch in _batches(world):
        stats = train_step(model, opt, par, batch[rows, :-1], batch[rows, 1:], n_experts=CFG.n_experts,
                           top_k=CFG.top_k, lb_loss_coef=LB, grad_clip=CLIP)
        norms.append(stats["grad_norm"])
    assert stats["moe_rounds_max"] >= 1
    return {n: _whole(p, par, ep) for n, p in model.named_parameters()} | first_grads | {
        "grad_norms": torch.tensor(norms)}


def _whole(t: torch.Tensor, par, ep: int) -> torch.Tensor:
    if isinstance(t, torch.distributed.tensor.DTensor):
        return t.full_tensor().detach()
    parts = [torch.empty_like(t.detach()) for _ in range(ep)]  # an expert-parallel slice: gather the stack
    dist.all_gather(parts, t.detach().contiguous(), group=par.ep_group)
    return torch.cat(parts)


def _compare(rank, got, ref, comm, label):
    assert got.keys() == ref.keys()
    for name, r in ref.items():
        g = got[name]
        if comm == torch.float32 or name.startswith("grad:"):
            rel = float((g - r).norm() / r.norm())
            assert rel < 1e-5, f"rank {rank} {label} {name}: relative error {rel:.2e}"
        elif name == "grad_norms":  # measured before the optimizer: only reduction order differs
            assert torch.allclose(g, r, rtol=1e-4), f"rank {rank} {label}: grad norms {g} vs {r}"
        else:  # 3 steps, each moving an entry by lr·scale·O with O's bf16 rounding and Newton-Schulz's gain on it
            per_step = NS_DIFF_BF16
            if param_role(name, r) in MUON_ROLES:
                gain, eps = _ns_gain(ref[f"grad:{name}"])
                per_step += 2 * gain * eps
            bound = STEPS * LR * 0.2 * max(r.shape[-2:]) ** 0.5 * per_step if r.ndim >= 2 else ADAMW_BF16_BOUND
            err = float((g - r).abs().max())
            assert err <= bound, f"rank {rank} {label} {name}: max error {err:.2e} > {bound:.2e}"


def _worker(rank: int, world: int, layouts: list[tuple[int, int, torch.dtype]]) -> None:
    refs = {}
    for dp, ep, comm in layouts:
        key = comm == torch.float32
        if key not in refs:
            refs[key] = _single(world, None if key else torch.bfloat16)
        _compare(rank, _sharded(rank, world, dp, ep, comm), refs[key], comm, f"dp={dp} ep={ep} {comm}")


def test_two_ranks_dp_only_and_ep_only_equal_single_process():
    run_ranks(_worker, 2, [(2, 1, torch.float32), (1, 2, torch.float32)])


def test_four_ranks_dp_ep_equal_single_process():
    run_ranks(_worker, 4, [(2, 2, torch.float32), (4, 1, torch.float32), (1, 4, torch.float32)])


def test_four_ranks_dp_ep_bf16_comm_equal_single_process():
    run_ranks(_worker, 4, [(2, 2, torch.bfloat16)])
