"""The one definition of a rung's architecture: plain, torch-free data. The plan counts it
(`ladder.counting`), the config resolves it (`rungs.config.TrainConfig.architecture()`), the torch
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
    group_size: int | None = None  # experts that lend each other unused slots
    rope_theta: float = 10_000.0
    init_std: float = 0.02
