"""Muon: momentum, then Newton-Schulz orthogonalisation, for 2-D weights and stacks of matrices.

Math per matrix W (out, in) with gradient G, as torch.optim.Muon / KellerJordan Muon:
    B <- lerp(B, G, 1 - mu)                       (EMA momentum)
    U <- lerp(G, B, mu) if nesterov else B
    O <- NS5(U)                                   (approximately U V^T of U's SVD)
    W <- W * (1 - lr * wd)                        (decoupled decay, unadjusted lr)
    W <- W - lr * scale(out, in) * O
A 3-D parameter (E, out, in) (a per-expert stack) is E independent matrices: each is orthogonalised
on its own and scaled by its own (out, in).

Update-scale conventions are named by their formula (the `convention` attribute, logged by the train
loop), because the same names mean different formulas across codebases:
    "match_rms_adamw": 0.2*sqrt(max(fan_out,fan_in))    (Moonlight; reuse AdamW lr and wd)
    "original":        sqrt(max(1,fan_out/fan_in))      (KellerJordan; lr in spectral units)

Same-shape matrices are orthogonalised in batches (one batched Newton-Schulz call each) whose
working set fits a memory budget, `ns_chunk_bytes` (default: `ns_budget_bytes(device)`, 5% of a
GPU's memory, 1 GiB elsewhere): a batch holds as many whole matrices as the budget has room for
their Newton-Schulz working set (`ns_working_bytes`: the iterate and the next one, the Gram matrix
and its polynomial, in the Newton-Schulz dtype), so at mai-base-2 L18 widths an H200 orthogonalises
~1,500 experts of 768 x 768 a GEMM, not a fixed count. A stack of 512 experts or a model's 27,648
same-shape expert matrices is cut into slices of whole matrices, and momentum, Nesterov update,
decay and apply run slice by slice, so the optimizer's working memory is one chunk, not a copy of
every same-shape matrix. Each matrix's result does not depend on the chunking (batched matmuls
compute each batch element on its own).

Passes over the matrices per step: the momentum (one multi-tensor lerp in float32), the Nesterov
update written once, already in the Newton-Schulz dtype, into the batch the GEMMs read (no float32
copy, no concatenation, no cast), a max and a norm (reductions) and two scalings of the batch,
then the decay and the scaled update of the parameters (multi-tensor). The iterations themselves
are torch.optim.Muon's (baddbmm), so results match it bit for bit where the math matches.

Newton-Schulz is scale-invariant: X / ||X||_F with the norm clamped only at the smallest normal
float (a divide-by-zero guard), unlike the 1e-7 eps clamp that silently shrinks tiny updates; an
exact power-of-two prescale keeps ||X||_F representable for any finite input.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

import torch
from torch import Tensor

from rungs.cpu_bf16 import cpu_has_bf16_units

__all__ = ["CONVENTIONS", "Muon", "MuonConfigError", "NS_CHUNK_BYTES", "NS_PRESETS", "SIMPLE_COEFFICIENTS",
           "adjust_lr", "matrix_chunks", "newton_schulz", "ns_budget_bytes", "ns_flops", "ns_matrices_per_chunk",
           "ns_working_bytes"]

# KellerJordan's quintic: maximal slope at 0; singular values land in about [0.5, 1.5], not 1.
SIMPLE_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
# Named schedules: (per-iteration coefficients, safety factor on the Frobenius norm). "quintic" is
# microsoft/dion's per-step set (tighter around 1 in 5 steps); "polar_express" (dion default,
# modded-nanogpt) assumes X / (1.02 ||X||), so its safety factor travels with it.
NS_PRESETS: dict[str, tuple[tuple[tuple[float, float, float], ...], float]] = {
    "simple": ((SIMPLE_COEFFICIENTS,) * 5, 1.0),
    "quintic": (((4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
                 (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)), 1.0),
    "polar_express": (((8.1566, -22.4833, 15.8788), (4.0429, -2.8089, 0.5000), (3.8917, -2.7725, 0.5061),
                       (3.2858, -2.3681, 0.4645), (2.3465, -1.7098, 0.4232)), 1.02),
}
CONVENTIONS = {
    "match_rms_adamw": "0.2*sqrt(max(fan_out,fan_in))",
    "original": "sqrt(max(1,fan_out/fan_in))",
}
_TINY = torch.finfo(torch.float32).tiny
# The Newton-Schulz working set of one batched call off a GPU (Muon and DistMuon), and on a GPU the
# share of its memory (`ns_budget_bytes`).
NS_CHUNK_BYTES = 1 << 30
NS_DEVICE_MEMORY_SHARE = 0.05


class MuonConfigError(ValueError):
    """Invalid Muon configuration or parameter."""


def _schedule(coefficients, steps: int) -> tuple[list[tuple[float, float, float]], float]:
    if isinstance(coefficients, str):
        if coefficients not in NS_PRESETS:
            raise MuonConfigError(f"unknown Newton-Schulz preset {coefficients!r}; known: {sorted(NS_PRESETS)}")
        per_step, safety = NS_PRESETS[coefficients]
        return list(per_step), safety
    coefficients = tuple(coefficients)
    if len(coefficients) == 3 and all(isinstance(v, (int, float)) for v in coefficients):
        if not 1 <= steps < 100:
            raise MuonConfigError(f"steps must be in [1, 100), got {steps}")
        return [tuple(coefficients)] * steps, 1.0
    if not coefficients or any(len(t) != 3 for t in coefficients):
        raise MuonConfigError("coefficients must be (a, b, c), a sequence of such triples, or a preset name")
    return [tuple(t) for t in coefficients], 1.0


def newton_schulz(G: Tensor, steps: int = 5, coefficients=SIMPLE_COEFFICIENTS, *,
                  dtype: torch.dtype | None = torch.bfloat16, safety: float | None = None,
                  emulate: bool | None = None) -> Tensor:
    """Orthogonalise G (..., m, n), batched over leading dims; returns `dtype` (None: G's dtype).

    coefficients: one (a, b, c) used for each of `steps` iterations, one triple per iteration, or a
    preset name from NS_PRESETS (which brings its own safety factor; `safety` overrides it).
    The Gram matrix is formed on the smaller side (transpose when m > n). The same ops as
    torch.optim.Muon (addmm; baddbmm for batches), so 2-D results match it bit for bit in bf16.

    emulate (None: on a CPU tensor when `dtype` is narrower than float32 and the CPU has no bf16
    units, `rungs.cpu_bf16`): the same steps with every value that torch would hold in `dtype` held
    in float32 instead, rounded to `dtype` after each op where torch rounds (`_rounded_newton_schulz`).
    CPUs without bf16 units (AVX2) multiply bf16 15-17x slower than float32 (cpu-demo L6 matrices, one
    thread: 103 ms vs 6.7 ms for twelve 96x96), which made Newton-Schulz 62% of a cpu-demo training
    step. CPUs with them (AVX512-BF16) run the native path 2.2-2.9x faster than the emulated one at
    cpu-demo-d2 L13's matrices (208x208, 8x104x208; one thread). The results are bf16 values either
    way, equal to the native ones but for the order of the float32 sums inside a product
    (tests/rungs/test_muon.py measures how often a value moves by one bf16 unit in the last place).
    """
    if G.ndim < 2:
        raise MuonConfigError(f"newton_schulz needs a matrix or a batch of matrices, got shape {tuple(G.shape)}")
    per_step, preset_safety = _schedule(coefficients, steps)
    safety = preset_safety if safety is None else safety
    narrow = dtype is not None and dtype.is_floating_point and torch.finfo(dtype).bits < 32
    if emulate is None:
        emulate = narrow and G.device.type == "cpu" and not cpu_has_bf16_units()
    if emulate and narrow:
        return _rounded_newton_schulz(G, per_step, safety, dtype)
    lead = G.shape[:-2]
    X = G.to(dtype) if dtype is not None else G.clone()
    transposed = G.shape[-2] > G.shape[-1]
    if transposed:
        X = X.mT
    X = X.reshape(-1, *X.shape[-2:]) if X.ndim != 2 else X
    # First an exact power-of-two rescale to max |x| in [0.5, 1): the sum of squares then neither
    # underflows nor overflows for any finite input, and the result is unchanged bit for bit.
    # (The max is one reduction, no |X| materialised; the division is in place on the rescaled copy.)
    amax = _amax(X)
    X = X * torch.pow(2.0, -torch.frexp(amax.float()).exponent).to(X.dtype)
    norm = X.norm(dim=(-2, -1), keepdim=True) if X.ndim == 3 else X.norm()
    X = X.div_((norm * safety if safety != 1.0 else norm).clamp(min=_TINY))
    mm = torch.addmm if X.ndim == 2 else torch.baddbmm
    for a, b, c in per_step:
        A = X @ X.mT
        B = mm(A, A, A, beta=b, alpha=c)
        X = mm(X, B, X, beta=a)
    X = X.reshape(*lead, *X.shape[-2:])
    return X.mT if transposed else X


def _rounded_newton_schulz(G: Tensor, per_step: list[tuple], safety: float, dtype: torch.dtype) -> Tensor:
    """`newton_schulz` in `dtype` computed with float32 tensors: every result is rounded to `dtype`
    (a cast there and back) where the native path stores a `dtype` tensor, so each product's operands
    are `dtype` values, their products are exact in float32 and the float32 sums round once, as a
    bf16 GEMM with float32 accumulation does. The same steps and order as `newton_schulz`."""

    def rnd(t: Tensor) -> Tensor:
        return t.to(dtype).float()

    lead = G.shape[:-2]
    X = rnd(G.float())
    transposed = G.shape[-2] > G.shape[-1]
    if transposed:
        X = X.mT
    X = X.reshape(-1, *X.shape[-2:]) if X.ndim != 2 else X
    X = X * torch.pow(2.0, -torch.frexp(_amax(X)).exponent)           # exact: a power of two
    norm = rnd(X.norm(dim=(-2, -1), keepdim=True) if X.ndim == 3 else X.norm())
    X = rnd(X / (rnd(norm * safety) if safety != 1.0 else norm).clamp(min=_TINY))
    mm = torch.addmm if X.ndim == 2 else torch.baddbmm
    for a, b, c in per_step:
        A = rnd(X @ X.mT)
        B = rnd(mm(A, A, A, beta=b, alpha=c))
        X = rnd(mm(X, B, X, beta=a))
    X = X.reshape(*lead, *X.shape[-2:]).to(dtype)
    return X.mT if transposed else X


def _amax(X: Tensor) -> Tensor:
    """max |x| per matrix (keepdim) of a batch, or of one matrix: one reduction."""
    if X.ndim == 3:
        return torch.linalg.vector_norm(X, float("inf"), dim=(-2, -1), keepdim=True)
    return torch.linalg.vector_norm(X, float("inf"))


def ns_working_bytes(shape: tuple[int, int], dtype: torch.dtype) -> int:
    """Bytes Newton-Schulz holds per (m, n) matrix at its peak: the iterate and the next one (m x n),
    the Gram matrix and its polynomial (k x k, k = min(m, n)), in `dtype`."""
    m, n = shape
    k = min(m, n)
    return (2 * m * n + 2 * k * k) * torch.empty((), dtype=dtype).element_size()


def ns_budget_bytes(device: torch.device | str) -> int:
    """The default working-set budget of one batched Newton-Schulz call on `device`: a share of a
    GPU's memory (NS_DEVICE_MEMORY_SHARE, 7 GB on a 141 GB H200), NS_CHUNK_BYTES elsewhere."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(NS_DEVICE_MEMORY_SHARE * torch.cuda.get_device_properties(device).total_memory)
    return NS_CHUNK_BYTES


def ns_matrices_per_chunk(shape: tuple[int, int], dtype: torch.dtype, budget_bytes: int) -> int:
    """Whole (m, n) matrices one batched Newton-Schulz call takes within `budget_bytes` (at least one)."""
    if budget_bytes < 1:
        raise MuonConfigError(f"the Newton-Schulz budget must be >= 1 byte, got {budget_bytes}")
    return max(1, budget_bytes // ns_working_bytes(shape, dtype))


def ns_flops(shape: tuple[int, ...], steps: int) -> float:
    """GEMM FLOPs of Newton-Schulz on a matrix, or a stack (E, m, n): per iteration, with s = min(m, n)
    and l = max, X X^T (2 s^2 l), A A (2 s^3) and B X (2 s^2 l)."""
    m, n = shape[-2:]
    s, big = min(m, n), max(m, n)
    return (shape[0] if len(shape) == 3 else 1) * steps * (4.0 * s * s * big + 2.0 * s**3)


def adjust_lr(lr: float, shape: tuple[int, ...], mode: str = "match_rms_adamw") -> float:
    """lr times the update scale of `mode` (see CONVENTIONS) for a matrix of shape (..., fan_out, fan_in)."""
    fan_out, fan_in = shape[-2], shape[-1]
    if mode == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(fan_out, fan_in))
    if mode == "original":
        return lr * math.sqrt(max(1.0, fan_out / fan_in))
    raise MuonConfigError(f"adjust_lr mode must be one of {sorted(CONVENTIONS)}, got {mode!r}")


def matrix_chunks(counts: list[int], matrix_bytes: int, chunk_bytes: int) -> list[list[tuple[int, int, int]]]:
    """Cut a sequence of parameters holding `counts` matrices each (1 for a matrix, E for a stack)
    into chunks of at most max(1, chunk_bytes // matrix_bytes) matrices, in order: each chunk is a
    list of (parameter position, first matrix, end matrix) slices of whole matrices. `matrix_bytes`
    is one matrix's share of the budget (`ns_working_bytes`)."""
    if chunk_bytes < 1 or matrix_bytes < 1:
        raise MuonConfigError(f"chunk_bytes and matrix_bytes must be >= 1, got {chunk_bytes}, {matrix_bytes}")
    per_chunk = max(1, chunk_bytes // matrix_bytes)
    chunks: list[list[tuple[int, int, int]]] = [[]]
    room = per_chunk
    for position, count in enumerate(counts):
        lo = 0
        while lo < count:
            if room == 0:
                chunks.append([])
                room = per_chunk
            hi = min(count, lo + room)
            chunks[-1].append((position, lo, hi))
            room -= hi - lo
            lo = hi
    return [c for c in chunks if c]


class Muon(torch.optim.Optimizer):
    """Muon for 2-D matrices and 3-D stacks of matrices (see the module docstring for the math).

    Matrices of the same (out, in) shape within a param group are orthogonalised in batched
    Newton-Schulz calls whose working set (`ns_working_bytes` per matrix) fits `ns_chunk_bytes`
    (None: `ns_budget_bytes` of the parameters' device); a stack of experts is already such a batch,
    cut where it is larger.
    """

    def __init__(self, params: Iterable, lr: float, weight_decay: float = 0.0, momentum: float = 0.95,
                 nesterov: bool = True, ns_steps: int = 5, adjust_lr: str = "match_rms_adamw", *,
                 ns_coefficients=SIMPLE_COEFFICIENTS,
                 ns_dtype: torch.dtype | None = torch.bfloat16, ns_chunk_bytes: int | None = None,
                 ns_emulate: bool | None = None):
        if lr < 0 or weight_decay < 0 or not 0 <= momentum < 1:
            raise MuonConfigError(f"need lr >= 0, weight_decay >= 0, 0 <= momentum < 1; "
                                  f"got {lr}, {weight_decay}, {momentum}")
        _schedule(ns_coefficients, ns_steps)                                # validates
        if adjust_lr not in CONVENTIONS:
            raise MuonConfigError(f"adjust_lr must be one of {sorted(CONVENTIONS)}, got {adjust_lr!r}")
        if ns_chunk_bytes is not None and ns_chunk_bytes < 1:
            raise MuonConfigError(f"ns_chunk_bytes must be >= 1, got {ns_chunk_bytes}")
        defaults = {"lr": lr, "weight_decay": weight_decay, "momentum": momentum, "nesterov": nesterov,
                    "ns_steps": ns_steps, "ns_coefficients": ns_coefficients}
        super().__init__(params, defaults)
        self.adjust_lr, self.ns_dtype, self.ns_chunk_bytes = adjust_lr, ns_dtype, ns_chunk_bytes
        self.ns_emulate = ns_emulate                # newton_schulz's `emulate`: None = on CPU tensors
        self.convention = CONVENTIONS[adjust_lr]
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim not in (2, 3):
                    raise MuonConfigError(f"Muon takes 2-D matrices or 3-D stacks, got shape {tuple(p.shape)}")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            if any(p.grad.is_sparse for p in params):
                raise MuonConfigError("Muon does not support sparse gradients")
            for p in params:
                if "momentum_buffer" not in self.state[p]:
                    self.state[p]["momentum_buffer"] = torch.zeros_like(p)
            by_shape: dict[tuple, list[Tensor]] = defaultdict(list)
            for p in params:
                by_shape[(tuple(p.shape[-2:]), p.dtype, p.device)].append(p)
            for (shape, dtype, device), members in by_shape.items():
                counts = [p.shape[0] if p.ndim == 3 else 1 for p in members]
                budget = self.ns_chunk_bytes or ns_budget_bytes(device)
                matrix_bytes = ns_working_bytes(shape, self.ns_dtype or dtype)
                for chunk in matrix_chunks(counts, matrix_bytes, budget):
                    self._step_chunk(group, shape, [(members[i], lo, hi) for i, lo, hi in chunk],
                                     batched=len(members) > 1 or members[0].ndim == 3)
        return loss

    def _step_chunk(self, group: dict, shape: tuple[int, int], slices: list[tuple[Tensor, int, int]],
                    batched: bool) -> None:
        """Momentum, Newton-Schulz and the update for whole matrices [lo, hi) of each parameter."""
        lr, wd, mu = group["lr"], group["weight_decay"], group["momentum"]

        def part(t: Tensor, lo: int, hi: int) -> Tensor:
            return t[lo:hi] if t.ndim == 3 else t

        params = [part(p, lo, hi) for p, lo, hi in slices]
        grads = [part(p.grad, lo, hi) for p, lo, hi in slices]
        bufs = [part(self.state[p]["momentum_buffer"], lo, hi) for p, lo, hi in slices]
        torch._foreach_lerp_(bufs, grads, 1 - mu)
        # The update, written once in Newton-Schulz's input dtype into the batch its GEMMs read (the
        # float32 lerp rounded to bf16 as the cast would round it: the same values, one pass).
        dtype = self.ns_dtype or params[0].dtype
        lone = len(params) == 1 and (params[0].ndim == 3 or not batched)   # 2-D NS, as torch.optim.Muon
        sizes = [p.numel() // (shape[0] * shape[1]) for p in params]
        batch = torch.empty(params[0].shape if lone else (sum(sizes), *shape), dtype=dtype, device=params[0].device)
        views = [batch] if lone else [v.view(p.shape) for v, p in zip(batch.split(sizes), params)]
        for view, grad, buf in zip(views, grads, bufs):
            if group["nesterov"]:
                torch.lerp(grad, buf, mu, out=view)
            else:
                view.copy_(buf)
        if wd:
            torch._foreach_mul_(params, 1 - lr * wd)
        out = newton_schulz(batch, group["ns_steps"], group["ns_coefficients"], dtype=self.ns_dtype,
                            emulate=self.ns_emulate)
        ortho = [out] if lone else [o.view(p.shape) for o, p in zip(out.split(sizes), params)]
        torch._foreach_add_(params, ortho, alpha=-adjust_lr(lr, shape, self.adjust_lr))

    def state_dict(self):
        sd = super().state_dict()
        sd["convention"] = self.convention
        return sd

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        saved = state_dict.pop("convention", self.convention)
        if saved != self.convention:
            raise MuonConfigError(f"checkpoint was written with update scale {saved!r}, "
                                  f"this optimizer uses {self.convention!r}")
        super().load_state_dict(state_dict)
