"""TrainConfig: one training job's resolved configuration, validated once at the edge.

Built from the flat dict `ladder.plan.resolve.resolve_train_config` produces (a RungSpec's `to_dict()`
plus training defaults plus overrides). Unknown keys and wrong types raise `TrainConfigError`
naming the key and what is valid; code below this trusts the config.
"""

from __future__ import annotations

import typing
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rungs.agc_settings import AGCSettings
from rungs.architecture import ModelConfig
from rungs.identity import config_key, legacy_checkpoint_key
from rungs.tracking_uri import DEFAULT_TRACKING_URI


# Fields added after runs existed, at the value those runs had: left out of a config's identity (its
# key() and its sweep trial key), so a config that sets one that way keeps the key, and the finished
# trial, it had before the field existed.
LEGACY_VALUES: dict[str, Any] = {"subset": "prefix", "peak_flops_per_device": None, "backend": "torch",
                                 "activation_checkpointing": "none", "jax_mesh_expert": None,
                                 "capacity_factor": None, "data_key": None, "data_seed": None,
                                 "data_order": "permutation"}
# Fields that no longer exist (nothing read them): an old config that sets one still loads, and its key
# is what it was (neither key ever included them).
REMOVED_FIELDS = frozenset({"log_interval"})


def at_legacy_value(key: str, value: Any) -> bool:
    """Whether this config entry is a field at the value runs had before the field existed."""
    return key in LEGACY_VALUES and value == LEGACY_VALUES[key]


def _takes_bool(annotation: Any) -> bool:
    """Whether a field's type admits a bool (bool itself, bool | None, or Any)."""
    return annotation is bool or annotation is Any or bool in typing.get_args(annotation)


def _type_name(annotation: Any) -> str:
    """A field's type in words for an error: "float", "int", "str"..."""
    names = [getattr(a, "__name__", str(a)) for a in (typing.get_args(annotation) or (annotation,)) if a is not type(None)]
    return " or ".join(names) or str(annotation)


def bool_refusal(annotation: Any, value: object) -> str | None:
    """Why `value` cannot stand for a field of type `annotation`, when it is true/false where a number goes
    (pydantic reads `lr: true` as 1.0 and `steps: false` as 0, a typo trained as a value); else None."""
    if isinstance(value, bool) and not _takes_bool(annotation):
        return f"takes {_type_name(annotation)}, not true/false (got {str(value).lower()})"
    return None


def refuse_bool_numbers(model: type[BaseModel], data: Any) -> Any:
    """`data` (a pydantic model's raw input) unchanged, or ValueError naming the first key `bool_refusal` refuses."""
    if isinstance(data, dict):
        for key, value in data.items():
            field = model.model_fields.get(key)
            why = bool_refusal(field.annotation, value) if field is not None else None
            if why:
                raise ValueError(f"{key}: {why}")
    return data


class TrainConfigError(ValueError):
    """A training configuration that cannot run: names the key and what would be valid."""

    def __init__(self, message: str, *, key: str | None = None) -> None:
        self.key = key
        self.detail = message
        super().__init__(f"{key}: {message}" if key else message)


class SourcePlan(BaseModel):
    """One source's allocation at this rung (the `sources` entries of RungSpec.to_dict())."""

    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)
    share: float = Field(gt=0, le=1)
    unique_tokens: float = Field(gt=0)
    epochs: float = Field(gt=0)


class TrainConfig(BaseModel):
    # Non-finite floats are refused at the edge: lr=inf used to pass `gt=0` and come back as a
    # "diverged" trial, a bad input recorded as a scientific result.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    # --- identity (tags) ---
    recipe: str = "custom"
    L: int | None = Field(default=None, ge=1)
    trial_key: str | None = None

    # --- architecture (RungSpec.to_dict() names) ---
    n_layers: int = Field(gt=0)
    d_model: int = Field(gt=0)
    n_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    n_kv_heads_global: int = Field(gt=0)
    n_kv_heads_local: int = Field(gt=0)
    global_every: int = Field(gt=0)
    window_tokens: int = Field(gt=0)
    seq_len: int = Field(gt=0)
    n_experts: int = Field(gt=0)
    top_k: int = Field(gt=0)
    n_shared_experts: int = Field(ge=0)
    latent_dim: int = Field(gt=0)
    expert_hidden: int = Field(gt=0)
    shared_hidden: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    tied_embeddings: bool = False

    # --- counts from the plan (FLOPs and MFU accounting) ---
    flops_per_token: float = Field(gt=0, description="training FLOPs per token (3 × forward)")
    params_total: int | None = Field(default=None, ge=1)
    params_active: int | None = Field(default=None, ge=1)
    tpp: float | None = Field(default=None, gt=0, description="tokens per active parameter the plan used")

    # --- run length and batch ---
    steps: int = Field(gt=0)
    max_steps: int | None = Field(default=None, gt=0, description="stop early after this many steps")
    batch_sequences: int = Field(gt=0)
    micro_batch_sequences: int | None = Field(default=None, gt=0, description="gradient accumulation unit")

    # --- optimisation ---
    lr: float = Field(gt=0)
    weight_decay: float = Field(ge=0)
    adam_lr: float | None = Field(default=None, gt=0)
    muon_momentum: float = Field(default=0.95, ge=0, lt=1)
    adam_beta1: float = Field(default=0.9, ge=0, lt=1)
    adam_beta2: float = Field(default=0.95, ge=0, lt=1)
    # Muon's update-scale convention: the keys of rungs.muon.CONVENTIONS (named here, as rungs.muon imports torch).
    adjust_lr: Literal["match_rms_adamw", "original"] = "match_rms_adamw"
    schedule: Literal["cosine", "wsd"] = "cosine"
    warmup_steps: int | None = Field(default=None, ge=0, description="default: 5% of steps")
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)
    decay_fraction: float = Field(default=0.2, gt=0, le=1)
    grad_clip: float | None = Field(default=1.0, gt=0)
    dropout: float = Field(default=0.0, ge=0, lt=1)

    # --- MoE ---
    router_score: Literal["softmax", "sigmoid"] = "softmax"
    lb_loss_coef: float = Field(default=0.01, ge=0)
    z_loss_coef: float = Field(default=0.0, ge=0)
    expert_bias: bool = False
    bias_update_rate: float = Field(default=1e-3, ge=0)
    capacity_per_expert: int | None = Field(default=None, gt=0)
    # Or the capacity as a multiple of the balanced load: ceil(factor x pairs per call / n_experts) (under
    # expert parallelism also a cap on the rows a rank sends each peer a round, which sizes the
    # all-to-all buffers by the balanced load instead of the worst case). None: a legacy value, no key changes.
    capacity_factor: float | None = Field(default=None, gt=0, description="MoE capacity per round / balanced load")
    group_size: int | None = Field(default=None, gt=0)

    # --- activation gradient clipping ---
    agc: bool = True
    agc_points: tuple[str, ...] = ("residual", "moe_input")
    agc_granularity: Literal["token", "sequence"] = "token"
    agc_mode: Literal["fixed", "median"] = "median"
    agc_threshold: float = Field(default=8.0, gt=0)
    agc_median_window_steps: int = Field(default=100, gt=0)

    # --- numerics and reproducibility ---
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto: cuda when torch sees a GPU, else cpu
    # "auto": bf16 autocast on a GPU; fp32 on CPU, where at demo widths bf16 autocast measured 2x
    # slower than fp32 (casts dominate tiny matmuls; benchmarks/train_step.py).
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    seed: int = Field(default=0, ge=0, le=2**32 - 1)  # torch and numpy seed with 0..2**32-1
    # The data order's seed (rungs.data.sampler: each source's shuffle per epoch), apart from the weights' and
    # dropout's: runs on one `seed` and different `data_seed`s start from the same weights and see the data in
    # different orders, so the two parts of the seed noise can be measured apart and arms paired on their
    # initialisation. None, the legacy value: the data order follows `seed` (no key changes).
    data_seed: int | None = Field(default=None, ge=0, le=2**32 - 1, description="data order seed (None: seed)")
    # How a pass orders its documents (rungs.data.sampler): "permutation" a seeded shuffle of the subset, the
    # legacy value (no key changes); "keyed" each document by a hash of its id, so arms whose subsets share
    # documents see them in the same order on one seed, and pairing arms on the seed pairs their data order.
    data_order: Literal["permutation", "keyed"] = "permutation"
    deterministic: bool = False
    # Which job runs the rung: the PyTorch engine or the JAX one (rungs.jaxjob). The default is
    # a legacy value: "torch" leaves every existing key as it was; "jax" is a different trial.
    backend: Literal["torch", "jax"] = "torch"
    # The JAX job's (data, expert) mesh over every device its process(es) see: the expert axis's
    # size (rungs.jaxjob.sharding.default_expert_axis when None: the largest that divides both the
    # device count and n_experts); the data axis takes the rest. None is a legacy value: no key changes.
    jax_mesh_expert: int | None = Field(default=None, gt=0, description="JAX mesh: devices on the expert axis")
    threads: int | None = Field(default=None, gt=0, description="torch intra-op threads (default: the idle cores)")
    # Recompute in backward instead of keeping activations (rungs.model.Block): "selective" the
    # attention sub-layer, "full" the whole block. Memory only: the gradients are the same.
    activation_checkpointing: Literal["none", "selective", "full"] = "none"
    # The MFU denominator (rungs.metrics.device_peak): None takes the device's dense bf16 spec peak
    # from the table, or the nominal CPU peak. It changes only the MFU reported, yet a value set is part of
    # the config key (rungs.identity keys every field but those it names; None, the legacy value, is left
    # out): a run recorded with one denominator is not found under another.
    peak_flops_per_device: float | None = Field(default=None, gt=0, description="spec peak FLOP/s of one device")

    # --- divergence ---
    spike_factor: float = Field(default=3.0, gt=1, description="loss > factor × running median → diverged")
    spike_warmup_steps: int = Field(default=50, ge=0, description="no spike rule before this step")

    # --- data ---
    sources: dict[str, SourcePlan] = Field(min_length=1)
    data_manifest: str | None = None  # None: the demo corpus
    # A sweep's data arm: a content hash of its manifest and files (ladder.plan.data_arms), so a changed
    # curation rule reruns the trials of that arm only. Identity only: the job reads data_manifest.
    data_key: str | None = None
    # How a source's unique subset is chosen (rungs.data.sampler): "stratified" keeps the source's
    # mix of collections at every rung; "prefix" is the rule of runs made before 2026-11-30.
    subset: Literal["stratified", "prefix"] = "stratified"
    data_cache_root: str = Field(default="runs/data", description="where prepared corpora are cached")

    # --- evaluation, checkpoints, logging ---
    eval_interval: int = Field(default=100, gt=0)
    eval_batch_size: int = Field(default=8, gt=0)
    # The intermediate evals' fixed sample (rungs.evaluation): documents spread across each held-out
    # set up to this many tokens. What it scores changes nothing trained: not part of the config key.
    eval_tokens_per_domain: int | None = Field(default=16384, gt=0, description="token budget per domain of the "
                                               "intermediate evals' spread sample (None: eval_max_docs_per_domain)")
    eval_max_docs_per_domain: int | None = Field(default=4, gt=0, description="with eval_tokens_per_domain=None: "
                                                 "the intermediate evals' first N docs of each domain (None: all)")
    # The final eval is the number the fits consume: every held-out document by default, so a
    # rung's BPB is not at the mercy of which few documents come first.
    final_eval_max_docs_per_domain: int | None = Field(default=None, gt=0, description="docs per domain of the final eval (None: all)")
    eval_stride: int | None = Field(default=None, gt=0, description="sliding-window stride (default: seq_len)")
    checkpoint_interval: int = Field(default=100, gt=0)

    # --- tracking ---
    tracking_uri: str | None = DEFAULT_TRACKING_URI  # None or "": no tracking
    experiment_name: str = Field(default="ladder", description="the MLflow experiment")

    @model_validator(mode="before")
    @classmethod
    def _no_bool_numbers(cls, data: Any) -> Any:
        """true/false where a number goes is refused (`--set lr=true` is not lr = 1.0)."""
        return refuse_bool_numbers(cls, data)

    @field_validator("data_cache_root", "experiment_name")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        """A blank cache root is the working directory (corpora written there); MLflow refuses a blank name."""
        if not value.strip():
            raise ValueError("must not be blank")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k={self.top_k} exceeds n_experts={self.n_experts}")
        for kv_key in ("n_kv_heads_global", "n_kv_heads_local"):
            kv = getattr(self, kv_key)
            if self.n_heads % kv:
                raise ValueError(f"{kv_key}={kv} must divide n_heads={self.n_heads}")
        if self.jax_mesh_expert is not None and self.backend != "jax":
            raise ValueError(f"jax_mesh_expert={self.jax_mesh_expert} shapes the JAX job's mesh; backend is "
                             f"{self.backend!r} (set backend=jax, or leave jax_mesh_expert unset)")
        if self.capacity_factor is not None and self.capacity_per_expert is not None:
            raise ValueError(f"capacity_factor={self.capacity_factor} and capacity_per_expert="
                             f"{self.capacity_per_expert} both size the MoE rounds: set one")
        if self.capacity_factor is not None and self.backend == "jax":
            raise ValueError(f"capacity_factor={self.capacity_factor} sizes the PyTorch job's MoE rounds; the JAX "
                             "job does not read it (set capacity_per_expert, or leave capacity_factor unset)")
        if self.group_size is not None and self.n_experts % self.group_size:
            raise ValueError(f"group_size={self.group_size} must divide n_experts={self.n_experts} (experts lend "
                             "each other slots within equal groups)")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
        if self.micro_batch_sequences is not None and self.batch_sequences % self.micro_batch_sequences:
            raise ValueError(f"micro_batch_sequences={self.micro_batch_sequences} must divide "
                             f"batch_sequences={self.batch_sequences}")
        if self.eval_stride is not None and self.eval_stride > self.seq_len:
            raise ValueError(f"eval_stride={self.eval_stride} exceeds seq_len={self.seq_len}")
        if self.warmup_steps is not None and self.warmup_steps > self.run_steps:
            raise ValueError(f"warmup_steps={self.warmup_steps} exceeds the {self.run_steps} steps this job runs")
        if self.agc and not self.agc_points:
            raise ValueError("agc=true with no agc_points clips nothing (and keys a trial apart from agc=false, "
                             "which trains the same): set agc=false, or name the points")
        AGCSettings(points=self.agc_points, granularity=self.agc_granularity, mode=self.agc_mode,
                    threshold=self.agc_threshold, median_window_steps=self.agc_median_window_steps)
        return self

    # --- derived views ---
    @property
    def run_steps(self) -> int:
        """Steps this job runs: the planned steps, cut short by max_steps."""
        return min(self.steps, self.max_steps) if self.max_steps else self.steps

    @property
    def schedule_steps(self) -> int:
        """The LR schedule spans the steps actually run, so a --max-steps run still anneals."""
        return self.run_steps

    @property
    def warmup(self) -> int:
        return self.warmup_steps if self.warmup_steps is not None else max(1, round(0.05 * self.schedule_steps))

    def bf16_on(self, device_type: str) -> bool:
        """Whether the job computes in bf16 on the device it runs on: precision bf16, or auto on a GPU.
        The engine resolves `device` (auto: what its framework sees, `rungs.torch_engine.resolve_device`)
        where it builds, so planning and keying, which import this config, never import torch."""
        return self.precision == "bf16" or (self.precision == "auto" and device_type == "cuda")

    @property
    def accumulation_steps(self) -> int:
        return self.batch_sequences // (self.micro_batch_sequences or self.batch_sequences)

    @property
    def batch_tokens(self) -> int:
        return self.batch_sequences * self.seq_len

    def architecture(self) -> ModelConfig:
        return ModelConfig(
            n_layers=self.n_layers, d_model=self.d_model, n_heads=self.n_heads, head_dim=self.head_dim,
            n_kv_heads_global=self.n_kv_heads_global, n_kv_heads_local=self.n_kv_heads_local,
            global_every=self.global_every, window_tokens=self.window_tokens, seq_len=self.seq_len,
            n_experts=self.n_experts, top_k=self.top_k, n_shared_experts=self.n_shared_experts,
            latent_dim=self.latent_dim, expert_hidden=self.expert_hidden, shared_hidden=self.shared_hidden,
            vocab_size=self.vocab_size, tied_embeddings=self.tied_embeddings, dropout=self.dropout,
            router_score=self.router_score, expert_bias=self.expert_bias, bias_update_rate=self.bias_update_rate,
            capacity_per_expert=self.capacity_per_expert, capacity_factor=self.capacity_factor,
            group_size=self.group_size,
            activation_checkpointing=self.activation_checkpointing,
        )

    def agc_settings(self) -> AGCSettings | None:
        if not self.agc:
            return None
        return AGCSettings(points=self.agc_points, granularity=self.agc_granularity, mode=self.agc_mode,
                           threshold=self.agc_threshold, median_window_steps=self.agc_median_window_steps)

    @property
    def order_seed(self) -> int:
        """The seed of the data order: `data_seed`, else `seed`."""
        return self.seed if self.data_seed is None else self.data_seed

    def sources_plan(self) -> dict[str, dict]:
        return {name: s.model_dump() for name, s in self.sources.items()}

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def key(self) -> str:
        """The config's identity (`rungs.identity.config_key`, as a sweep's trial key): a stable hash of
        everything that changes the trained model, not where it is tracked. Names the job's
        checkpoints, its MLflow run and its `ladder train` run directory."""
        return config_key(self.to_dict(), LEGACY_VALUES)

    def legacy_key(self) -> str:
        """The key checkpoints and run directories of this config carried before `key()` was the one
        identity (`rungs.identity.legacy_checkpoint_key`): read, to resume them; never written."""
        return legacy_checkpoint_key(self.to_dict(), LEGACY_VALUES)

    def resume_keys(self) -> tuple[str, ...]:
        """The stored config keys whose checkpoints this config resumes: its key, then its legacy key."""
        return (self.key(), self.legacy_key())


def field_names() -> list[str]:
    return list(TrainConfig.model_fields)


def parse_config(data: TrainConfig | dict) -> TrainConfig:
    """Validate a resolved config dict; raise TrainConfigError naming the first bad key."""
    if isinstance(data, TrainConfig):
        return data
    if not isinstance(data, dict):
        raise TrainConfigError(f"a training config is a mapping of keys to values, got {type(data).__name__}")
    # RungSpec.to_dict() carries plan-only keys the job does not need; accept and drop them.
    known = set(TrainConfig.model_fields)
    plan_only = {"params_embedding", "params_nonembedding_total", "params_active_with_embeddings", "tokens",
                 "batch_tokens", "flops_per_token_forward", "train_flops"}
    data = {k: v for k, v in data.items() if (k in known or k not in plan_only) and k not in REMOVED_FIELDS}
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        key = ".".join(str(p) for p in first["loc"]) or None
        if first["type"] == "extra_forbidden":
            msg = f"unknown key; valid keys are {sorted(known)}"
        elif first["type"] == "missing":
            msg = "required key is missing"
        else:  # a cross-field rule's message already names its keys; pydantic's prefix adds nothing
            msg = first["msg"].removeprefix("Value error, ")
        more = f" (and {len(err.errors()) - 1} more problem(s))" if len(err.errors()) > 1 else ""
        raise TrainConfigError(msg + more, key=key) from None
