"""Muon for JAX as an optax `GradientTransformation`: the math of `rungs.muon`, leaf for leaf.

Per matrix W (out, in) with gradient G (`rungs.muon` has the derivation):
    B <- lerp(B, G, 1 - mu)                   (EMA momentum, as torch.optim.Muon: no bias correction)
    U <- lerp(G, B, mu) if nesterov else B
    O <- NS5(U) * scale(out, in)              (`scale_by_muon`)
    W <- W * (1 - lr * wd) - lr * O           (`muon`: decoupled decay, then the step)
A 3-D leaf (E, out, in) is E matrices, each orthogonalised and scaled on its own; that is what a
batched matmul over the leading axis does, so no reshaping is needed.

Why not `optax.contrib.muon` (0.2.8): it sends 3-D expert stacks to AdamW by default, and its
Nesterov momentum is bias-corrected, which differs from torch.optim.Muon by ~9% from the second
step. Presets, conventions and their validation are imported from `rungs.muon`, so the two engines
cannot drift apart on a coefficient.

Distributed (traced under `rungs.jaxjob.sharding.use_mesh`, as the engine compiles its step): Newton-
Schulz never runs on a shard. Same-shape dense matrices (FSDP row shards or replicated) form one
batch dealt round-robin over all devices (`rungs.parallel.dist_muon`'s owners), placed by sharding
constraints, so GSPMD moves each whole matrix to its owner and the result back; expert stacks are
orthogonalised where their experts live, the stacks of different layers dealt over the data axis.
`tests/rungs/jaxjob/test_dist_muon.py` checks the compiled step (no collective inside the
Newton-Schulz loop, per-device batches) and equality with one device.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

from rungs.muon import CONVENTIONS, NS_CHUNK_BYTES, NS_PRESETS, SIMPLE_COEFFICIENTS, MuonConfigError, _schedule
from rungs.jaxjob.sharding import DATA, EXPERT, active_mesh
from rungs.muon import adjust_lr as _adjust_lr

__all__ = ["CONVENTIONS", "NS_PRESETS", "SIMPLE_COEFFICIENTS", "MuonConfigError", "MuonState", "muon", "newton_schulz",
           "scale_by_muon", "update_scale"]

_TINY = float(np.finfo(np.float32).tiny)


class MuonState(NamedTuple):
    momentum: Any  # same tree, shapes and dtypes as the parameters


def _lerp(start: jax.Array, end: jax.Array, weight: float) -> jax.Array:
    # torch.lerp's two-sided formula with the weight in float32 (XLA:CPU contracts it into one fma,
    # as torch's kernel does), so the momentum and the bf16 cast before Newton-Schulz round alike.
    w = np.float32(weight)
    if w < 0.5:
        return start + w * (end - start)
    return end - (end - start) * (np.float32(1.0) - w)


def narrow_products_native() -> bool:
    """Whether bf16 x bf16 -> float32 dots run natively on JAX's default backend: on a GPU or TPU,
    and on a CPU with bf16 units (AVX512-BF16 or AMX, the probe `rungs.muon` uses, so both engines
    take the same path on one machine). Measured on an AVX512-BF16 EPYC, one thread, 512^2: 191
    GFLOP/s against 97 for float32; on AVX2 CPUs XLA converts the operands around every product."""
    if jax.default_backend() != "cpu":
        return True
    from rungs.cpu_bf16 import cpu_has_bf16_units

    return cpu_has_bf16_units()


def newton_schulz(G: jax.Array, steps: int = 5, coefficients=SIMPLE_COEFFICIENTS, *,
                  dtype: Any = jnp.bfloat16, safety: float | None = None,
                  native: bool | None = None) -> jax.Array:
    """Orthogonalise G (..., m, n), batched over leading dims; returns `dtype` (None: G's dtype).

    The same steps as `rungs.muon.newton_schulz`: Gram matrix on the smaller side, an exact
    power-of-two prescale to max |x| in [0.5, 1), X / max(||X||_F * safety, tiny), then per step
    A = X X^T, B = b A + c A A, X = a X + B X. Products accumulate in float32 and round to `dtype`
    where torch's addmm rounds (once per fused op), so bf16 results track torch's closely.
    `native` (None: `narrow_products_native()`): the products take `dtype` operands (torch's
    bf16 path) instead of float32 operands holding `dtype` values (its CPU emulation); the same
    products, summed in float32 in a possibly different order.
    """
    if G.ndim < 2:
        raise MuonConfigError(f"newton_schulz needs a matrix or a batch of matrices, got shape {tuple(G.shape)}")
    per_step, preset_safety = _schedule(coefficients, steps)
    safety = preset_safety if safety is None else safety
    dt = jnp.dtype(dtype if dtype is not None else G.dtype)
    # Arithmetic runs in float32 (or wider) and every result is rounded to `dt` with an explicit
    # reduce_precision where torch rounds: XLA may drop a float32 -> bf16 -> float32 convert pair
    # (excess precision is allowed by default), but never a reduce_precision.
    wide = jnp.promote_types(dt, jnp.float32)
    if dt == wide:
        def rnd(v):
            return v
    else:
        info = jnp.finfo(dt)
        def rnd(v):
            return jax.lax.reduce_precision(v, exponent_bits=info.nexp, mantissa_bits=info.nmant)
    X = rnd(G.astype(wide))
    transposed = G.shape[-2] > G.shape[-1]
    if transposed:
        X = jnp.swapaxes(X, -1, -2)
    amax = jnp.max(jnp.abs(X), axis=(-2, -1), keepdims=True)
    _, exponent = jnp.frexp(amax)
    X = X * jnp.ldexp(jnp.ones_like(amax), -exponent)                    # exact: a power of two
    norm = rnd(jnp.sqrt(jnp.sum(X * X, axis=(-2, -1), keepdims=True)))
    denom = rnd(norm * safety) if safety != 1.0 else norm
    X = rnd(X / jnp.maximum(denom, _TINY))

    if native is None:
        native = narrow_products_native()
    native = native and dt != wide
    if native:
        # The same arithmetic with the operands stored in `dt`: a dt x dt -> wide dot, whose
        # products are exact in wide (only the order of the float32 sums may differ), at the
        # native rate, and the iterate carried in `dt` (half the memory traffic). The barrier keeps
        # XLA:CPU from fusing a result's rounding into its consumer and then feeding that dot
        # float32 operands (it did for A A and B X: 9.7 -> 7.7 ms for cpu-demo L6's 156 matrices
        # of 48 x 96, one thread); it changes no value.
        def out(v):
            return jax.lax.optimization_barrier(v.astype(dt))
        X = X.astype(dt)                                                     # exact: already rounded
    else:
        out = rnd

    def mm(p, q):
        # (..., i, k) @ (..., k, j) of operands already rounded to dt (X, A and B are: every value
        # that reaches a product went through rnd or is stored in dt), multiplied and accumulated
        # in `wide`. Emulated, it is the arithmetic of a dt x dt -> wide dot in wide operands:
        # XLA:CPU on a CPU without bf16 units converts the operands around every product of such
        # a dot (NS 65 -> 50 ms a step at cpu-demo L6 on an AVX2 core, one thread).
        return jnp.matmul(p, q, preferred_element_type=wide)

    def gram(p):
        # p p^T as one dot contracting both operands' last axes: XLA:CPU then needs no transposed
        # copy of p in bf16 (native: 11.5 -> 9.5 ms for cpu-demo L6's 156 matrices of 48 x 96, one
        # thread); with float32 operands it compiles to the same code as matmul(p, p^T).
        return jnp.einsum("...ik,...jk->...ij", p, p, preferred_element_type=wide)

    def iteration(X, abc):
        a, b, c = abc[0], abc[1], abc[2]
        A = out(gram(X))
        B = out(b * A + c * mm(A, A))
        return out(a * X + mm(B, X)), None

    # A scan over the per-step coefficients, not an unrolled loop: the same arithmetic, and XLA
    # compiles one iteration instead of five (the optimizer's compile time is most of a CPU step's).
    X, _ = jax.lax.scan(iteration, X, jnp.asarray(per_step, wide))
    X = jnp.swapaxes(X, -1, -2) if transposed else X
    return X.astype(dt)


def update_scale(shape: tuple[int, ...], mode: str = "match_rms_adamw") -> float:
    """The per-matrix update scale of `mode` (`rungs.muon.CONVENTIONS`) for (..., fan_out, fan_in)."""
    return _adjust_lr(1.0, tuple(shape), mode)


def _orthogonalise(leaves: list[jax.Array], ns_steps: int, ns_coefficients, ns_dtype: Any,
                   adjust_lr: str) -> list[jax.Array]:
    """NS(u) * scale for each leaf. Matrices of the same shape up to a transpose and the same dtype
    go through one batched Newton-Schulz (tall ones transposed first: Newton-Schulz orthogonalises
    the wide side, as it would have inside), as rungs.muon.Muon batches same-shape matrices: at
    cpu-demo L6 that is 4 calls instead of 72, which cuts the optimizer's compile time and its share
    of a CPU step (docs/performance/jax.md). The update scale is each leaf's own (it depends on out vs in).
    Traced on a mesh (`sharding.use_mesh`), each batch is laid out so that every device
    orthogonalises whole matrices of its own (`_on_owners`)."""
    mesh = active_mesh()
    groups: dict[tuple, list[int]] = {}
    for i, u in enumerate(leaves):
        rows, cols = u.shape[-2:]
        groups.setdefault((min(rows, cols), max(rows, cols), u.dtype), []).append(i)

    def wide(u: jax.Array, like: jax.Array) -> jax.Array:     # transposed iff `like` is tall
        return jnp.swapaxes(u, -1, -2) if like.shape[-2] > like.shape[-1] else u

    out: list[Any] = [None] * len(leaves)
    for (_, _, dtype), members in groups.items():
        def ortho(batch, dtype=dtype):
            return newton_schulz(batch, ns_steps, ns_coefficients, dtype=ns_dtype).astype(dtype)

        wides = [wide(leaves[i], leaves[i]) for i in members]
        per_chunk = max(1, NS_CHUNK_BYTES // (4 * wides[0].shape[-2] * wides[0].shape[-1]))
        if mesh is not None:
            done = _on_owners(wides, ortho, mesh)
        elif sum(_count(w) for w in wides) > per_chunk:
            # More than one chunk of matrices (expert stacks): each leaf on its own, a chunk of
            # its matrices at a time, so the working memory is one chunk's, not a concatenated
            # copy of every same-shape matrix (rungs.muon's ns_chunk_bytes, the same bound).
            done = [_chunked(ortho, w, per_chunk) for w in wides]
        else:
            flat = ortho(jnp.concatenate([w.reshape(-1, *w.shape[-2:]) for w in wides]))
            done, start = [], 0
            for w in wides:
                n = _count(w)
                done.append(flat[start:start + n].reshape(w.shape))
                start += n
        for i, o in zip(members, done):
            u = leaves[i]
            out[i] = wide(o, u) * jnp.asarray(update_scale(u.shape[-2:], adjust_lr), dtype)
    return out


def _count(u: jax.Array) -> int:
    """How many matrices a 2-D or 3-D leaf holds."""
    return u.size // (u.shape[-2] * u.shape[-1])


def _chunked(ortho, u: jax.Array, per_chunk: int) -> jax.Array:
    """`ortho` of u's matrices, `per_chunk` (at most, evened out) at a time; each matrix's result
    does not depend on the chunking (a batched product computes every batch element on its own)."""
    count = _count(u)
    steps = -(-count // per_chunk)
    per = -(-count // steps)
    flat = u.reshape(count, *u.shape[-2:])
    if steps == 1:
        return ortho(flat).reshape(u.shape)
    padded = jnp.concatenate([flat, jnp.zeros((steps * per - count, *flat.shape[1:]), flat.dtype)])
    done = jax.lax.map(ortho, padded.reshape(steps, per, *flat.shape[1:]))    # zero matrices stay zero
    return done.reshape(steps * per, *flat.shape[1:])[:count].reshape(u.shape)


def _round_robin(count: int, owners: int) -> tuple[np.ndarray, np.ndarray]:
    """Matrix j goes to owner j % owners at slot j // owners of a padded (owners * per) batch.
    Returns (gather: padded slot -> matrix index, count for an empty slot; slot of each matrix)."""
    per = -(-count // owners)
    slot = np.array([(j % owners) * per + j // owners for j in range(count)], np.int64)
    gather = np.full(owners * per, count, np.int64)
    gather[slot] = np.arange(count)
    return gather, slot


def _on_owners(leaves: list[jax.Array], ortho, mesh) -> list[jax.Array]:
    """`ortho` of same-shape matrices, each orthogonalised whole by one device (`rungs.parallel.dist_muon`).

    Expert stacks (E, m, n) whose E splits over the expert axis stay where their experts live; the
    stacks of different layers are dealt round-robin over the data axis (each data row holds every
    layer's experts, so each orthogonalises a share). Everything else (dense matrices, FSDP row
    shards, stacks that do not split) is one batch of matrices dealt round-robin over all devices:
    GSPMD moves each whole matrix to its owner (an all-to-all) and the result back to its layout.
    """
    data, expert = mesh.shape[DATA], mesh.shape[EXPERT]
    spec: Any
    if all(u.ndim == 3 and u.shape[0] % expert == 0 for u in leaves):
        batch = jnp.stack(leaves)                                             # (n, E, m, n')
        axis, owners, spec = 0, data, P(DATA, EXPERT)
    else:
        batch = jnp.concatenate([u.reshape(-1, *u.shape[-2:]) for u in leaves])  # (n, m, n')
        axis, owners, spec = 0, data * expert, P((DATA, EXPERT))
    count = batch.shape[axis]
    gather, slot = _round_robin(count, owners)
    padded = jnp.concatenate([batch, jnp.zeros_like(batch[:1])])[gather]     # zero matrices stay zero
    padded = jax.lax.with_sharding_constraint(padded, spec)
    done = jax.lax.with_sharding_constraint(ortho(padded), spec)[slot]
    if spec == P(DATA, EXPERT):
        return list(done)
    out, start = [], 0
    for u in leaves:
        n = u.size // (u.shape[-2] * u.shape[-1])
        out.append(done[start:start + n].reshape(u.shape))
        start += n
    return out


def scale_by_muon(momentum: float = 0.95, nesterov: bool = True, ns_steps: int = 5,
                  ns_coefficients=SIMPLE_COEFFICIENTS, ns_dtype: Any = jnp.bfloat16,
                  adjust_lr: str = "match_rms_adamw") -> optax.GradientTransformation:
    """Momentum, Newton-Schulz and the update scale: the direction -O/lr of `rungs.muon.Muon`.

    Every leaf must be 2-D or 3-D (use `optax.partition` to send the rest elsewhere)."""
    if not 0 <= momentum < 1:
        raise MuonConfigError(f"need 0 <= momentum < 1, got {momentum}")
    _schedule(ns_coefficients, ns_steps)                                    # validates
    if adjust_lr not in CONVENTIONS:
        raise MuonConfigError(f"adjust_lr must be one of {sorted(CONVENTIONS)}, got {adjust_lr!r}")

    def init(params):
        def zeros(p):
            if p.ndim not in (2, 3):
                raise MuonConfigError(f"Muon takes 2-D matrices or 3-D stacks, got shape {tuple(p.shape)}")
            return jnp.zeros_like(p)
        return MuonState(jax.tree.map(zeros, params))

    def update(updates, state, params=None):
        del params
        buf = jax.tree.map(lambda b, g: _lerp(b, g, 1.0 - momentum), state.momentum, updates)
        direction = jax.tree.map(lambda g, b: _lerp(g, b, momentum), updates, buf) if nesterov else buf

        leaves, treedef = jax.tree.flatten(direction)
        return jax.tree.unflatten(treedef, _orthogonalise(leaves, ns_steps, ns_coefficients, ns_dtype,
                                                          adjust_lr)), MuonState(buf)

    return optax.GradientTransformation(init, update)


def muon(learning_rate, weight_decay=0.0, *, weight_decay_mask=None, momentum: float = 0.95,
         nesterov: bool = True, ns_steps: int = 5, ns_coefficients=SIMPLE_COEFFICIENTS,
         ns_dtype: Any = jnp.bfloat16, adjust_lr: str = "match_rms_adamw") -> optax.GradientTransformation:
    """`rungs.muon.Muon` as one transformation: W <- W (1 - lr wd) - lr scale NS(U).

    learning_rate and weight_decay may be floats, traced arrays or (learning_rate only) an optax
    schedule; decay applies where `weight_decay_mask` (a tree of bools or a callable) is True."""
    return optax.chain(
        scale_by_muon(momentum, nesterov, ns_steps, ns_coefficients, ns_dtype, adjust_lr),
        optax.add_decayed_weights(weight_decay, weight_decay_mask),
        optax.scale_by_learning_rate(learning_rate),
    )
