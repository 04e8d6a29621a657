"""The one definition of a config's identity: which keys are left out, and how the rest is hashed.

Two identities are built from it, and they differ on purpose (each is frozen by the keys already
written with it: run directories, checkpoints and MLflow tags carry the checkpoint key, sweep stores
and `tests/sweeps/shipped_trial_keys.json` the trial key):

- TRIAL identity (`sweeps.keys.trial_key`): of the resolved config a sweep plans, before the job
  validates it. It names *what to train*: a sweep reruns a trial only when this key changes, so
  where it is tracked, its data cache, its log and checkpoint cadence and its thread count are out.
- CHECKPOINT identity (`rungs.config.TrainConfig.key()`): of the validated config (defaults filled
  in) a job runs. It names *what a checkpoint may resume*: a checkpoint of another key is refused.
  It leaves out where the run is tracked and cached, its checkpoint cadence and the spec peak
  FLOP/s (an MFU denominator only); it keeps `threads`, which the trial identity leaves out
  (a run's key has always included it; leaving it out now would orphan every existing run
  directory and checkpoint).

Both drop a key whose value is its legacy default (`rungs.config.LEGACY_VALUES`), so adding a config
field with a default that reproduces old behaviour changes no key. Stable means: the same config
gives the same key in any process, on any machine, whatever the dict order, and any change to any
other value gives a different key. Floats hash by their shortest round-trip repr, so 0.1 and
0.1000000001 differ and 1e-3 written two ways does not.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

KEY_HEX_CHARS = 16  # 64 bits: collision odds ~1e-10 at a million trials
_NOT_TRAINED = frozenset({"tracking_uri", "experiment_name", "trial_key", "data_cache_root", "checkpoint_interval"})


@dataclass(frozen=True)
class Identity:
    """Which top-level keys a hash leaves out, and the JSON separators it was first written with
    (kept, so that no existing key changes)."""

    name: str
    excluded: frozenset[str]
    separators: tuple[str, str]


TRIAL = Identity("trial", _NOT_TRAINED | {"log_interval", "threads"}, (",", ":"))
CHECKPOINT = Identity("checkpoint", _NOT_TRAINED | {"peak_flops_per_device"}, (", ", ": "))


def canonical(obj: Any) -> Any:
    """A JSON-ready form that does not depend on container types or dict order. Not the output
    normaliser (`fits.results.jsonable`, non-finite -> null): this one is hashed into every trial key,
    so it keeps its own rules (keys sorted, non-finite -> repr, unknown types refused)."""
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


def canonical_json(config: dict, separators: tuple[str, str] = TRIAL.separators) -> str:
    return json.dumps(canonical(config), sort_keys=True, separators=separators, allow_nan=False)


def identity_key(config: Mapping[str, Any], identity: Identity, legacy: Mapping[str, Any]) -> str:
    """Hex digest of `config` under `identity`: its excluded top-level keys, and any key still at its
    `legacy` value, left out."""
    kept = {k: v for k, v in config.items()
            if k not in identity.excluded and not (k in legacy and v == legacy[k])}
    return hashlib.sha256(canonical_json(kept, identity.separators).encode()).hexdigest()[:KEY_HEX_CHARS]
