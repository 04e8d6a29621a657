"""From a sweep spec to keyed, resolved trials, and the checks that must pass before launch.

Expansion (`sweeps.expand`) says which points the spec asks for; resolution
(`ladder.plan.resolve.resolve_train_config`) turns each point into the exact config a training job
runs; the trial key is the hash of that config (`sweeps.keys`). Everything here is pure and fast,
so a bad spec is refused before Ray or the tracking server starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from ladder.errors import LadderInputError
from ladder.plan.corpus_data import read_corpus
from ladder.plan.recipe import Recipe, load_recipe
from rungs.tracking import sqlite_path
from sweeps.expand import DROPOUT_KEY, LR_KEY, SEED_KEY, TPP_KEY, WD_KEY, Trial, expand
from sweeps.keys import trial_key
from sweeps.spec import MAX_STEPS_KEY, Resources, SweepSpec

Resolver = Callable[..., dict]
DATA_KEY = "data_manifest"  # the training config's corpus (rungs.config.TrainConfig)


@dataclass(frozen=True)
class PlannedTrial:
    trial: Trial
    key: str
    config: dict  # the resolved training config (identity only: tracking fields are added at launch)
    # every block that asked for this key, the trial's first: two blocks may share one (the LR/WD grid's
    # centre is the ladder's rung), trained once, and each block's analysis must find it
    blocks: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return self.trial.label


def default_resolver() -> Resolver:
    from ladder.plan.resolve import resolve_train_config

    return resolve_train_config


def spec_recipe(spec: SweepSpec, *, where: str = "sweep spec") -> Recipe:
    """The spec's recipe, its mixture learned from or checked against the spec's `data:` (else the
    recipe's own); an error names the spec and the field (`recipe`, or `data`)."""
    try:
        return load_recipe(spec.recipe, data=spec.data)
    except LadderInputError as err:
        if spec.data is not None and err.field == "--data":
            raise LadderInputError(err.detail, where=where, field="data") from None
        inner = ": ".join(p for p in (err.where if err.where != "recipe" else None, err.field) if p)
        raise LadderInputError(f"{inner}: {err.detail}" if inner else err.detail, where=where,
                               field="recipe") from None


def plan_sweep(spec: SweepSpec, *, where: str = "sweep spec", recipe: Recipe | None = None,
               resolve: Resolver | None = None) -> list[PlannedTrial]:
    """Resolve and key every trial, and check its inputs (its corpus exists and has the sources its
    mixture names), before anything runs; trials that resolve to the same config run once."""
    if recipe is None:
        recipe = spec_recipe(spec, where=where)
    resolve = resolve or default_resolver()
    if spec.data is not None:
        resolve = partial(resolve, data=spec.data)
    check_arm_evals(spec, recipe, where=where)
    try:
        trials = expand(spec, recipe)
    except LadderInputError as err:  # e.g. a rung × TPP the recipe cannot plan
        if err.where and err.where.startswith("blocks."):
            raise LadderInputError(err.detail, where=where, field=err.where) from None
        raise LadderInputError(str(err), where=where, field="blocks") from None
    planned: dict[str, PlannedTrial] = {}
    bases: dict[tuple, dict] = {}
    for trial in trials:
        try:
            config = _resolve(resolve, spec.recipe, trial, bases)
        except LadderInputError as err:
            raise LadderInputError(f"trial {trial.label}: {err.detail}", where=where,
                                   field=_override_field(spec, trial, err.field)) from None
        except ValueError as err:  # the training job's own config errors (rungs.config.TrainConfigError)
            raise LadderInputError(f"trial {trial.label}: {err}", where=where, field=f"blocks.{trial.block}") from None
        workers = trial.resources.workers
        if workers > 1 and config["batch_sequences"] % workers:
            # Data-parallel ranks split each batch evenly (rungs.launch); say so before launching.
            raise LadderInputError(
                f"trial {trial.label}: batch_sequences={config['batch_sequences']} does not split over "
                f"{workers} workers; override batch_sequences with a multiple of {workers} or change "
                f"resources.workers", where=where, field=f"blocks.{trial.block}")
        check_trial_data(config, trial, spec, where=where)
        key = trial_key(config)
        first = planned.setdefault(key, PlannedTrial(trial=trial, key=key, config=config, blocks=(trial.block,)))
        more = tuple(b for b in (trial.block, *trial.also_in) if b not in first.blocks)
        if more:
            planned[key] = replace(first, blocks=(*first.blocks, *more))
    if not planned:
        raise LadderInputError("the spec expands to no trials", where=where, field="blocks")
    return list(planned.values())


def check_arm_evals(spec: SweepSpec, recipe: Recipe, *, where: str) -> None:
    """Every arm of a block with data arms scores on the same held-out sets (the same files): an EG between
    arms measured on different text compares nothing. Arms without `data:` use the spec's or recipe's corpus."""
    from ladder.plan.data_arms import eval_identity

    for block in spec.blocks:
        if not block.has_data_arms:
            continue
        base = spec.data if spec.data is not None else recipe.data
        first_arm, first = None, None
        for arm in block.arms:
            data = block.arm_data(arm)
            field = f"blocks.{block.name}.arms.{arm}.data" if data is not None else "data"
            evals = eval_identity(data if data is not None else base, where=where, field=field)
            if first_arm is None:
                first_arm, first = arm, evals
            elif evals != first:
                raise LadderInputError(
                    f"arm {arm!r} is scored on other held-out sets than arm {first_arm!r} (its sets: "
                    f"{', '.join(e[0] for e in evals) or 'none'}; the names, domains or files differ): arms are "
                    "compared on the same held-out text; prepare every arm from a manifest whose eval sets name "
                    "the same files", where=where, field=field)


def _written_at(spec: SweepSpec, trial: Trial, key: str) -> str | None:
    """Where a trial's override `key` was written, the later place first: its arm, its block's or the spec's
    overrides; None where none of them has it."""
    block = next(b for b in spec.blocks if b.name == trial.block)
    if key in block.arms.get(trial.arm, {}):
        return f"blocks.{trial.block}.arms.{trial.arm}.{key}"
    if key in block.overrides:
        return f"blocks.{trial.block}.overrides.{key}"
    if key in spec.overrides:
        return f"overrides.{key}"
    return None


# Where a block's grid sets a knob the spec did not write: the block field that makes the grid.
_GRID_FIELD_OF = {LR_KEY: "lr_wd", WD_KEY: "lr_wd", DROPOUT_KEY: "dropout", TPP_KEY: "tpp"}


def _override_field(spec: SweepSpec, trial: Trial, key: str | None) -> str:
    """Where the override `key` a trial's resolution refused was written (`--set`, the resolver's name for its
    overrides, is the first unknown key's, else the first architecture field's: the model they make is the
    invalid one). A knob no override wrote came from the block's grid (`blocks.b.lr_wd`), its seeds or the
    step cap; any other, from the recipe's plan of the block's rung."""
    if key == "--set":
        from ladder.plan.resolve import ARCH_FIELDS, valid_override_keys

        valid = {*valid_override_keys(), "tpp"}
        key = next((k for k in trial.overrides if k not in valid), None) or \
            next((k for k in trial.overrides if k in ARCH_FIELDS), None)
    if key is None:
        return f"blocks.{trial.block}"
    written = _written_at(spec, trial, key)
    if written is not None:
        return written
    block = next(b for b in spec.blocks if b.name == trial.block)
    if key in _GRID_FIELD_OF:
        return f"blocks.{trial.block}.{_GRID_FIELD_OF[key]}"
    if key == SEED_KEY:
        return f"blocks.{trial.block}.seeds" if block.seeds is not None else "seeds"
    if key == MAX_STEPS_KEY:
        return f"blocks.{trial.block}.max_steps" if block.max_steps is not None else "max_steps"
    return f"blocks.{trial.block}"


def _data_field(spec: SweepSpec, trial: Trial) -> str:
    """Where a trial's `data_manifest` came from: the arm (its `data:` or override), the block's or the
    spec's overrides, else the spec's or the recipe's `data:`."""
    if trial.data is not None:
        return f"blocks.{trial.block}.arms.{trial.arm}.data"
    return _written_at(spec, trial, DATA_KEY) or ("data" if spec.data is not None else "recipe")


def check_trial_data(config: dict, trial: Trial, spec: SweepSpec, *, where: str) -> None:
    """The trial's corpus manifest exists and holds every source its mixture names: what the training
    job would otherwise find out on a Ray worker, once per attempt. No manifest: the shipped demo corpus."""
    manifest = config.get(DATA_KEY)
    if not manifest:
        return
    field = _data_field(spec, trial)
    try:
        corpus = read_corpus(Path(manifest), where=where, field=field)
    except LadderInputError as err:
        raise LadderInputError(f"trial {trial.label}: {err.detail}", where=where, field=field) from None
    missing = [name for name in config["sources"] if corpus.source(name) is None]
    if missing:
        raise LadderInputError(f"trial {trial.label}: the mixture's sources {missing} are not in the corpus "
                               f"{corpus.path} (its sources: {', '.join(corpus.names)})", where=where, field=field)


# Knobs the grid varies that the resolver only copies into the config (no derived field depends on
# them); trials differing only in these share one resolution. tests/sweeps checks this equivalence.
GRID_KNOBS = frozenset({LR_KEY, WD_KEY, SEED_KEY, DROPOUT_KEY})


def _resolve(resolve: Resolver, recipe: str, trial: Trial, bases: dict[tuple, dict]) -> dict:
    """resolve() per distinct (rung, max_steps, non-grid overrides, which grid knobs are set); the grid
    knobs' values are then set and the config validated again. A 1,000-point grid on 10 rungs costs 10
    resolutions, not 1,000. Which knobs are set is part of the identity: a trial that leaves dropout to
    the recipe must not take the dropout of a trial that set it."""
    rest = tuple(sorted((k, repr(v)) for k, v in trial.overrides.items() if k not in GRID_KNOBS))
    knobs = tuple(sorted(k for k in trial.overrides if k in GRID_KNOBS))
    ident = (trial.L, trial.max_steps, trial.data, rest, knobs)
    if ident not in bases:
        arm = {} if trial.data is None else {"data": trial.data, "data_arm": True}
        bases[ident] = resolve(recipe, trial.L, dict(trial.overrides), max_steps=trial.max_steps, **arm)
        return bases[ident]
    from rungs.config import parse_config

    config = {**bases[ident], **{k: v for k, v in trial.overrides.items() if k in GRID_KNOBS}}
    return parse_config(config).to_dict()


def check_fits_cluster(trials: list[PlannedTrial], nodes: list[dict[str, float]], *, where: str) -> None:
    """Every trial's workers must fit on the cluster's nodes (each worker on one node), so a
    trial never waits forever for resources that do not exist."""
    if not nodes:
        raise LadderInputError("the Ray cluster reports no alive nodes", field="--address")
    total = {r: sum(n.get(r, 0.0) for n in nodes) for r in ("CPU", "GPU")}
    biggest = {r: max(n.get(r, 0.0) for n in nodes) for r in ("CPU", "GPU")}
    seen: set[Resources] = set()
    for planned in trials:
        res = planned.trial.resources
        if res in seen:
            continue
        seen.add(res)
        need = res.total()
        for kind, per_worker in (("CPU", res.cpus), ("GPU", res.gpus)):
            if need[kind] > total[kind] + 1e-9 or per_worker > biggest[kind] + 1e-9:
                raise LadderInputError(
                    f"trial {planned.label} asks for {res.workers} worker(s) × {per_worker:g} {kind} "
                    f"= {need[kind]:g} {kind}, but the cluster has {total[kind]:g} {kind} in all and at most "
                    f"{biggest[kind]:g} per node; lower resources.{kind.lower()}s or resources.workers, or point "
                    f"--address at a larger cluster", where=where, field="resources")


def runs_root_for(store_uri: str) -> Path:
    """Run directories live next to the SQLite store (runs/), or under ./runs for a remote store."""
    db = sqlite_path(store_uri)
    return db.resolve().parent if db is not None else Path("runs").resolve()
