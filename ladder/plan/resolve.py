"""Resolve one training job's config: a rung's plan + training defaults + overrides, validated.

`resolve_train_config("cpu-demo", 3, ["lr=0.01"])` returns the flat dict `rungs.train.train`
runs from (and the sweep orchestrator hashes into a trial key). Overriding `tpp` re-plans the
rung (tokens, steps, data plan); overriding an architecture field recomputes the parameter and
FLOP counts from the new shapes; overriding `steps`, `batch_sequences`, `seq_len` or an architecture
field keeps the rest of the plan (steps, LR, WD, the source allocation) and records in `tpp` the tokens
per active parameter the job trains (`trained_tpp`); unknown keys are errors that list the valid ones.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from ladder.plan.corpus_data import read_corpus
from ladder.plan.counting import Architecture, count_flops_per_token, count_parameters
from ladder.errors import LadderInputError
from ladder.plan.generator import plan_rung
from ladder.plan.recipe import load_recipe
from ladder.plan.yaml_input import describe_yaml_error
from rungs.config import TrainConfigError, field_names, parse_config

ARCH_FIELDS = tuple(f.name for f in fields(Architecture))
# Keys a user may not set: they are derived from the plan and would silently disagree with it.
DERIVED = ("flops_per_token", "params_total", "params_active", "sources", "recipe", "L", "data_key")


def valid_override_keys() -> list[str]:
    return sorted(k for k in field_names() if k not in DERIVED)


# Named when an unknown key has no near spelling, instead of all of the config's ~70 fields.
COMMON_KEYS = ("lr", "weight_decay", "dropout", "seed", "tpp", "batch_sequences", "micro_batch_sequences", "max_steps")


def unknown_keys_message(unknown: list[str], valid: list[str]) -> str:
    """"unknown override key 'lrr'; did you mean 'lr'?": the nearest valid spellings of each unknown key,
    or a few common keys and where the full list is."""
    parts = []
    for key in unknown:
        near = difflib.get_close_matches(key, valid, n=3, cutoff=0.6)
        parts.append(f"{key!r}; did you mean {' or '.join(repr(k) for k in near)}?" if near else repr(key))
    if any("did you mean" in part for part in parts):
        return f"unknown override key {', '.join(parts)}"
    return (f"unknown override key {', '.join(parts)}; keys are the training config's fields (rungs/config.py, "
            f"TrainConfig), e.g. {', '.join(COMMON_KEYS)}")


def parse_value(text: str) -> Any:
    """'0.01' → 0.01, '1e-3' → 0.001, 'true' → True, 'none' → None, 'a,b' stays a string."""
    stripped = text.strip()
    if stripped.lower() in ("none", "null"):
        return None
    for cast in (int, float):
        try:
            return cast(stripped)
        except ValueError:
            pass
    try:
        return yaml.safe_load(stripped) if stripped else ""
    except yaml.YAMLError as err:
        raise LadderInputError(f"cannot read the value {text!r}: {describe_yaml_error(err)}", field="--set") from None


def parse_overrides(overrides: dict[str, Any] | list[str] | None) -> dict[str, Any]:
    if overrides is None:
        return {}
    if isinstance(overrides, dict):
        return dict(overrides)
    out: dict[str, Any] = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise LadderInputError(f"expected key=value, got {item!r}", field="--set")
        key = key.strip()
        try:
            out[key] = parse_value(value)
        except LadderInputError as err:
            raise LadderInputError(err.detail, field=f"--set {key}") from None
        if isinstance(out[key], float) and not math.isfinite(out[key]):
            raise LadderInputError(f"must be a finite number, got {value!r}", field=f"--set {key}")
        if key == "agc_points" and isinstance(out[key], str):
            out[key] = [p.strip() for p in out[key].split(",") if p.strip()]
    return out


def resolve_train_config(recipe_name_or_path: str | Path, L: int, overrides: dict[str, Any] | list[str] | None = None,
                         *, max_steps: int | None = None, data: str | Path | None = None,
                         data_arm: bool = False) -> dict[str, Any]:
    """The validated, fully resolved training config of rung L of a recipe, as a JSON-able dict.

    `data` (a corpus manifest or prepared directory) replaces the recipe's `data:`. With either, the
    config's `data_manifest` is the manifest the corpus came from; without, the config is what it
    always was (the demo corpus, no `data_manifest` key set), so existing trial keys stay.

    `data_arm` (a sweep's data arm, `ladder.plan.data_arms`): every source's unique tokens come from
    `data`, a prepared corpus, not from the recipe, and the config's `data_key` is the content hash of its
    manifest and files (`ladder.plan.data_arms.data_identity`)."""
    if data_arm:
        if data is None:
            raise LadderInputError("a data arm needs its corpus", field="data")
        from ladder.plan.data_arms import data_identity, load_arm_recipe

        recipe = load_arm_recipe(recipe_name_or_path, data)
    else:
        recipe = load_recipe(recipe_name_or_path, data=data)
    extra = parse_overrides(overrides)
    valid = valid_override_keys()
    unknown = sorted(set(extra) - set(valid) - {"tpp"})
    if unknown:
        raise LadderInputError(unknown_keys_message(unknown, [*valid, "tpp"]), field="--set")
    tpp = extra.pop("tpp", None)
    if tpp is not None and (not isinstance(tpp, (int, float)) or isinstance(tpp, bool)):
        raise LadderInputError(f"tpp must be a number, got {tpp!r}", field="tpp")
    spec = plan_rung(recipe, L, tpp)
    config = spec.to_dict()
    if recipe.data is not None:
        config["data_manifest"] = str(read_corpus(recipe.data).manifest)
    if data_arm:
        config["data_key"] = data_identity(data)
    config.update(extra)
    if max_steps is not None:
        config["max_steps"] = max_steps
    if any(k in extra for k in ARCH_FIELDS):
        _recount(config)
    # A cap at or above the planned steps stops nothing: dropped, so the config (and its trial key) is the
    # uncapped one, and a finished full run is found by a sweep that caps above it.
    cap = config.get("max_steps")
    if type(cap) is int and cap >= config["steps"]:  # not a bool or a string: parse_config names those
        del config["max_steps"]
    try:
        resolved = parse_config(config).to_dict()
    except TrainConfigError as err:
        raise LadderInputError(err.detail, where=f"{recipe.name} L{L}", field=err.key) from None
    if any(k in extra for k in (*TOKEN_FIELDS, *ARCH_FIELDS)):
        resolved["tpp"] = trained_tpp(resolved, spec.tpp)
    return resolved


# The overrides that change the tokens a job trains (steps × batch_sequences × seq_len) without re-planning it.
TOKEN_FIELDS = ("steps", "batch_sequences", "seq_len")


def trained_tpp(config: dict[str, Any], nominal: float) -> float:
    """The TPP a resolved config trains: `nominal` (the plan's) when its tokens are what planning at that TPP
    gives with the config's batch (the target tpp·N rounded up to whole batches, as `plan_rung` rounds), else
    the tokens it trains over its active parameters. So `batch_sequences: 80, steps: 238` on a rung planned
    at 20 × 952 keeps TPP 30, and `batch_sequences: 16` alone (the planned steps at four times the tokens a
    step) records the TPP it trains, where the fits read `tpp`. The rung's source allocation (`sources`) stays
    the plan's: a job that trains more tokens repeats its sources more (its data report says by how much)."""
    batch = config["batch_sequences"] * config["seq_len"]
    tokens = config["steps"] * batch
    planned_steps = max(1, math.ceil(nominal * config["params_active"] / batch - 1e-9))
    return float(nominal) if planned_steps * batch == tokens else tokens / config["params_active"]


def _recount(config: dict[str, Any]) -> None:
    """Parameter and FLOP counts after an architecture override, from the new tensor shapes."""
    try:
        arch = Architecture(**{k: config[k] for k in ARCH_FIELDS})
        counts = count_parameters(arch)
        flops = count_flops_per_token(arch)
    except (TypeError, ValueError, ZeroDivisionError) as err:
        try:  # a value the config refuses (n_experts: 0) is named by its field, not by the counting's arithmetic
            parse_config(config)
        except TrainConfigError as bad:
            raise LadderInputError(bad.detail, field=bad.key) from None
        raise LadderInputError(f"architecture override gives an invalid model: {err}", field="--set") from None
    config["params_total"] = counts.total
    config["params_active"] = counts.nonembedding_active
    config["flops_per_token"] = flops.training
