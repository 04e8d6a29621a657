"""Sweep specs: the validated YAML a researcher writes to ask for a set of trials.

A spec names a recipe and a list of blocks. Each block crosses rungs × TPP values × a learning-rate /
weight-decay grid × dropout values × named ablation arms × seeds. The LR/WD grid is laid out in
(log LR, log LR·WD) coordinates, natural logs, because the report finds the optimum along a diagonal
band of constant LR·WD in (log LR, log WD): stepping log LR·WD moves across the band, stepping
log LR moves along it. By default it is centred per rung on the recipe's hyperparameter-law
prediction (`ladder.plan.plan_rung`). Validated once here (unknown keys rejected); expansion
(`sweeps.expand`) trusts it.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, field_validator, model_validator

from ladder.errors import LadderInputError
from ladder.plan.byte_sizes import parse_bytes
from ladder.plan.yaml_input import read_yaml, validate_mapping
from ladder.plan.values import finite_real

SWEEPS_DIR = Path(__file__).parent
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
# The training config's corpus manifest (rungs.config.TrainConfig): a path, made absolute at load.
DATA_MANIFEST_KEY = "data_manifest"


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
        spec's value). Checked when the spec is read (`check_block_resources`)."""
        if block.resources is None:
            return self.resources
        return Resources.model_validate({**self.resources.model_dump(),
                                         **block.resources.model_dump(exclude_unset=True)})


def available_specs() -> list[str]:
    return sorted(p.stem for p in SWEEPS_DIR.glob("*.yaml"))


def resolve_spec_path(name_or_path: str | Path) -> Path:
    candidate = Path(name_or_path)
    if candidate.is_file():
        return candidate
    named = SWEEPS_DIR / f"{name_or_path}.yaml"
    if candidate.suffix not in (".yaml", ".yml") and named.is_file():
        return named
    raise LadderInputError(f"sweep spec not found; shipped specs are {available_specs()} or give a path to a YAML file",
                           where=str(name_or_path))


def parse_spec(data: object, where: str) -> SweepSpec:
    spec = validate_mapping(SweepSpec, data, where=where, what="a sweep spec", schema="sweeps/spec.py",
                            messages={"too_short": "{msg}: an empty list would give an empty sweep"})
    check_override_values(spec, where=where)
    check_block_resources(spec, where=where)
    return spec


def check_block_resources(spec: SweepSpec, *, where: str = "sweep spec") -> None:
    """Each block's resources, merged field by field over the spec's, are resources a trial can hold (a
    block's `workers: 4` under the spec's `ep: 8` is not): refused naming `blocks.<name>.resources`."""
    from pydantic import ValidationError

    for block in spec.blocks:
        try:
            spec.block_resources(block)
        except ValidationError as err:
            detail = err.errors()[0]["msg"].removeprefix("Value error, ")
            inherited = sorted(set(Resources.model_fields) - block.resources.model_fields_set)
            raise LadderInputError(f"{detail} (the fields this block leaves out, {', '.join(inherited)}, are the "
                                   f"spec's)", where=where, field=f"blocks.{block.name}.resources") from None


# The knobs the grid sets, and what a value of each must be (the training config's bounds,
# rungs.config.TrainConfig): (is it valid, what is valid).
_GRID_VALUES: dict[str, tuple] = {
    "lr": (lambda v: finite_real(v) and v > 0, "a positive number (the peak learning rate)"),
    "weight_decay": (lambda v: finite_real(v) and v >= 0, "a non-negative number"),
    "dropout": (lambda v: finite_real(v) and 0 <= v < 1, "a number in [0, 1)"),
    "tpp": (lambda v: finite_real(v) and v > 0, "a positive number (tokens per parameter)"),
    "seed": (lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_SEED,
             f"an integer in 0..{MAX_SEED}"),
}
# A spec's or block's override of a grid knob contradicts the block's own grid of it (the grid would
# silently replace it); the block field that makes the grid, per knob.
_GRID_FIELDS = {"lr": "lr_wd", "weight_decay": "lr_wd", "tpp": "tpp", "dropout": "dropout"}


def _text_hint(value: OverrideValue) -> str:
    """Why a number may have arrived as text: YAML 1.1 (PyYAML) reads `1e-3`, with no dot, as a string."""
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return ""
        return f" (text: YAML reads a quoted number, and one such as 1e-3 with no dot, as a string; write {float(value)!r})"
    return ""


def check_override_values(spec: SweepSpec, *, where: str = "sweep spec") -> None:
    """The grid knobs (lr, weight_decay, dropout, tpp, seed) in `overrides` and in arms hold values a run
    can use, and no spec or block override is one a block's grid would silently replace: a spec's or
    block's lr / weight_decay replaces the law's centre of a block without an `lr_wd` grid (and is refused
    beside one), its tpp / dropout applies to a block without a `tpp` / `dropout` list, and seeds are
    set with `seeds:`. A `max_steps` in overrides or an arm is a positive whole number or null, and is not
    written beside the same level's `max_steps` field. Raises LadderInputError naming the field
    (`blocks.b.arms.a.lr`)."""
    def check(values: dict[str, OverrideValue], field: str) -> None:
        for key, (ok, valid) in _GRID_VALUES.items():
            if key in values and not ok(values[key]):
                raise LadderInputError(f"must be {valid}, got {values[key]!r}{_text_hint(values[key])}", where=where,
                                       field=f"{field}.{key}")

    def contradicts(values: dict[str, OverrideValue], field: str, blocks: list[Block]) -> None:
        if "seed" in values:
            raise LadderInputError("the seed is not an override: list seeds in `seeds:` (the spec's or a block's), "
                                   "or pin one in an arm", where=where, field=f"{field}.seed")
        for key, grid in _GRID_FIELDS.items():
            if key not in values:
                continue
            for block in blocks:
                if grid in block.model_fields_set and getattr(block, grid) not in (None, [None]):
                    raise LadderInputError(
                        f"contradicts the `{grid}` of block {block.name!r}, which sets {key} for every trial; "
                        f"remove one of them (an arm may pin {key} for its own trials)", where=where,
                        field=f"{field}.{key}")

    def cap(values: dict[str, OverrideValue], field: str, level: SweepSpec | Block | None = None) -> None:
        if MAX_STEPS_KEY not in values:
            return
        value = values[MAX_STEPS_KEY]
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise LadderInputError(f"must be a positive whole number of optimizer steps, or null for no cap, got "
                                   f"{value!r}{_text_hint(value)}", where=where, field=f"{field}.{MAX_STEPS_KEY}")
        if level is not None and level.max_steps is not None:
            owner = field.removesuffix("overrides")
            raise LadderInputError(f"contradicts `{owner}max_steps: {level.max_steps}`, which caps the same trials; "
                                   f"remove one of them (an arm may set its own max_steps)", where=where,
                                   field=f"{field}.{MAX_STEPS_KEY}")

    check(spec.overrides, "overrides")
    cap(spec.overrides, "overrides", spec)
    contradicts(spec.overrides, "overrides", spec.blocks)
    for block in spec.blocks:
        base = f"blocks.{block.name}"
        check(block.overrides, f"{base}.overrides")
        cap(block.overrides, f"{base}.overrides", block)
        contradicts(block.overrides, f"{base}.overrides", [block])
        for arm, values in block.arms.items():
            check(values, f"{base}.arms.{arm}")
            cap(values, f"{base}.arms.{arm}")


def load_spec(name_or_path: str | Path) -> SweepSpec:
    """Load and validate a sweep spec by name (`smoke`) or path. A relative recipe path, `data:` (the spec's
    and an arm's) and a `data_manifest` override (the spec's, a block's or an arm's) are relative to the
    spec's folder (as a manifest's files are to the manifest's); they come back absolute, so the trial key
    names the corpus, whatever directory the spec is run from."""
    path = resolve_spec_path(name_or_path)
    spec = parse_spec(read_yaml(path), str(path))
    folder = path.resolve().parent
    update: dict[str, object] = {}
    if is_recipe_path(spec.recipe) and not Path(spec.recipe).expanduser().is_absolute():
        update["recipe"] = str((folder / Path(spec.recipe).expanduser()).resolve())
    if spec.data is not None:
        update["data"] = _absolute(spec.data, folder)
    if DATA_MANIFEST_KEY in spec.overrides:
        update["overrides"] = _with_absolute_manifest(spec.overrides, folder)
    if any(b.has_data_arms or DATA_MANIFEST_KEY in b.overrides or any(DATA_MANIFEST_KEY in a for a in b.arms.values())
           for b in spec.blocks):
        update["blocks"] = [_with_absolute_paths(b, folder) for b in spec.blocks]
    return spec.model_copy(update=update) if update else spec


def _absolute(path: str, folder: Path) -> str:
    return str((folder / Path(path).expanduser()).resolve())


def _with_absolute_manifest(values: dict[str, OverrideValue], folder: Path) -> dict[str, OverrideValue]:
    """`values` with a relative `data_manifest` made absolute (a value that is no path is left to the resolver)."""
    manifest = values.get(DATA_MANIFEST_KEY)
    if not isinstance(manifest, str) or not manifest.strip():
        return values
    return {**values, DATA_MANIFEST_KEY: _absolute(manifest, folder)}


def _with_absolute_paths(block: Block, folder: Path) -> Block:
    arms = {}
    for name, arm in block.arms.items():
        arm = _with_absolute_manifest(arm, folder)
        arms[name] = {**arm, ARM_DATA_KEY: _absolute(str(arm[ARM_DATA_KEY]), folder)} if ARM_DATA_KEY in arm else arm
    return block.model_copy(update={"arms": arms, "overrides": _with_absolute_manifest(block.overrides, folder)})


def is_recipe_path(recipe: str) -> bool:
    """A recipe named by path (`recipes/mine.yaml`, `./mine`), not by name (`cpu-demo`)."""
    return Path(recipe).suffix in (".yaml", ".yml") or "/" in recipe or recipe.startswith(".")
