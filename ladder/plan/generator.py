"""The rung generator: one scale parameter L (the layer count unless the recipe fixes the depth) →
a complete, frozen RungSpec.

Pure arithmetic (no torch): architecture from the recipe's rules, exact parameter and FLOP counts
from the tensor shapes (`ladder.plan.counting`), tokens = TPP × active parameters, batch and steps,
default LR/WD from the hyperparameter laws, and the per-source data plan (`ladder.plan.sources`).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, field

from fits.errors import FitInputError
from fits.report_laws import hparams_from_report
from ladder.plan.counting import Architecture, count_flops_per_token, count_parameters
from ladder.errors import LadderInputError
from ladder.plan.recipe import Recipe
from ladder.plan.sources import SourceAllocation, plan_sources
from ladder.plan.values import finite_real


def round_half_up(x: float) -> int:
    return int(math.floor(x + 0.5))


def round_to_multiple(x: float, multiple: int, minimum: int | None = None) -> int:
    """x to the nearest multiple (half up), at least `minimum` rounded up to a multiple (default one multiple):
    a batch rule's `min_sequences: 1` does not undo its `sequence_multiple: 64`."""
    value = multiple * round_half_up(x / multiple)
    return max(value, multiple * max(1, math.ceil(minimum / multiple)) if minimum is not None else multiple)


@dataclass(frozen=True)
class RungSpec:
    """Everything one rung needs, resolved. Field names are the `ladder plan --json` contract."""

    recipe: str
    L: int
    arch: Architecture
    params_total: int
    params_active: int  # non-embedding parameters one token passes through (TPP is per these)
    params_embedding: int
    params_nonembedding_total: int
    params_active_with_embeddings: int
    tpp: float
    tokens: int  # steps × batch_tokens: what the run trains on
    batch_tokens: int
    batch_sequences: int
    steps: int
    flops_per_token: float  # training (3 × forward)
    flops_per_token_forward: float
    train_flops: float
    lr: float
    weight_decay: float
    dropout: float
    sources: dict[str, SourceAllocation] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The JSON form of one rung (docs/architecture.md `ladder plan` contract plus the extra architecture fields)."""
        a = self.arch
        return {
            "recipe": self.recipe,
            "L": self.L,
            "n_layers": a.n_layers,
            "d_model": a.d_model,
            "n_heads": a.n_heads,
            "head_dim": a.head_dim,
            "n_kv_heads_global": a.n_kv_heads_global,
            "n_kv_heads_local": a.n_kv_heads_local,
            "global_every": a.global_every,
            "window_tokens": a.window_tokens,
            "seq_len": a.seq_len,
            "n_experts": a.n_experts,
            "top_k": a.top_k,
            "n_shared_experts": a.n_shared_experts,
            "latent_dim": a.latent_dim,
            "expert_hidden": a.expert_hidden,
            "shared_hidden": a.shared_hidden,
            "vocab_size": a.vocab_size,
            "tied_embeddings": a.tied_embeddings,
            "params_total": self.params_total,
            "params_active": self.params_active,
            "params_embedding": self.params_embedding,
            "params_nonembedding_total": self.params_nonembedding_total,
            "params_active_with_embeddings": self.params_active_with_embeddings,
            "tokens": self.tokens,
            "tpp": self.tpp,
            "batch_tokens": self.batch_tokens,
            "batch_sequences": self.batch_sequences,
            "steps": self.steps,
            "flops_per_token": self.flops_per_token,
            "flops_per_token_forward": self.flops_per_token_forward,
            "train_flops": self.train_flops,
            "lr": self.lr,
            "weight_decay": self.weight_decay,
            "dropout": self.dropout,
            "sources": {
                name: {k: v for k, v in asdict(s).items() if k != "name"} for name, s in self.sources.items()
            },
        }


def kv_heads_for(n_heads: int, wanted: int) -> int:
    """GQA needs the KV heads to divide the query heads: the largest divisor not above `wanted`."""
    return max(k for k in range(1, min(n_heads, wanted) + 1) if n_heads % k == 0)


def architecture(recipe: Recipe, L: int) -> Architecture:
    if L <= 0:
        raise LadderInputError(f"a rung is a positive scale parameter L, got L={L}", field="L")
    d = recipe.d_model(L)
    heads = max(recipe.heads.min_heads, recipe.heads.multiple * round_half_up(L / recipe.heads.multiple))
    moe = recipe.moe
    latent = d if moe.latent_ratio >= 1.0 else min(d, round_to_multiple(moe.latent_ratio * d, moe.round_to))
    return Architecture(
        n_layers=recipe.n_layers(L),
        d_model=d,
        n_heads=heads,
        head_dim=recipe.heads.head_dim,
        n_kv_heads_global=kv_heads_for(heads, recipe.attention.n_kv_heads_global),
        n_kv_heads_local=kv_heads_for(heads, recipe.attention.n_kv_heads_local),
        global_every=recipe.attention.global_every,
        window_tokens=recipe.attention.window_tokens,
        seq_len=recipe.seq_len,
        n_experts=moe.n_experts,
        top_k=moe.top_k,
        n_shared_experts=moe.n_shared_experts,
        latent_dim=latent,
        expert_hidden=round_to_multiple(moe.expert_hidden_ratio * d, moe.round_to),
        shared_hidden=round_to_multiple(moe.shared_hidden_ratio * d, moe.round_to),
        vocab_size=recipe.vocab_size,
        tied_embeddings=recipe.tied_embeddings,
    )


def batch_for(recipe: Recipe, target_tokens: float) -> tuple[int, int]:
    """(batch_sequences, batch_tokens) from the recipe's batch rule."""
    rule = recipe.batch
    target_sequences = rule.coef * target_tokens**rule.exponent / recipe.seq_len
    sequences = round_to_multiple(target_sequences, rule.sequence_multiple, minimum=rule.min_sequences)
    return sequences, sequences * recipe.seq_len


def default_lr_wd(recipe: Recipe, tpp: float, steps: int) -> tuple[float, float]:
    """The report's laws: log LR* = a + b·log TPP + c·log steps and LR*·WD* = coef · steps^k."""
    try:
        hp = hparams_from_report(recipe.hparam_laws.model_dump(), steps=steps, tpp=tpp, source="")
    except FitInputError as err:  # laws that give no usable LR (e^1000): the recipe's, so named as its field
        raise LadderInputError(err.detail, where=f"recipe {recipe.name}", field="hparam_laws") from None
    return hp["lr"]["value"], hp["wd"]["value"]


# The largest L a rung may have. Counting a rung's parameters walks its layers (~14 µs a layer), so an L of
# millions (a typo) took minutes and gigabytes before the budget check refused it; the report's full scale
# is L=102.
MAX_RUNG = 10_000


def plan_rung(recipe: Recipe, L: int, tpp: float | None = None) -> RungSpec:
    if isinstance(L, bool) or not isinstance(L, numbers.Integral) or not 1 <= L <= MAX_RUNG:
        raise LadderInputError(f"a rung's L is a whole number of layers from 1 to {MAX_RUNG:,} (the report's full "
                               f"scale is L=102), got {L!r}", where=f"recipe {recipe.name}", field="L")
    L = int(L)
    tpp = recipe.tpp if tpp is None else tpp
    if not (finite_real(tpp) and tpp > 0):  # text would fail deep inside the arithmetic
        raise LadderInputError(f"TPP must be a positive, finite number, got {tpp!r}", field="--tpp")
    tpp = float(tpp)  # numpy scalars too: the plan's JSON holds plain floats
    arch = architecture(recipe, L)
    params = count_parameters(arch)
    flops = count_flops_per_token(arch)
    target_tokens = tpp * params.nonembedding_active
    batch_sequences, batch_tokens = batch_for(recipe, target_tokens)
    steps = max(1, math.ceil(target_tokens / batch_tokens - 1e-9))
    tokens = steps * batch_tokens
    lr, wd = default_lr_wd(recipe, tpp, steps)
    try:
        sources = plan_sources(recipe.mixture, tokens, recipe.full_scale_tokens, rounding_tokens=tokens - target_tokens)
    except LadderInputError as err:
        raise LadderInputError(f"rung L{L} at TPP {tpp:g}: {err.detail}", where=f"recipe {recipe.name}", field=err.field) from None
    return RungSpec(
        recipe=recipe.name,
        L=L,
        arch=arch,
        params_total=params.total,
        params_active=params.nonembedding_active,
        params_embedding=params.embedding,
        params_nonembedding_total=params.nonembedding_total,
        params_active_with_embeddings=params.active,
        tpp=tpp,
        tokens=tokens,
        batch_tokens=batch_tokens,
        batch_sequences=batch_sequences,
        steps=steps,
        flops_per_token=flops.training,
        flops_per_token_forward=flops.forward,
        train_flops=flops.training * tokens,
        lr=lr,
        weight_decay=wd,
        dropout=recipe.dropout,
        sources=sources,
    )


def plan_ladder(recipe: Recipe, rungs: list[int] | None = None, tpp: float | None = None) -> list[RungSpec]:
    """The rungs `rungs` of a recipe (None: its `ladder_rungs`) at `tpp` (None: its TPP)."""
    return [plan_rung(recipe, L, tpp) for L in (recipe.ladder_rungs if rungs is None else rungs)]
