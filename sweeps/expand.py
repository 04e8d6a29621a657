"""Expansion: a validated SweepSpec → the list of trials it asks for, before resolution.

A trial here is (recipe, rung L, overrides, max_steps, resources) plus the coordinates it came from
(block, grid offsets, arm, seed) for display and analysis. The trial *key* is a hash of the resolved
config (`sweeps.keys`); resolving a trial into a config is the training job's business
(`ladder.plan.resolve`), so the orchestrator does that step and deduplicates by key.

Override precedence, lowest first: the grid point (lr, weight_decay, dropout, seed, tpp), spec.overrides,
block.overrides, the arm. A step cap follows the same order: the spec's `max_steps` (or a `max_steps` in its
overrides), the block's, the arm's; it is the trial's `max_steps`, not one of its overrides. A block's
`resources` are written over the spec's field by field. A spec's or block's lr / weight_decay replaces the
law's centre of a block without its own `lr_wd` grid; one beside such a grid, a tpp or dropout beside the
block's list of them, and a seed outside `seeds:` are refused when the spec is read
(`sweeps.spec.check_override_values`), so the grid never silently discards an override. A spec's or block's tpp is the block's TPP: the law's centre
is re-planned at it, as for a block's `tpp` list. An arm may pin any knob, the learning rate included (that
is how a forced-divergence arm is written), and changes only that knob: an arm that pins TPP keeps its grid
point's LR and WD. A trial's coordinates are the values it runs with.

A data arm (`data:` in an arm) is not an override: the arm's trials plan on the recipe re-planned on the
arm's own prepared corpus (`ladder.plan.data_arms`), so every source's repetition follows the arm's own
unique tokens; the trial carries the corpus in `data`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache

from ladder.errors import LadderInputError
from ladder.plan.generator import RungSpec, plan_rung
from ladder.plan.recipe import Recipe, load_recipe
from sweeps.spec import ARM_DATA_KEY, MAX_STEPS_KEY, Block, Centre, Resources, SweepSpec

# Names of the resolved-config knobs the grid sets (the override keys `ladder.plan.resolve` accepts).
LR_KEY = "lr"
WD_KEY = "weight_decay"
DROPOUT_KEY = "dropout"
SEED_KEY = "seed"
TPP_KEY = "tpp"


@dataclass(frozen=True)
class Trial:
    """One point of a sweep before resolution."""

    sweep: str
    block: str
    recipe: str
    L: int
    tpp: float
    lr: float
    weight_decay: float
    dropout: float | None
    arm: str
    seed: int
    log_lr_offset: float
    log_lr_wd_offset: float
    overrides: dict = field(hash=False)
    max_steps: int | None
    resources: Resources
    data: str | None = None  # a data arm's prepared corpus (None: the spec's or the recipe's data)
    tpp_in_label: bool = False  # the block lists several TPPs: the label names the trial's
    also_in: tuple[str, ...] = ()  # later blocks that asked for the same trial (`expand` keeps it once, as `block`'s)

    @property
    def label(self) -> str:
        """The trial's name in progress lines, tables and MLflow (unique within a sweep: `expand` checks)."""
        tpp = f" tpp{self.tpp:g}" if self.tpp_in_label else ""
        drop = "" if self.dropout is None else f" p{self.dropout:g}"
        arm = "" if self.arm == "base" else f" {self.arm}"
        return f"{self.block} L{self.L}{tpp} lr{self.lr:.3g} wd{self.weight_decay:.3g}{drop}{arm} s{self.seed}"

    def coordinates(self) -> dict:
        """Where the trial sits in the sweep: logged as MLflow tags so fits can group by them."""
        coords = {"block": self.block, "L": self.L, "tpp": self.tpp, "arm": self.arm, "seed": self.seed,
                  "lr": self.lr, "weight_decay": self.weight_decay, "dropout": self.dropout,
                  "log_lr_offset": self.log_lr_offset, "log_lr_wd_offset": self.log_lr_wd_offset}
        if self.data is not None:
            coords["data"] = self.data
        return coords


class _Planner:
    """plan_rung is pure but not free; a 1,000-trial sweep asks for the same few (L, TPP) pairs."""

    def __init__(self, recipe: Recipe) -> None:
        self.recipe = recipe
        self._plan = lru_cache(maxsize=None)(self._plan_uncached)

    def _plan_uncached(self, L: int, tpp: float | None) -> RungSpec:
        return plan_rung(self.recipe, L, tpp)

    def plan(self, L: int, tpp: float | None) -> RungSpec:
        return self._plan(L, tpp)


def grid_points(block: Block, rung: RungSpec) -> list[tuple[float, float, float, float]]:
    """(lr, weight_decay, Δ log LR, Δ log LR·WD) for each point of the block's grid on this rung."""
    return [grid_point(block, rung, d_lr, d_prod) for d_lr, d_prod in block.lr_wd.offsets()]


def grid_point(block: Block, rung: RungSpec, d_lr: float, d_prod: float) -> tuple[float, float, float, float]:
    """(lr, weight_decay, Δ log LR, Δ log LR·WD) of one grid offset, around the block's centre on `rung`
    (the law's LR and WD of that rung at its TPP, or the block's explicit centre)."""
    centre = block.lr_wd.centre
    lr0, wd0 = (centre.lr, centre.weight_decay) if isinstance(centre, Centre) else (rung.lr, rung.weight_decay)
    # Exact centre when the offset is zero, so the law's point keys the same as a plain rung.
    lr = lr0 if d_lr == 0 else lr0 * math.exp(d_lr)
    wd = wd0 if d_lr == 0 and d_prod == 0 else wd0 * math.exp(d_prod - d_lr)
    return lr, wd, d_lr, d_prod


class _Planners:
    """One planner per corpus: the spec's recipe, and the recipe re-planned on each data arm's corpus."""

    def __init__(self, spec: SweepSpec, recipe: Recipe) -> None:
        self.spec = spec
        self.base = _Planner(recipe)
        self._arms: dict[str, _Planner] = {}

    def for_data(self, data: str | None, where: str) -> _Planner:
        if data is None:
            return self.base
        if data not in self._arms:
            from ladder.plan.data_arms import load_arm_recipe

            self._arms[data] = _Planner(load_arm_recipe(self.spec.recipe, data, where=where, field="data"))
        return self._arms[data]


def _trial(spec: SweepSpec, block: Block, planners: _Planners, L: int, arm: str, data: str | None,
           overrides: dict, d_lr: float, d_prod: float, max_steps: int | None, resources: Resources) -> Trial:
    """The trial of one merged set of overrides: its coordinates (label, MLflow coord.* tags) are the
    values the trial runs with, an arm's pinned seed, TPP, dropout, LR or WD included."""
    planner = planners.for_data(data, f"blocks.{block.name}.arms.{arm}")
    tpp = None if overrides.get(TPP_KEY) is None else float(overrides[TPP_KEY])
    dropout = overrides.get(DROPOUT_KEY)
    return Trial(
        sweep=spec.name, block=block.name, recipe=spec.recipe, L=L, tpp=planner.plan(L, tpp).tpp,
        lr=float(overrides[LR_KEY]), weight_decay=float(overrides[WD_KEY]),
        dropout=None if dropout is None else float(dropout), arm=arm, seed=int(overrides[SEED_KEY]),
        log_lr_offset=d_lr, log_lr_wd_offset=d_prod, overrides=overrides, max_steps=max_steps,
        resources=resources, data=data, tpp_in_label=len(block.tpp) > 1)


def written_max_steps(spec: SweepSpec, block: Block, arm: dict) -> int | None:
    """A trial's step cap, the later place winning: the spec's `max_steps`, then a `max_steps` in its
    `overrides`, the block's likewise, then the arm's (`null` in an arm or an override lifts the cap).
    `sweeps.spec.check_override_values` refuses a level that sets it twice, and a value that is no cap."""
    cap = spec.max_steps
    for level in (spec, block):
        if level.max_steps is not None:
            cap = level.max_steps
        if MAX_STEPS_KEY in level.overrides:
            cap = level.overrides[MAX_STEPS_KEY]
    if MAX_STEPS_KEY in arm:
        cap = arm[MAX_STEPS_KEY]
    return cap


def expand_block(spec: SweepSpec, block: Block, planners: _Planners) -> list[Trial]:
    trials = []
    seeds = block.seeds if block.seeds is not None else spec.seeds
    dropouts: list[float | None] = list(block.dropout) if block.dropout is not None else [None]
    resources = spec.block_resources(block)  # the block's fields over the spec's
    # A spec's or block's tpp is the block's TPP (refused beside a `tpp` list): the law's centre is the
    # rung's at that TPP, whose steps the LR and WD laws read. An arm's pinned TPP is an ablation of that
    # one knob: its trials keep their grid point's LR and WD.
    written = {**spec.overrides, **block.overrides}
    for L in block.rungs:
        for tpp in block.tpp:
            centre_tpp = float(written[TPP_KEY]) if written.get(TPP_KEY) is not None else tpp
            rung = planners.base.plan(L, centre_tpp)
            for d_lr, d_prod in block.lr_wd.offsets():
                lr, wd, _, _ = grid_point(block, rung, d_lr, d_prod)
                for dropout in dropouts:
                    for arm, arm_entry in block.arms.items():
                        data = block.arm_data(arm)
                        arm_overrides = {k: v for k, v in arm_entry.items() if k != ARM_DATA_KEY}
                        # The cap is the trial's max_steps, not an override: an arm's beats the block's and
                        # the spec's (the resolver applies its max_steps after the overrides).
                        max_steps = written_max_steps(spec, block, arm_overrides)
                        for seed in seeds:
                            # A spec's or block's lr / weight_decay replaces the law's centre (sweeps.spec
                            # refuses one beside the block's own lr_wd grid), so the grid sets only the rest.
                            overrides = {LR_KEY: lr, WD_KEY: wd, **spec.overrides, **block.overrides,
                                         SEED_KEY: seed}
                            if tpp is not None:
                                overrides[TPP_KEY] = tpp
                            if dropout is not None:
                                overrides[DROPOUT_KEY] = dropout
                            overrides.update(arm_overrides)
                            overrides.pop(MAX_STEPS_KEY, None)
                            trials.append(_trial(spec, block, planners, L, arm, data, overrides, d_lr, d_prod,
                                                 max_steps, resources))
    return trials


def at_law(spec: SweepSpec, trial: Trial) -> bool:
    """The trial runs at its rung's law LR and WD (`ladder.plan.plan_rung`): the centre of a block whose
    `lr_wd` centre is the law, with no lr or weight_decay written in the spec's or the block's overrides or
    in its arm (each replaces the law's value)."""
    if trial.log_lr_offset != 0 or trial.log_lr_wd_offset != 0:
        return False
    block = next(b for b in spec.blocks if b.name == trial.block)
    if isinstance(block.lr_wd.centre, Centre):
        return False
    written = (spec.overrides, block.overrides, block.arms.get(trial.arm, {}))
    return not any(key in values for values in written for key in (LR_KEY, WD_KEY))


def expand(spec: SweepSpec, recipe: Recipe | None = None) -> list[Trial]:
    """All trials of a spec in a stable order (block, rung, TPP, grid point, dropout, arm, seed).

    Trials whose overrides coincide (a grid centre that is also a plain ladder rung) appear once,
    under the first block that asks for them (the others in its `also_in`). Two different trials with one label are refused: progress
    lines, the demo's time-left estimate and `ladder sweep status` name trials by it.
    """
    recipe = recipe or load_recipe(spec.recipe, data=spec.data)
    planners = _Planners(spec, recipe)
    first: dict[tuple, int] = {}
    out = []
    for block in spec.blocks:
        for trial in expand_block(spec, block, planners):
            ident = (trial.L, trial.max_steps, trial.data,
                     tuple(sorted((k, repr(v)) for k, v in trial.overrides.items())))
            if ident not in first:
                first[ident] = len(out)
                out.append(trial)
            elif trial.block not in (kept := out[first[ident]]).also_in and trial.block != kept.block:
                out[first[ident]] = replace(kept, also_in=(*kept.also_in, trial.block))
    by_label: dict[str, Trial] = {}
    for trial in out:
        other = by_label.setdefault(trial.label, trial)
        if other is not trial:
            raise LadderInputError(
                f"two trials are both labelled {trial.label!r} (overrides {other.overrides} and {trial.overrides}): "
                "their coordinates agree to the digits a label shows; space the grid points further apart",
                where=f"blocks.{trial.block}")
    return out
