"""The one definition of a config's identity: which keys are left out, and how the rest is hashed.

`config_key` names a config everywhere the platform needs a name for it: a sweep's trial (of the
resolved config the sweep plans, `sweeps.keys.trial_key`), a job's checkpoints, its MLflow run name
and its `ladder train` run directory (of the validated config the job runs, `TrainConfig.key()`).
One function, so a complete config gives the same key in both uses. Left out: where a run is
tracked and cached, its checkpoint cadence, its thread count and the intermediate evals' sample
(`eval_tokens_per_domain`), none of which changes what is trained: pointing a sweep at a new server,
cache or thread count reruns nothing and resumes the same checkpoint. A config named by its corpus's content
(a data arm's `data_key`) leaves out where that corpus's manifest lies (`data_manifest`): moving the project
folder reruns none of its trials. A key whose value is its
legacy default (`rungs.config.LEGACY_VALUES`) is left out too, so adding a config field with a default
that reproduces old behaviour changes no key.

Stable means: the same config gives the same key in any process, on any machine, whatever the
dict order, and any change to any other value gives a different key. Floats hash by their shortest
round-trip repr, so 0.1 and 0.1000000001 differ and 1e-3 written two ways does not.

Compatibility: checkpoints, MLflow runs and `ladder train` run directories written before this one
identity carry a checkpoint key of their own (`legacy_checkpoint_key`: the thread count kept, the
MFU denominator `peak_flops_per_device` left out, other JSON separators). It is only read, never
written: a job resumes a checkpoint that carries it (`accepted_keys`), and `ladder train` finds a
run directory named by it; the next checkpoint the job writes carries its key.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Collection, Mapping
from typing import Any

KEY_HEX_CHARS = 16  # 64 bits: collision odds ~1e-10 at a million trials
_NOT_TRAINED = frozenset({"tracking_uri", "experiment_name", "trial_key", "data_cache_root", "checkpoint_interval",
                          "eval_tokens_per_domain"})
# Top-level keys no identity includes (`log_interval` is a removed field old configs may still carry).
NON_IDENTITY_KEYS = _NOT_TRAINED | {"log_interval", "threads"}
# A data arm's config carries its corpus's content hash (`data_key`): its manifest's path (`data_manifest`,
# absolute, so it changes when the project folder moves) is then left out of the key.
CONTENT_KEY, CONTENT_NAMED = "data_key", "data_manifest"
SEPARATORS = (",", ":")  # of the canonical JSON that is hashed (kept: no existing key changes)

# The checkpoint identity before there was one identity: read, to resume what it named; never written.
_LEGACY_CHECKPOINT_EXCLUDED = _NOT_TRAINED | {"peak_flops_per_device"}
_LEGACY_CHECKPOINT_SEPARATORS = (", ", ": ")


def canonical(obj: Any) -> Any:
    """A JSON-ready form that does not depend on container types or dict order. Not the output
    normaliser (`fits.results.jsonable`, non-finite -> null): this one is hashed into every key, so it
    keeps its own rules (keys sorted, non-finite -> repr, unknown types refused)."""
    if isinstance(obj, dict):
        return {str(k): canonical(v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if isinstance(obj, (list, tuple)):
        return [canonical(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        if not math.isfinite(obj):
            return repr(obj)
        return float(obj)
    if hasattr(obj, "item") and callable(obj.item):  # numpy / torch scalars
        return canonical(obj.item())
    if hasattr(obj, "__fspath__"):
        return str(obj)
    raise TypeError(f"cannot key a config holding {type(obj).__name__}: {obj!r}")


def canonical_json(config: dict, separators: tuple[str, str] = SEPARATORS) -> str:
    return json.dumps(canonical(config), sort_keys=True, separators=separators, allow_nan=False)


def _digest(config: Mapping[str, Any], excluded: Collection[str], legacy: Mapping[str, Any],
            separators: tuple[str, str]) -> str:
    kept = {k: v for k, v in config.items() if k not in excluded and not (k in legacy and v == legacy[k])}
    return hashlib.sha256(canonical_json(kept, separators).encode()).hexdigest()[:KEY_HEX_CHARS]


def config_key(config: Mapping[str, Any], legacy: Mapping[str, Any]) -> str:
    """The key of `config`: hex digest of its canonical JSON, `NON_IDENTITY_KEYS` and any key still at
    its `legacy` value left out; and the corpus's path where its content names it (`CONTENT_KEY`)."""
    excluded = NON_IDENTITY_KEYS | {CONTENT_NAMED} if config.get(CONTENT_KEY) is not None else NON_IDENTITY_KEYS
    return _digest(config, excluded, legacy, SEPARATORS)


def legacy_checkpoint_key(config: Mapping[str, Any], legacy: Mapping[str, Any]) -> str:
    """The key checkpoints, run names and `ladder train` run directories of `config` carried before
    `config_key` named them too (read only, to find and resume what older code wrote)."""
    return _digest(config, _LEGACY_CHECKPOINT_EXCLUDED, legacy, _LEGACY_CHECKPOINT_SEPARATORS)


def accepted_keys(expected: str | Collection[str]) -> tuple[str, ...]:
    """The stored config keys a job accepts: `expected` is its key, or its key first and then the keys
    older code wrote for the same config (`TrainConfig.resume_keys()`)."""
    return (expected,) if isinstance(expected, str) else tuple(expected)
