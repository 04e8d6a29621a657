"""The rung model in JAX: `rungs.model.Transformer` as pure functions of a flat parameter dict.

Data flows as in the torch model: embedding → n_layers × [RMSNorm → GQA attention (RoPE; global
layers causal over the sequence, local layers a sliding window) → residual, RMSNorm → latent MoE
(fp32 router on d_model, shared SwiGLU expert in d_model, routed experts in the latent space) →
residual] → RMSNorm → LM head. `loss` adds the load-balancing and z-loss terms exactly as
`rungs.train` does, so one jax.grad gives the gradients the torch job's backward gives.

Windowed layers attend block-locally: the sequence is cut into blocks of window_tokens queries and
each block attends to its own and the previous block's keys (2W keys instead of T), so no T×T
masked softmax exists. Attention runs heads-major, (B, kv, g, T, hd), projected there directly:
on XLA:CPU that layout made a global layer's step 1.7x faster than (B, T, H, hd). Where a fused
kernel exists (cuDNN) `jax.nn.dot_product_attention` is used instead, with its sliding window.
No parallelism here: sharding is applied from outside.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rungs.jaxjob.expert_parallel import routed_experts_with_rounds
from rungs.jaxjob.loss import linear_cross_entropy
from rungs.jaxjob.moe import count_per_expert, dispatch_for
from rungs.jaxjob.params import Buffers, Params, bias_name

__all__ = ["Routing", "block", "compute_params", "forward", "loss", "hidden", "rms_norm", "apply_rope", "rope_tables", "attention", "latent_moe",
           "attention_core", "fused_attention_available", "load_balancing_loss", "z_loss",
           "update_expert_bias"]

# (x, layer, point) -> x: activation gradient clipping's hook, the identity by default.
ActivationClip = Callable[[jax.Array, int, str], jax.Array]


class Routing(NamedTuple):
    """One layer's routing, the fields the balancing losses and the step metrics need."""

    expert_idx: jax.Array         # (N, k) int32, in descending selection score
    gate: jax.Array               # (N, k) fp32 combine weights
    probs: jax.Array              # (N, E) fp32 softmax or sigmoid scores, no bias
    logits: jax.Array             # (N, E) fp32
    tokens_per_expert: jax.Array  # (E,) int32
    rounds: jax.Array             # () int32: MoE rounds this layer needed


def _no_clip(x, layer, point):
    return x


def _check(cfg: Any) -> None:
    if getattr(cfg, "dropout", 0.0):
        raise ValueError(f"the JAX model has no dropout; got dropout={cfg.dropout}")
    if cfg.head_dim % 2:
        raise ValueError(f"head_dim={cfg.head_dim} must be even for RoPE")


def rms_norm(x: jax.Array, weight: jax.Array, eps: float = 1e-6) -> jax.Array:
    xf = x.astype(jnp.float32)  # fp32 mean of squares, output in the input dtype
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + eps)
    return (xf * weight.astype(jnp.float32)).astype(x.dtype)


_EXPERT_STACKS = ("experts.w_gate", "experts.w_up", "experts.w_down")


def compute_params(params: Params, dtype: Any = jnp.float32) -> Params:
    """The parameters a forward in `dtype` reads: every matmul weight (the router's too, as
    `rungs.router` under autocast) cast to `dtype` (the compute dtype: bf16 for mixed precision,
    where the master weights stay fp32); the embedding table (a lookup into the fp32 residual
    stream), the LM head and the expert stacks (cast where they are multiplied, inside
    `loss.linear_cross_entropy` and the routed experts' custom VJP, so their gradients are summed
    in fp32 and no bf16 copy of them outlives the layer) and norm weights as they are. The model casts each matmul's input to its weight's
    dtype, so outputs of the attention, the experts and the head are in `dtype` while the residual
    stream and the router's logits stay fp32, as under torch's autocast. The gradient flows back to
    the fp32 parameters through the casts."""
    dtype = jnp.dtype(dtype)

    def cast(name: str, p: jax.Array) -> jax.Array:
        keep = p.ndim < 2 or name in ("embed.weight", "lm_head.weight") or name.endswith(_EXPERT_STACKS)
        return p if keep or p.dtype == dtype else p.astype(dtype)

    return {name: cast(name, p) for name, p in params.items()}


def rope_tables(seq_len: int, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin (seq_len, head_dim/2), angles in float64 then fp32, as the torch tables."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.outer(np.arange(seq_len, dtype=np.float64), inv_freq)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate channel pairs (2j, 2j+1) of x (..., T, hd) by position-dependent angles."""
    T, hd = x.shape[-2:]
    pairs = x.astype(jnp.float32).reshape(*x.shape[:-1], hd // 2, 2)
    a, b = pairs[..., 0], pairs[..., 1]                                       # (..., T, hd/2)
    c, s = cos[:T], sin[:T]                                                   # (T, hd/2)
    return jnp.stack([a * c - b * s, a * s + b * c], -1).reshape(x.shape).astype(x.dtype)


def fused_attention_available() -> bool:
    """Whether jax.nn.dot_product_attention has a fused kernel here (cuDNN on GPU). On XLA:CPU it is
    an unfused softmax in (B, T, H, hd) layout, measured 1.7x slower in a training step than the
    heads-major einsums below."""
    return jax.default_backend() in ("gpu", "cuda")


class _Mask(NamedTuple):
    """Which scores a query may see (static, hashable, so it can be a custom_vjp constant).

    causal: queries q0..q0+n_queries-1 of the sequence against keys 0..n_keys-1.
    window: n_blocks blocks of `window` queries, each against the previous and its own block's
    keys (2·window), seeing the window keys up to itself; (nb, 1, W, 2W), the 1 for the query
    heads that share a key head."""

    kind: str
    a: int
    b: int
    c: int = 0

    def array(self) -> np.ndarray:
        if self.kind == "causal":
            q0, n_queries, n_keys = self.a, self.b, self.c
            return np.arange(q0, q0 + n_queries)[:, None] >= np.arange(n_keys)[None, :]   # (n_queries, n_keys)
        window, n_blocks = self.a, self.b
        i = np.arange(window)[:, None]                  # query position in its block
        j = np.arange(2 * window)[None, :] - window     # key position relative to the block start
        first = np.arange(n_blocks)[:, None, None] * window
        return ((j <= i) & (i - j < window) & (first + j >= 0))[:, None]                    # (nb, 1, W, 2W)


def _dot(spec: str, a, b, acc):
    """einsum whose result is in `acc`. The inputs' own dtype for the product: XLA:CPU has no bf16 x bf16
    -> f32 dot (`preferred_element_type` fails there at run time), and this is what the plain einsum
    under bf16 computed before."""
    return jnp.einsum(spec, a, b).astype(acc)


def _transposed(values: str) -> str:
    """'P,V->O' (probabilities times values) -> 'P,O->V' (the values' gradient), for any index names."""
    inputs, out = values.split("->")
    p, v = inputs.split(",")
    return f"{p},{out}->{v}"


@partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _softmax_attend(q, k, v, mask: _Mask, scores: str, values: str):
    """softmax(q k^T / sqrt(hd), masked) v over the last two axes of the einsum strings.

    A flash-attention style custom_vjp: forward keeps q, k, v, the output and the row logsumexp
    (per query, not per score); backward recomputes the probabilities from them, and takes the
    softmax's row term as sum(dO * O) over hd instead of sum(dP * P) over the keys. Autodiff of the
    plain softmax kept 4-5 score-sized arrays per layer (110 of the 193 MB an L6 step's
    temporaries held, each page faulted in again every step) and its row reduction over the keys
    was one of XLA:CPU's slowest fusions. Probabilities are normalised after the value matmul
    (hd columns to divide instead of the keys')."""
    return _attend_fwd(q, k, v, mask, scores, values)[0]


def _scores(spec: str, q, k, acc):
    """q k^T in `acc` from q and k widened first: the plain einsum of bf16 q and k rounds every score to bf16
    (a spacing of 0.0625 at a score of 10) before the softmax, 16x the torch kernel's error against float64
    at large scores. Products of bf16 values are exact in fp32, so only the sums round, as under torch's
    autocast (`preferred_element_type` fails on XLA:CPU at run time, see `_dot`)."""
    return jnp.einsum(spec, q.astype(acc), k.astype(acc))


def _attend_fwd(q, k, v, mask, scores, values):
    acc = jnp.promote_types(q.dtype, jnp.float32)
    s = jnp.where(mask.array(), _scores(scores, q, k, acc) * q.shape[-1] ** -0.5, -jnp.inf)
    m = jnp.max(s, -1, keepdims=True)              # every query sees at least itself: finite
    p = jnp.exp(s - m)
    total = jnp.sum(p, -1, keepdims=True)
    o = _dot(values, p.astype(v.dtype), v, acc) / total
    o = o.astype(v.dtype)
    return o, (q, k, v, o, m + jnp.log(total))


def _attend_bwd(mask, scores, values, res, do):
    q, k, v, o, lse = res
    acc = jnp.promote_types(q.dtype, jnp.float32)
    scale = q.shape[-1] ** -0.5
    s = _scores(scores, q, k, acc) * scale
    p = jnp.where(mask.array(), jnp.exp(s - lse), 0.0)                         # the forward's probabilities
    dv = _dot(_transposed(values), p.astype(v.dtype), do.astype(v.dtype), acc)
    dp = _dot(scores, do.astype(v.dtype), v, acc)
    row = jnp.sum(do.astype(acc) * o.astype(acc), -1, keepdims=True)           # = sum_keys dP * P
    ds = (p * (dp - row) * scale).astype(q.dtype)
    dq = _dot(values, ds, k, acc)
    dk = _dot(_transposed(values), ds, q, acc)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


_softmax_attend.defvjp(_attend_fwd, _attend_bwd)


def _causal_chunks(q, k, v, n_chunks: int = 8):
    """Full causal attention by query chunks: chunk n attends only to the keys up to its end, so the
    scores cover (n_chunks + 1) / (2 n_chunks) of the T×T square (10/16 at 4 chunks: a global
    layer's step 1.6x faster on XLA:CPU than the full masked square; 9/16 at 8 chunks, forward+backward
    27 -> 23 ms at cpu-demo L6 on one thread, where 2 chunks took 32 ms). One chunk when T does not split."""
    T = q.shape[-2]
    n_chunks = n_chunks if T % n_chunks == 0 and T >= 16 * n_chunks else 1
    C = T // n_chunks
    outs = []
    for n in range(n_chunks):
        mask = _Mask("causal", n * C, C, (n + 1) * C)                                    # (C, (n+1)C)
        outs.append(_softmax_attend(q[..., n * C:(n + 1) * C, :], k[..., : (n + 1) * C, :], v[..., : (n + 1) * C, :],
                                    mask, "bkgte,bkse->bkgts", "bkgts,bkse->bkgte"))
    return jnp.concatenate(outs, -2)                                          # (B, kv, g, T, hd)


def attention_core(q, k, v, window: int | None, fused: bool = False) -> jax.Array:
    """Causal GQA attention, heads-major: q (B, kv, g, T, hd), k/v (B, kv, T, hd) → like q.

    window None: over the whole prefix, by query chunks. Else a query at t sees keys t-window+1..t; queries are cut
    into blocks of `window`, each attending to its own block and the previous one (2·window keys),
    so no (T, T) score array exists. fused: jax.nn.dot_product_attention with its sliding window.
    """
    B, kv, g, T, hd = q.shape
    if fused:
        qt = q.transpose(0, 3, 1, 2, 4).reshape(B, T, kv * g, hd)            # (B, T, H, hd)
        kt, vt = (a.transpose(0, 2, 1, 3) for a in (k, v))                    # (B, T, kv, hd)
        y = jax.nn.dot_product_attention(qt, kt, vt, is_causal=True,
                                         local_window_size=None if window is None else (window - 1, 0))
        return y.reshape(B, T, kv, g, hd).transpose(0, 2, 3, 1, 4)
    if window is None or window >= T:
        return _causal_chunks(q, k, v)
    nb, pad = -(-T // window), -T % window
    # Blocks before heads, (B, kv, nb, g, W, hd): the g query heads of a block then form one (g·W, 2W)
    # score matrix per (batch, key head, block), contiguous, so no product of the forward or the
    # backward needs a transposed copy of the scores (with the blocks after the heads XLA:CPU made
    # two per layer in backward; this layout took the windowed attention's forward+backward from
    # 29 to 19 ms at cpu-demo L6, one thread, bit for bit the same).
    q = jnp.pad(q, ((0, 0),) * 3 + ((0, pad), (0, 0))).reshape(B, kv, g, nb, window, hd).transpose(0, 1, 3, 2, 4, 5)
    # One block of zeros in front, so block n's keys are padded blocks n-1 and n.
    k, v = (jnp.pad(a, ((0, 0), (0, 0), (window, pad), (0, 0))).reshape(B, kv, nb + 1, window, hd) for a in (k, v))
    k, v = (jnp.concatenate([a[:, :, :-1], a[:, :, 1:]], 3) for a in (k, v))  # (B, kv, nb, 2W, hd)
    y = _softmax_attend(q, k, v, _Mask("window", window, nb), "bkngqe,bknse->bkngqs", "bkngqs,bknse->bkngqe")
    return y.transpose(0, 1, 3, 2, 4, 5).reshape(B, kv, g, nb * window, hd)[..., :T, :]


def attention(p: Params, prefix: str, x: jax.Array, cos, sin, cfg: Any, is_global: bool,
              fused: bool | None = None) -> jax.Array:
    """GQA over x (B, T, d). Projections go straight to heads-major layout: query head
    h = kv_head * g + j as in torch's enable_gqa, so wq (H*hd, d) is read as (kv, g, hd, d)."""
    B, T, d = x.shape
    kv = cfg.n_kv_heads_global if is_global else cfg.n_kv_heads_local
    g, hd = cfg.n_heads // kv, cfg.head_dim
    x = x.astype(p[prefix + "wq.weight"].dtype)  # the matmuls in the weights' (compute) dtype
    q = jnp.einsum("btd,kged->bkgte", x, p[prefix + "wq.weight"].reshape(kv, g, hd, d))  # (B, kv, g, T, hd)
    k = jnp.einsum("btd,ked->bkte", x, p[prefix + "wk.weight"].reshape(kv, hd, d))      # (B, kv, T, hd)
    v = jnp.einsum("btd,ked->bkte", x, p[prefix + "wv.weight"].reshape(kv, hd, d))
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    fused = fused_attention_available() if fused is None else fused
    y = attention_core(q, k, v, None if is_global else cfg.window_tokens, fused)        # (B, kv, g, T, hd)
    return jnp.einsum("bkgte,dkge->btd", y, p[prefix + "wo.weight"].reshape(d, kv, g, hd))


def _swiglu(p: Params, prefix: str, x: jax.Array) -> jax.Array:
    x = x.astype(p[prefix + "w_up.weight"].dtype)
    h = jax.nn.silu(x @ p[prefix + "w_gate.weight"].T) * (x @ p[prefix + "w_up.weight"].T)
    return h @ p[prefix + "w_down.weight"].T


def route(weight: jax.Array, bias: jax.Array | None, x: jax.Array, cfg: Any) -> Routing:
    """`rungs.router.Router`: the GEMM in the weight's (compute) dtype, logits cast to fp32; scores
    softmax or sigmoid; top-k on scores + bias; gates the selected unbiased scores normalised over
    the k slots where k > 1 (one slot's gate is its score: normalised, it would be 1 and the router would
    learn from the balancing terms only). All of it fp32 for fp32 weights."""
    logits = (x.astype(weight.dtype) @ weight.T).astype(jnp.float32)         # (N, E)
    probs = jax.nn.softmax(logits, -1) if cfg.router_score == "softmax" else jax.nn.sigmoid(logits)
    select = probs + bias if (cfg.expert_bias and bias is not None) else probs
    _, expert_idx = jax.lax.top_k(select, cfg.top_k)                          # (N, k)
    gate = jnp.take_along_axis(probs, expert_idx, -1)
    if cfg.top_k > 1:
        gate = gate / jnp.maximum(gate.sum(-1, keepdims=True), jnp.finfo(gate.dtype).tiny)
    counts = count_per_expert(expert_idx, cfg.n_experts)
    return Routing(expert_idx.astype(jnp.int32), gate, probs, logits, counts, jnp.zeros((), jnp.int32))


def latent_moe(p: Params, prefix: str, bias, x: jax.Array, cfg: Any,
               backend: str | None = None) -> tuple[jax.Array, Routing]:
    """`rungs.model.LatentMoE`: x (B, T, d) → (B, T, d) and the layer's routing."""
    B, T, d = x.shape
    flat = x.reshape(B * T, d)                                                # (N, d)
    r = route(p[prefix + "router.weight"], bias, flat, cfg)
    latent = prefix + "latent_down.weight" in p
    expert_dtype = p[prefix + "router.weight"].dtype                         # the compute dtype
    h = flat.astype(expert_dtype) @ p[prefix + "latent_down.weight"].T if latent else flat.astype(expert_dtype)
    disp = dispatch_for(B * T, cfg.top_k, cfg.n_experts, capacity_per_expert=cfg.capacity_per_expert,
                        group_size=cfg.group_size, backend=backend)
    y, rounds = routed_experts_with_rounds(disp, h, r.gate.astype(h.dtype), r.expert_idx, p[prefix + "experts.w_gate"],
                                           p[prefix + "experts.w_up"], p[prefix + "experts.w_down"])   # (N, latent)
    y = y @ p[prefix + "latent_up.weight"].T if latent else y                # (N, d)
    if prefix + "shared.w_gate.weight" in p:
        y = y + _swiglu(p, prefix + "shared.", flat)
    return y.reshape(B, T, d), r._replace(rounds=rounds)


def block(params: Params, layer: int, x: jax.Array, cos, sin, bias, cfg: Any, *,
          clip: ActivationClip = _no_clip, backend: str | None = None) -> tuple[jax.Array, Routing]:
    """One transformer block (`rungs.model.Block`): x (B, T, d) → (B, T, d) and its routing.

    `cfg.activation_checkpointing` as in the torch block (the same numbers, less memory kept for the
    backward): "selective" recomputes the attention sub-layer in the backward, "full" the whole block
    from its input (jax.checkpoint)."""
    x = clip(x, layer, "residual")  # the residual stream entering the block
    mode = getattr(cfg, "activation_checkpointing", "none")
    body = partial(_block_body, layer=layer, cfg=cfg, clip=clip, backend=backend, selective=mode == "selective")
    if mode == "full":
        body = jax.checkpoint(body)
    return body(params, x, cos, sin, bias)


def _block_body(params: Params, x: jax.Array, cos, sin, bias, *, layer: int, cfg: Any, clip: ActivationClip,
                backend: str | None, selective: bool) -> tuple[jax.Array, Routing]:
    pre = f"layers.{layer}."

    def attend(params: Params, x: jax.Array, cos, sin) -> jax.Array:
        return attention(params, pre + "attn.", rms_norm(x, params[pre + "attn_norm.weight"]), cos, sin, cfg,
                         cfg.is_global_layer(layer))

    x = x + (jax.checkpoint(attend) if selective else attend)(params, x, cos, sin)
    h = clip(rms_norm(x, params[pre + "moe_norm.weight"]), layer, "moe_input")
    y, r = latent_moe(params, pre + "moe.", bias, h, cfg, backend)
    return x + y, r


def hidden(params: Params, buffers: Buffers | None, tokens: jax.Array, cfg: Any, *,
           clip: ActivationClip | None = None, backend: str | None = None) -> tuple[jax.Array, list[Routing]]:
    """tokens (B, T) int → the final norm's output (B, T, d) in the compute dtype, and each layer's routing."""
    _check(cfg)
    B, T = tokens.shape
    if T > cfg.seq_len:
        raise ValueError(f"sequence of {T} tokens exceeds the model's seq_len {cfg.seq_len}")
    cos, sin = (jnp.asarray(t) for t in rope_tables(cfg.seq_len, cfg.head_dim, cfg.rope_theta))
    x = params["embed.weight"][tokens]                                        # (B, T, d)
    routes = []
    for i in range(cfg.n_layers):
        bias = None if buffers is None else buffers[bias_name(i)]
        x, r = block(params, i, x, cos, sin, bias, cfg, clip=clip or _no_clip, backend=backend)
        routes.append(r)
    x = rms_norm(x, params["final_norm.weight"])
    return x.astype(params["layers.0.attn.wq.weight"].dtype), routes          # the compute dtype


def _head(params: Params, cfg: Any) -> jax.Array:
    return params["embed.weight"] if cfg.tied_embeddings else params["lm_head.weight"]


def forward(params: Params, buffers: Buffers | None, tokens: jax.Array, cfg: Any, *,
            clip: ActivationClip | None = None, backend: str | None = None) -> tuple[jax.Array, list[Routing]]:
    """tokens (B, T) int → logits (B, T, V) in the compute dtype, and each layer's routing."""
    x, routes = hidden(params, buffers, tokens, cfg, clip=clip, backend=backend)
    return x @ _head(params, cfg).astype(x.dtype).T, routes                   # (B, T, V)


def load_balancing_loss(routes: list[Routing], n_experts: int) -> jax.Array:
    """E * sum_i f_i P_i averaged over layers (`rungs.router.load_balancing_loss`); f carries no grad."""
    counts = jnp.stack([r.tokens_per_expert for r in routes]).astype(jnp.float32)  # (L, E)
    f = counts / jnp.maximum(counts.sum(-1, keepdims=True), 1.0)
    probs = jnp.stack([r.probs for r in routes])                                   # (L, N, E)
    p = (probs / probs.sum(-1, keepdims=True)).mean(1)                             # (L, E)
    return n_experts * (f * p).sum(-1).mean()


def z_loss(routes: list[Routing]) -> jax.Array:
    """Mean over layers and tokens of logsumexp(router logits)^2."""
    return jnp.stack([jnp.square(jax.nn.logsumexp(r.logits, -1)).mean() for r in routes]).mean()


def loss(params: Params, buffers: Buffers | None, inputs: jax.Array, targets: jax.Array, cfg: Any,
         lb_loss_coef: float | jax.Array = 0.0, z_loss_coef: float | jax.Array = 0.0, *,
         clip: ActivationClip | None = None, backend: str | None = None) -> tuple[jax.Array, dict]:
    """Mean token cross-entropy + lb_loss_coef·LBL + z_loss_coef·z-loss (the torch job's objective).

    Returns (total, aux) with aux = {ce, aux_loss, tokens_per_expert (L, E), rounds (L,)}. The
    coefficients may be traced, so one compiled step serves any of them.
    """
    x, routes = hidden(params, buffers, inputs, cfg, clip=clip, backend=backend)
    ce = linear_cross_entropy(x.reshape(-1, x.shape[-1]), _head(params, cfg), targets.reshape(-1))
    aux = lb_loss_coef * load_balancing_loss(routes, cfg.n_experts) + z_loss_coef * z_loss(routes)
    stats = {"ce": ce, "aux_loss": aux,
             "tokens_per_expert": jnp.stack([r.tokens_per_expert for r in routes]),
             "rounds": jnp.stack([r.rounds for r in routes])}
    return ce + aux, stats


def update_expert_bias(buffers: Buffers, tokens_per_expert: jax.Array, rate: float) -> Buffers:
    """One aux-loss-free bias step per layer from this step's (L, E) counts: b += rate·sign(mean − n),
    recentred to mean zero (`Router.update_bias`)."""
    counts = tokens_per_expert.astype(jnp.float32)
    out = dict(buffers)
    for i in range(counts.shape[0]):
        delta = rate * jnp.sign(counts[i].mean() - counts[i])
        out[bias_name(i)] = buffers[bias_name(i)] + (delta - delta.mean())
    return out
