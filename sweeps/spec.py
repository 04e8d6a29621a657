"""Sweep specs: the validated YAML a researcher writes to ask for a set of trials, found by name or path,
read and checked once; expansion (`sweeps.expand`) trusts what comes back.

One public name space over three modules, one concept each:

- `sweeps.spec_schema`: the schema, the pydantic models (`SweepSpec`, `Block`, `LrWdGrid`, `Axis`,
  `Centre`, `Resources`) and their field types, each checking its own fields;
- `sweeps.spec_checks`: the checks across fields and levels (`check_block_resources`,
  `check_override_values`);
- here: finding a spec (`available_specs`, `resolve_spec_path`), reading and checking it (`parse_spec`,
  `load_spec`), its relative paths made absolute against the spec's folder.
"""

from __future__ import annotations

from pathlib import Path

from ladder.errors import LadderInputError
from ladder.plan.yaml_input import read_yaml, validate_mapping
from sweeps.spec_checks import check_block_resources, check_override_values
from sweeps.spec_schema import (ARM_DATA_KEY, MAX_LOG_OFFSET, MAX_SEED, MAX_STEPS_KEY, Axis, Block, Centre, Count,
                                LrWdGrid, Name, OverrideValue, Real, Resources, Seed, SweepSpec)

__all__ = ["ARM_DATA_KEY", "DATA_MANIFEST_KEY", "MAX_LOG_OFFSET", "MAX_SEED", "MAX_STEPS_KEY", "SWEEPS_DIR", "Axis",
           "Block", "Centre", "Count", "LrWdGrid", "Name", "OverrideValue", "Real", "Resources", "Seed", "SweepSpec",
           "available_specs", "check_block_resources", "check_override_values", "is_recipe_path", "load_spec",
           "parse_spec", "resolve_spec_path"]

SWEEPS_DIR = Path(__file__).parent
# The training config's corpus manifest (rungs.config.TrainConfig): a path, made absolute at load.
DATA_MANIFEST_KEY = "data_manifest"


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
    spec = validate_mapping(SweepSpec, data, where=where, what="a sweep spec", schema="sweeps/spec_schema.py",
                            messages={"too_short": "{msg}: an empty list would give an empty sweep"})
    check_override_values(spec, where=where)
    check_block_resources(spec, where=where)
    return spec


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
