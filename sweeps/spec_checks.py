"""The checks of a sweep spec across its fields and levels, after each model has checked its own
(`sweeps.spec_schema`): each block's resources merged over the spec's, and the grid knobs and step caps
written in overrides and arms. Each raises LadderInputError naming the field."""

from __future__ import annotations

from ladder.errors import LadderInputError
from ladder.plan.values import finite_real
from sweeps.spec_schema import MAX_SEED, MAX_STEPS_KEY, Block, OverrideValue, Resources, SweepSpec


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
