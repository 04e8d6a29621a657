"""The sweep spec's schema: the pydantic models of the YAML a researcher writes to ask for a set of trials.

A spec names a recipe and a list of blocks. Each block crosses rungs × TPP values × a learning-rate /
weight-decay grid × dropout values × named ablation arms × seeds. The LR/WD grid is laid out in
(log LR, log LR·WD) coordinates, natural logs, because the report finds the optimum along a diagonal
band of constant LR·WD in (log LR, log WD): stepping log LR·WD moves across the band, stepping
log LR moves along it. By default it is centred per rung on the recipe's hyperparameter-law
prediction (`ladder.plan.plan_rung`). Each model checks its own fields (unknown keys rejected); the checks
across fields and levels are `sweeps.spec_checks`', and reading a spec file is `sweeps.spec`'s. Expansion
(`sweeps.expand`) trusts a validated spec.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, field_validator, model_validator

from ladder.errors import LadderInputError
from ladder.plan.byte_sizes import parse_bytes

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _one_value(value: object) -> object:
    """A config override is one value; a list or a mapping was pydantic's "should be a valid boolean"."""
    if isinstance(value, (list, tuple, dict)):
        raise ValueError(f"an override sets one config value (a number, text, true/false or null), got "
                         f"{type(value).__name__} {value!r}")
    return value


OverrideValue = Annotated[bool | int | float | str | None, BeforeValidator(_one_value)]
# Grid offsets are natural logs: beyond ±20 (a factor of 5e8) a value is a unit mistake, not a sweep.
MAX_LOG_OFFSET = 20.0
# An arm's corpus (sweeps.expand, ladder.plan.data_arms): not a config override but the data it trains on.
ARM_DATA_KEY = "data"
# A trial's step cap: the spec's and a block's `max_steps` field, or a `max_steps` in overrides or an arm
# (sweeps.expand.written_max_steps: the later place wins).
MAX_STEPS_KEY = "max_steps"


def _check_name(v: str) -> str:
    if not _NAME.match(v):
        raise ValueError(f"name {v!r} must be letters, digits, '_', '-' or '.'")
    return v


Name = Annotated[str, AfterValidator(_check_name)]  # block, arm and sweep names: safe in paths and MLflow


def _not_bool(value: object) -> object:
    # pydantic reads true as 1 and false as 0 where a number is due: a `tpp: [yes]` would plan TPP 1.
    if isinstance(value, bool):
        raise ValueError(f"must be a number, not {str(value).lower()}")
    return value


# A number, not a bool; text that is a number (PyYAML reads `1e-3`, with no dot, as text) is read as one.
Real = Annotated[float, BeforeValidator(_not_bool)]
Count = Annotated[int, BeforeValidator(_not_bool)]
# A training seed: torch and numpy take 0..2**32-1 (rungs.config.TrainConfig.seed has the same bound).
MAX_SEED = 2**32 - 1
Seed = Annotated[StrictInt, Field(ge=0, le=MAX_SEED)]


class _Strict(BaseModel):
    # allow_inf_nan=False: `Field(gt=0)` alone lets inf through (and YAML spells it `.inf`).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Axis(_Strict):
    """Offsets in natural-log units around the centre: `points` values `spacing` apart, centred
    (an even count straddles the centre), or an explicit list of `offsets`. A field that would be ignored
    is refused: `spacing` or `points` beside `offsets`, and a non-zero `spacing` with `points: 1`."""

    spacing: Real = Field(default=0.0, ge=0)
    points: StrictInt = Field(default=1, ge=1)
    offsets: list[Real] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Axis:
        if self.offsets is not None and len(self.offsets) == 0:
            raise ValueError("offsets is empty: the grid would have no points; give at least one offset (0 is the centre)")
        written = [name for name in ("spacing", "points") if name in self.model_fields_set]
        if self.offsets is not None and written:
            raise ValueError(f"`{written[0]}` is ignored beside `offsets`, which lists every point itself: give either "
                             f"`offsets` or `spacing` and `points`")
        if self.offsets is None and self.points == 1 and self.spacing != 0:
            raise ValueError(f"`spacing` {self.spacing:g} does nothing with `points: 1` (the default: the centre "
                             f"alone); set `points` (e.g. 3) or remove `spacing`")
        if self.offsets is None and self.points > 1 and self.spacing <= 0:
            raise ValueError(f"{self.points} points need a positive spacing (natural-log units)")
        far = [v for v in self.values() if abs(v) > MAX_LOG_OFFSET]
        if far:
            raise ValueError(f"offset {far[0]:g} is more than {MAX_LOG_OFFSET:g} natural-log units from the centre "
                             f"(a factor of {math.exp(MAX_LOG_OFFSET):.1e}); offsets are natural logs, e.g. 0.7 "
                             f"for ×2")
        return self

    def values(self) -> list[float]:
        if self.offsets is not None:
            return list(self.offsets)
        mid = (self.points - 1) / 2
        return [(i - mid) * self.spacing for i in range(self.points)]


class Centre(_Strict):
    """An explicit grid centre instead of the law's prediction."""

    lr: Real = Field(gt=0, description="peak learning rate; must be positive")
    weight_decay: Real = Field(gt=0, description="decoupled weight decay; must be positive")


class LrWdGrid(_Strict):
    """The grid in (log LR, log LR·WD). `layout: grid` is the full product of the two axes (a·b points);
    `cross` is the centre plus each axis's non-zero offsets stepped alone: a+b−1 points for axes of a and
    b points that hold the centre, one more for an axis of explicit `offsets` without 0. An even `points`
    has no point at the centre (it straddles it) and is refused for `cross`: its cross would cost a+b+1
    points, more than the full grid at 2×2."""

    centre: Literal["law"] | Centre = "law"
    log_lr: Axis = Axis()
    log_lr_wd: Axis = Axis()
    layout: Literal["grid", "cross"] = "grid"

    @model_validator(mode="after")
    def _cross_has_a_centre(self) -> LrWdGrid:
        if self.layout == "cross":
            for name in ("log_lr", "log_lr_wd"):
                axis: Axis = getattr(self, name)
                if axis.offsets is None and axis.points % 2 == 0:
                    raise ValueError(f"layout cross steps each axis alone from the centre, but `{name}` has "
                                     f"{axis.points} points, an even count with none at the centre (the cross would "
                                     f"be {axis.points} + the other axis + 1 points); give an odd `points`, or "
                                     f"`layout: grid`")
        return self

    def offsets(self) -> list[tuple[float, float]]:
        """(Δ log LR, Δ log LR·WD) pairs, the centre first when it is on the grid."""
        lrs, products = self.log_lr.values(), self.log_lr_wd.values()
        if self.layout == "grid":
            pairs = [(a, b) for a in lrs for b in products]
        else:
            pairs = [(0.0, 0.0)] + [(a, 0.0) for a in lrs if a != 0.0] + [(0.0, b) for b in products if b != 0.0]
        pairs.sort(key=lambda p: (p != (0.0, 0.0), p))
        return list(dict.fromkeys(pairs))


class Resources(_Strict):
    """What one trial holds while it runs, per worker; every CPU and GPU it touches is declared to
    Ray (marin's lesson: an undeclared GPU makes the next job fail with 'device busy')."""

    cpus: Real = Field(default=1.0, gt=0)
    gpus: Real = Field(default=0.0, ge=0)
    workers: Count = Field(default=1, ge=1, description=">1 starts a Ray Train TorchTrainer with a process group")
    # A launch detail, not part of the trial key: None lets the memory planner choose
    # (ladder.plan.memory.planned_expert_parallel), so multi-worker trials get expert parallelism.
    ep: Count | None = Field(default=None, ge=1, description="expert-parallel size of a multi-worker trial")
    # The GPU a trial runs on, e.g. 186GB: `ladder sweep plan` and `sweep run` check each trial's per-rank
    # peak (the memory planner, ladder.plan.memory) against it, less the planner's headroom, before launch.
    gpu_memory: str | None = Field(default=None, description="memory of one GPU, e.g. 186GB or 80GiB")

    @field_validator("gpu_memory")
    @classmethod
    def _a_memory_size(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_bytes(value, field="gpu_memory")
            except LadderInputError as err:
                raise ValueError(err.detail) from None
        return value

    @property
    def gpu_memory_bytes(self) -> int | None:
        return None if self.gpu_memory is None else parse_bytes(self.gpu_memory, field="gpu_memory")

    @model_validator(mode="after")
    def _one_gpu_per_worker(self) -> Resources:
        if self.workers > 1 and self.gpus not in (0, 1):
            raise ValueError(f"a multi-worker trial runs one worker per GPU; for {self.workers} workers × "
                             f"{self.gpus:g} GPUs write gpus: 1, workers: {int(self.workers * self.gpus)}")
        if self.ep is not None and self.workers % self.ep:
            raise ValueError(f"ep={self.ep} must divide workers={self.workers} (dp × ep = workers)")
        return self

    def total(self) -> dict[str, float]:
        return {"CPU": self.cpus * self.workers, "GPU": self.gpus * self.workers}


class Block(_Strict):
    """One cross product of the spec. Fields left out inherit the spec's value."""

    name: Name
    rungs: list[StrictInt] = Field(min_length=1)
    tpp: list[Real | None] = Field(default=[None], min_length=1, description="None: the recipe's TPP")
    lr_wd: LrWdGrid = LrWdGrid()
    dropout: list[Real] | None = Field(default=None, description="None: the recipe's dropout")
    arms: dict[str, dict[str, OverrideValue]] = Field(default={"base": {}}, min_length=1)
    seeds: list[Seed] | None = None
    max_steps: StrictInt | None = Field(default=None, gt=0)
    overrides: dict[str, OverrideValue] = Field(default_factory=dict)
    resources: Resources | None = None

    @field_validator("rungs")
    @classmethod
    def _rungs_positive(cls, rungs: list[int]) -> list[int]:
        if any(r <= 0 for r in rungs):
            raise ValueError(f"rungs are positive layer counts L, got {rungs}")
        return rungs

    @field_validator("tpp")
    @classmethod
    def _tpp_positive(cls, values: list[float | None]) -> list[float | None]:
        if any(v is not None and v <= 0 for v in values):
            raise ValueError(f"TPP values must be positive, got {values}")
        return values

    @field_validator("dropout")
    @classmethod
    def _dropout_range(cls, values: list[float] | None) -> list[float] | None:
        if values is not None and (not values or any(not 0 <= v < 1 for v in values)):
            raise ValueError(f"dropout must be a non-empty list of rates in [0, 1), got {values}")
        return values

    @field_validator("seeds")
    @classmethod
    def _seeds_ok(cls, values: list[int] | None) -> list[int] | None:
        if values is not None and (not values or any(s < 0 for s in values)):
            raise ValueError(f"seeds must be a non-empty list of non-negative integers, got {values}")
        return values

    @field_validator("arms")
    @classmethod
    def _arm_data_is_a_path(cls, arms: dict[str, dict[str, OverrideValue]]) -> dict[str, dict[str, OverrideValue]]:
        for name, arm in arms.items():
            if not _NAME.match(name):  # arm names key MLflow tags and labels, as block names do
                raise ValueError(f"arm name {name!r} must be letters, digits, '_', '-' or '.'")
            value = arm.get(ARM_DATA_KEY, "")
            if ARM_DATA_KEY in arm and (not isinstance(value, str) or not value.strip()):
                raise ValueError(f"arm {name!r}: data must be the path of a prepared corpus (`ladder data prepare "
                                 f"ARM/manifest.yaml --out DIR`), got {value!r}")
        return arms

    def arm_data(self, arm: str) -> str | None:
        """The corpus the arm trains on (a data arm), or None (the spec's or the recipe's)."""
        value = self.arms[arm].get(ARM_DATA_KEY)
        return None if value is None else str(value)

    @property
    def has_data_arms(self) -> bool:
        return any(ARM_DATA_KEY in arm for arm in self.arms.values())


class SweepSpec(_Strict):
    name: Name
    recipe: str = Field(description="recipe name (cpu-demo, mai-base-2) or a path (relative to the spec's folder)")
    # Replaces the recipe's own `data:` for every trial (ladder.plan.corpus_data): a corpus manifest or a
    # directory `ladder data prepare` wrote, relative to the spec's folder.
    data: str | None = Field(default=None, description="corpus manifest or prepared directory")
    description: str = ""
    experiment: str | None = Field(default=None, description="MLflow experiment (default: sweep-<name>)")
    blocks: list[Block] = Field(min_length=1)
    seeds: list[Seed] = Field(default=[0], min_length=1)
    max_steps: StrictInt | None = Field(default=None, gt=0, description="cap on optimizer steps (smoke/nightly runs)")
    overrides: dict[str, OverrideValue] = Field(default_factory=dict, description="applied to every trial")
    resources: Resources = Resources()
    max_concurrent: Count | None = Field(default=None, ge=1)
    max_failures: Count = Field(default=1, ge=0, description="retries of a trial that raises (divergence is not retried)")

    @field_validator("data")
    @classmethod
    def _data_is_a_path(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():  # "" would resolve to the spec's own folder
            raise ValueError("must be the path of a corpus manifest or a prepared directory, got an empty string "
                             "(leave `data` out for the recipe's corpus)")
        return value

    @field_validator("seeds")
    @classmethod
    def _seeds_ok(cls, values: list[int]) -> list[int]:
        if any(s < 0 for s in values):
            raise ValueError(f"seeds must be non-negative integers, got {values}")
        return values

    @model_validator(mode="after")
    def _unique_blocks(self) -> SweepSpec:
        names = [b.name for b in self.blocks]
        if len(set(names)) != len(names):
            raise ValueError(f"block names must be unique, got {names}")
        return self

    @property
    def experiment_name(self) -> str:
        return self.experiment or f"sweep-{self.name}"

    def block_resources(self, block: Block) -> Resources:
        """A block's resources: the fields it writes over the spec's (a field it leaves out inherits the
        spec's value). Checked when the spec is read (`sweeps.spec_checks.check_block_resources`)."""
        if block.resources is None:
            return self.resources
        return Resources.model_validate({**self.resources.model_dump(),
                                         **block.resources.model_dump(exclude_unset=True)})
