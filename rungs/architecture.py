"""The one definition of a rung's architecture: plain, torch-free data. The plan counts it
(`ladder.plan.counting`), the config resolves it (`rungs.config.TrainConfig.architecture()`), the torch
and JAX models build it; nothing here imports a framework, so a dry run can use it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Architecture:
    """Every field a model builder needs; plain data, no rules."""

    n_layers: int
    d_model: int
    n_heads: int
    head_dim: int
    n_kv_heads_global: int
    n_kv_heads_local: int
    global_every: int
    window_tokens: int
    seq_len: int
    n_experts: int
    top_k: int
    n_shared_experts: int
    latent_dim: int
    expert_hidden: int
    shared_hidden: int
    vocab_size: int
    tied_embeddings: bool = False

    def is_global_layer(self, layer: int) -> bool:
        """Layer i (0-based) is global when (i + 1) % global_every == 0: MAI's every 6th layer."""
        return (layer + 1) % self.global_every == 0

    @property
    def n_global_layers(self) -> int:
        return sum(self.is_global_layer(i) for i in range(self.n_layers))

    @property
    def has_latent_projection(self) -> bool:
        return self.latent_dim != self.d_model


@dataclass(frozen=True)
class ModelConfig(Architecture):
    """An Architecture plus what the torch and JAX models need to build and train it (routing, init)."""

    dropout: float = 0.0
    router_score: str = "softmax"  # "softmax" | "sigmoid"
    expert_bias: bool = False  # aux-loss-free balancing (DeepSeek-V3): a bias used only for top-k selection
    bias_update_rate: float = 1e-3
    capacity_per_expert: int | None = None  # multi-round MoE: per-expert slots per round (None: one round)
    capacity_factor: float | None = None  # or slots = factor x the balanced load (rungs.moe.RoutedExperts)
    group_size: int | None = None  # experts that lend each other unused slots
    rope_theta: float = 10_000.0
    init_std: float = 0.02
    activation_checkpointing: str = "none"  # "none" | "selective" (attention) | "full" (block): recompute in backward


# The projections that write into the residual stream: GPT-2 scales their init by 1/sqrt(2·n_layers).
OUTPUT_PROJECTIONS = ("attn.wo.weight", "w_down.weight", "experts.w_down", "latent_up.weight")
# Every other matrix the policy knows (the router and the expert stacks among them): N(0, init_std).
INPUT_MATRICES = ("embed.weight", "lm_head.weight", "attn.wq.weight", "attn.wk.weight", "attn.wv.weight",
                  "moe.router.weight", "w_gate.weight", "w_up.weight", "experts.w_gate", "experts.w_up",
                  "latent_down.weight")


def init_std(name: str, cfg: ModelConfig) -> float | None:
    """The model's one init policy, by parameter name: N(0, init_std), output projections scaled by
    1/sqrt(2·n_layers); None for norm weights, which start at 1. The torch model's `init_weights`, the
    JAX parameters and the GPU benchmark's on-device draw all take their scale from here. A name
    without a rule is refused: a new parameter states its init here instead of inheriting one."""
    if name.endswith("norm.weight"):
        return None
    if name.endswith(OUTPUT_PROJECTIONS):
        return cfg.init_std / (2 * cfg.n_layers) ** 0.5
    if name.endswith(INPUT_MATRICES):
        return cfg.init_std
    raise ValueError(f"the init policy has no rule for parameter {name!r}: add one to rungs.architecture.init_std")


def layer_shapes(arch: Architecture, layer: int) -> dict[str, tuple[int, ...]]:
    """Shapes of one transformer block's parameters, (out, in) like torch.nn.Linear."""
    d, hd = arch.d_model, arch.head_dim
    q = arch.n_heads * hd
    kv = (arch.n_kv_heads_global if arch.is_global_layer(layer) else arch.n_kv_heads_local) * hd
    e, h, lat = arch.n_experts, arch.expert_hidden, arch.latent_dim
    p = f"layers.{layer}."
    shapes: dict[str, tuple[int, ...]] = {
        p + "attn_norm.weight": (d,),
        p + "attn.wq.weight": (q, d),
        p + "attn.wk.weight": (kv, d),
        p + "attn.wv.weight": (kv, d),
        p + "attn.wo.weight": (d, q),
        p + "moe_norm.weight": (d,),
        p + "moe.router.weight": (e, d),
        p + "moe.experts.w_gate": (e, h, lat),
        p + "moe.experts.w_up": (e, h, lat),
        p + "moe.experts.w_down": (e, lat, h),
    }
    if arch.n_shared_experts:
        sh = arch.shared_hidden * arch.n_shared_experts
        shapes |= {
            p + "moe.shared.w_gate.weight": (sh, d),
            p + "moe.shared.w_up.weight": (sh, d),
            p + "moe.shared.w_down.weight": (d, sh),
        }
    if arch.has_latent_projection:
        shapes |= {p + "moe.latent_down.weight": (lat, d), p + "moe.latent_up.weight": (d, lat)}
    return shapes


def parameter_shapes(arch: Architecture) -> dict[str, tuple[int, ...]]:
    """Every trainable tensor of the model, by its state_dict name."""
    shapes: dict[str, tuple[int, ...]] = {"embed.weight": (arch.vocab_size, arch.d_model)}
    for layer in range(arch.n_layers):
        shapes |= layer_shapes(arch, layer)
    shapes["final_norm.weight"] = (arch.d_model,)
    if not arch.tied_embeddings:
        shapes["lm_head.weight"] = (arch.vocab_size, arch.d_model)
    return shapes
