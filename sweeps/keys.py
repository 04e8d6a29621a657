"""Trial keys: a stable hash of a resolved training config (marin's habit: the config *is* the id).

Stable means: the same config gives the same key in any process, on any machine, whatever the
dict order, and any change to any value gives a different key. Floats hash by their shortest
round-trip repr, so 0.1 and 0.1000000001 differ and 1e-3 written two ways does not.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from rungs.config import at_legacy_value

KEY_HEX_CHARS = 16  # 64 bits: collision odds ~1e-10 at a million trials
# Where a run is tracked and its data cached, how often it logs and checkpoints, and how many threads
# it gets do not change what is trained, so they are not part of its identity (the training job's
# own config key leaves out the same): pointing a sweep at a new server reruns nothing.
NON_IDENTITY_KEYS = frozenset({"tracking_uri", "experiment_name", "trial_key", "log_interval", "threads",
                               "data_cache_root", "checkpoint_interval"})


def canonical(obj: Any) -> Any:
    """A JSON-ready form that does not depend on container types or dict order."""
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


def canonical_json(config: dict) -> str:
    return json.dumps(canonical(config), sort_keys=True, separators=(",", ":"), allow_nan=False)


def trial_key(config: dict) -> str:
    """Hex digest naming a resolved config (its top-level NON_IDENTITY_KEYS left out)."""
    identity = {k: v for k, v in config.items() if k not in NON_IDENTITY_KEYS and not at_legacy_value(k, v)}
    return hashlib.sha256(canonical_json(identity).encode()).hexdigest()[:KEY_HEX_CHARS]
