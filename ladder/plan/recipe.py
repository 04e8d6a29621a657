"""Recipes as data: the rules that turn one scale parameter L into a model, a run and a data plan.

A recipe is a YAML file validated once here (pydantic, unknown keys rejected); everything below
trusts it. Recipes are found by name in `ladder/recipes/` or given as a path.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from ladder.errors import LadderInputError
from ladder.plan.corpus_data import check_mixture, check_tokenizer, log_warnings, read_corpus, resolve_data_path
from ladder.plan.yaml_input import read_yaml, validate_mapping
from rungs.config import bool_refusal

RECIPES_DIR = Path(__file__).parent.parent / "recipes"
SHARE_TOLERANCE = 1e-6


class _Strict(BaseModel):
    # allow_inf_nan=False: `Field(gt=0)` alone lets inf through (and YAML spells it `.inf`).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """true/false where a number goes is refused: pydantic would plan `tpp: true` as TPP 1."""
        why = bool_refusal(cls.model_fields[info.field_name].annotation, value)
        if why:
            raise ValueError(why)
        return value


class WidthRule(_Strict):
    """d_model = width_per_layer · L (MAI: 256/3). Written as a fraction so 256/3 stays exact."""

    numerator: int = Field(gt=0)
    denominator: int = Field(default=1, gt=0)
    require_integer: bool = True


class HeadRule(_Strict):
    """Query heads = L rounded to the nearest multiple (half rounds up), at least `min_heads`."""

    multiple: int = Field(gt=0)
    min_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)


class DepthRule(_Strict):
    """n_layers = `layers` at every rung instead of L. At fixed depth a rung's active parameters grow
    as L² and its FLOPs at fixed TPP as L⁴ (L⁶ with depth = L), so the rungs of a ladder sit closer
    in compute and a small budget holds more of them (docs/backtest_diagnosis/)."""

    layers: int = Field(gt=0)


class AttentionRule(_Strict):
    """GQA pattern: layer i (0-based) is global when (i + 1) % global_every == 0, else local."""

    n_kv_heads_global: int = Field(gt=0)
    n_kv_heads_local: int = Field(gt=0)
    global_every: int = Field(gt=0)
    window_tokens: int = Field(gt=0, description="sliding window of the local layers")


class MoERule(_Strict):
    """Every layer is MoE. Widths are ratios of d_model rounded to `round_to`."""

    n_experts: int = Field(gt=0)
    top_k: int = Field(gt=0)
    n_shared_experts: int = Field(ge=0)
    latent_ratio: float = Field(gt=0, le=1, description="latent_dim / d_model (1.0: no latent projection)")
    expert_hidden_ratio: float = Field(gt=0, description="routed expert SwiGLU hidden / d_model")
    shared_hidden_ratio: float = Field(gt=0, description="shared expert SwiGLU hidden / d_model")
    round_to: int = Field(default=1, gt=0)

    @model_validator(mode="after")
    def _top_k_fits(self) -> MoERule:
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k={self.top_k} exceeds n_experts={self.n_experts}")
        return self


class BatchRule(_Strict):
    """batch_tokens = coef · tokens^exponent (StepLaw's B_opt form), rounded to whole sequences."""

    coef: float = Field(gt=0)
    exponent: float = Field(ge=0, lt=1)
    min_sequences: int = Field(default=1, gt=0)
    sequence_multiple: int = Field(default=1, gt=0)


class HparamLaws(_Strict):
    """The report's laws (natural logs): LR*·WD* = c / steps^k and log LR* = a + b·log TPP + c·log steps."""

    lr_wd_product_coef: float = Field(default=17.04, gt=0)
    lr_wd_product_steps_exponent: float = Field(default=-1.0)
    log_lr_intercept: float = Field(default=-1.51)
    log_lr_log_tpp: float = Field(default=0.175)
    log_lr_log_steps: float = Field(default=-0.573)
    source: str = "MAI-Base-2 report"

    def lr_wd_text(self) -> str:
        return f"{self.lr_wd_product_coef:g} · steps^{self.lr_wd_product_steps_exponent:g}"

    def log_lr_text(self) -> str:
        def term(coef: float, name: str) -> str:
            return f"{'-' if coef < 0 else '+'} {abs(coef):g}·{name}"

        return f"{self.log_lr_intercept:g} {term(self.log_lr_log_tpp, 'log TPP')} {term(self.log_lr_log_steps, 'log steps')}"


class Source(_Strict):
    """One data source: its share of training tokens and its unique tokens at full scale (left out
    only when the recipe names prepared `data:`, which then supplies the count)."""

    name: str
    share: float = Field(gt=0, le=1)
    unique_tokens: float | None = Field(default=None, gt=0, description="unique tokens available at full scale")
    domain: str | None = None


class GpuPool(_Strict):
    name: str
    peak_bf16_flops_per_gpu: float = Field(gt=0)
    default_gpus: int = Field(default=1, gt=0)
    default_mfu: float = Field(default=0.4, gt=0, le=1)
    default_goodput: float = Field(default=0.9, gt=0, le=1)


class Recipe(_Strict):
    name: str
    description: str = ""
    width: WidthRule
    heads: HeadRule
    attention: AttentionRule
    depth: DepthRule | None = Field(default=None, description="absent: n_layers = L (MAI-Base-2's rule)")
    moe: MoERule
    vocab_size: int = Field(gt=0)
    tied_embeddings: bool = False
    seq_len: int = Field(gt=0)
    tpp: float = Field(gt=0, description="training tokens per active (non-embedding) parameter")
    batch: BatchRule
    hparam_laws: HparamLaws = HparamLaws()
    dropout: float = Field(default=0.0, ge=0, lt=1)
    # The corpus (a manifest, or a directory `ladder data prepare` wrote) the mixture is learned from
    # when `mixture` is left out, and checked against when it is written (ladder.plan.corpus_data).
    # Relative to the recipe file's folder. Loaded, it is absolute and `mixture` is always filled.
    data: str | None = Field(default=None, description="corpus manifest or prepared directory")
    mixture: list[Source] | None = Field(default=None, min_length=1)
    full_scale_tokens: float = Field(gt=0, description="token budget of the full-scale run")
    full_scale_rung: int = Field(gt=0, description="L of the full-scale model")
    ladder_rungs: list[int] = Field(min_length=1, description="the default rungs of `ladder plan`")
    gpu_pool: GpuPool
    _data_warnings: tuple[str, ...] = PrivateAttr(default=())

    @field_validator("mixture")
    @classmethod
    def _shares_sum_to_one(cls, mixture: list[Source] | None) -> list[Source] | None:
        if mixture is None:
            return mixture
        total = sum(s.share for s in mixture)
        if abs(total - 1.0) > SHARE_TOLERANCE:
            raise ValueError(f"source shares sum to {total:.6g}; they must sum to 1")
        names = [s.name for s in mixture]
        if len(set(names)) != len(names):
            raise ValueError(f"source names must be unique, got {names}")
        return mixture

    @model_validator(mode="after")
    def _mixture_or_data(self) -> Recipe:
        if self.data is None and self.mixture is None:
            raise ValueError("needs a `mixture` (sources with share and unique_tokens) or `data:` (a corpus "
                             "manifest or prepared directory to learn it from)")
        return self

    @property
    def data_warnings(self) -> tuple[str, ...]:
        """What the plan-time data checks found worth a look (ladder.plan.corpus_data)."""
        return self._data_warnings

    @field_validator("ladder_rungs")
    @classmethod
    def _rungs_positive(cls, rungs: list[int]) -> list[int]:
        if any(r <= 0 for r in rungs):
            raise ValueError(f"rungs must be positive scale parameters L, got {rungs}")
        return rungs

    def d_model(self, n_layers: int) -> int:
        """The width rule; raises when L gives a non-integer width under a rule that requires one, and when
        it gives none (below 1). A rule that does not require an integer rounds half up, as every rule does."""
        num = self.width.numerator * n_layers
        rule = f"{self.width.numerator}/{self.width.denominator}·{n_layers} = {num / self.width.denominator:.2f}"
        if num % self.width.denominator and self.width.require_integer:
            raise LadderInputError(
                f"L={n_layers} gives d_model = {rule}, not an integer; valid L are multiples of "
                f"{self.width.denominator // math.gcd(self.width.numerator, self.width.denominator)}",
                where=f"recipe {self.name}", field="width")
        d = math.floor(num / self.width.denominator + 0.5)
        if d < 1:
            raise LadderInputError(f"L={n_layers} gives d_model = {rule}, which rounds to {d}: no model; choose a "
                                   "larger L or a wider rule", where=f"recipe {self.name}", field="width")
        return d

    def n_layers(self, L: int) -> int:
        """The depth rule: L itself unless the recipe fixes the depth."""
        return L if self.depth is None else self.depth.layers


def available_recipes() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def resolve_recipe_path(name_or_path: str | Path) -> Path:
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or candidate.exists():
        if not candidate.is_file():
            raise LadderInputError(f"recipe file not found; named recipes are {available_recipes()}", where=str(candidate))
        return candidate
    named = RECIPES_DIR / f"{name_or_path}.yaml"
    if not named.is_file():
        raise LadderInputError(
            f"no recipe named {name_or_path!r}; valid names are {available_recipes()} or a path to a YAML file",
            where="recipe",
        )
    return named


def parse_recipe(data: object, where: str, *, folder: Path | None = None, corpus: str | Path | None = None) -> Recipe:
    """Validate a recipe; with `data:` (or `corpus`, which replaces it: `--data`, a spec's `data:`) learn
    or check its mixture. A relative recipe `data:` is relative to `folder`, a relative `corpus` to the
    working directory."""
    recipe = validate_mapping(Recipe, data, where=where, what="a recipe", schema="ladder/plan/recipe.py")
    if corpus is not None:
        return with_data(recipe, resolve_data_path(corpus, None), where=where, field="--data")
    if recipe.data is not None:
        return with_data(recipe, resolve_data_path(recipe.data, folder), where=where, field="data")
    for i, s in enumerate(recipe.mixture or []):
        if s.unique_tokens is None:
            raise LadderInputError("required key is missing (or give the recipe `data:`, a prepared corpus, to take "
                                   "it from)", where=where, field=f"mixture.{i}.unique_tokens")
    return recipe


def with_data(recipe: Recipe, path: Path, *, where: str, field: str = "data") -> Recipe:
    """The recipe with its mixture learned from the corpus at `path` (when it has none) or checked
    against it, the unique tokens it leaves out filled from the prepared counts."""
    corpus = read_corpus(path, where=where, field=field)
    warnings = check_tokenizer(corpus, recipe.vocab_size, where=where, field=field)
    written = recipe.mixture is not None
    mixture = list(recipe.mixture) if written else list(corpus.sources)  # CorpusSource reads like a Source
    warnings += check_mixture(mixture, corpus, where=where, field="mixture" if written else field)
    filled = []
    for i, s in enumerate(mixture):
        found = corpus.source(s.name)
        unique = s.unique_tokens if s.unique_tokens is not None else found.unique_tokens
        if unique is not None and unique <= 0:
            raise LadderInputError(
                f"source {s.name!r} of {corpus.path} has no tokens left to train on (every document of it was "
                "decontaminated, deduplicated or empty); drop it from the mixture or prepare the corpus with "
                "documents in it", where=where, field=f"mixture[{i}].unique_tokens" if written else field)
        if unique is None:
            raise LadderInputError(
                f"{corpus.path} is a bare manifest: it has no token counts (they depend on the tokenizer and on "
                f"decontamination); run `ladder data prepare {corpus.path} --out DIR --vocab-size "
                f"{recipe.vocab_size}` and name DIR, or write a mixture with unique_tokens", where=where,
                field=f"mixture[{i}].unique_tokens" if written else field)
        filled.append(Source(name=s.name, share=s.share, unique_tokens=float(unique), domain=s.domain or found.domain))
    log_warnings(warnings, where)
    out = recipe.model_copy(update={"data": str(path), "mixture": filled})
    out._data_warnings = tuple(warnings)
    return out


def load_recipe(name_or_path: str | Path, *, data: str | Path | None = None) -> Recipe:
    """Load and validate a recipe by name (`mai-base-2`) or by path; `data` replaces its `data:`."""
    path = resolve_recipe_path(name_or_path)
    return parse_recipe(read_yaml(path), str(path), folder=path.resolve().parent, corpus=data)
