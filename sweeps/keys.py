"""Trial keys: a stable hash of a resolved training config (marin's habit: the config *is* the id).

The hash and the keys it leaves out are the platform's one identity, `rungs.identity.config_key`,
the same that names a job's checkpoints and run (`TrainConfig.key()`). Pointing a sweep at a new
server, cache or thread count reruns nothing.
"""

from __future__ import annotations

from rungs.config import LEGACY_VALUES
from rungs.identity import KEY_HEX_CHARS, NON_IDENTITY_KEYS, canonical, canonical_json, config_key

__all__ = ["KEY_HEX_CHARS", "NON_IDENTITY_KEYS", "canonical", "canonical_json", "trial_key"]


def trial_key(config: dict) -> str:
    """Hex digest naming a resolved config (`rungs.identity.config_key`: where it is tracked and cached,
    its checkpoint cadence and thread count, and keys still at their legacy values left out)."""
    return config_key(config, LEGACY_VALUES)
