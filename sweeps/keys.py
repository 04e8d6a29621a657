"""Trial keys: a stable hash of a resolved training config (marin's habit: the config *is* the id).

The hash and its excluded keys are defined once, in `rungs.identity` (the TRIAL identity), beside
the checkpoint identity `TrainConfig.key()` uses; that module says why the two leave out different
keys. Pointing a sweep at a new server, cache or thread count reruns nothing.
"""

from __future__ import annotations

from rungs.config import LEGACY_VALUES
from rungs.identity import KEY_HEX_CHARS, TRIAL, canonical, canonical_json, identity_key

__all__ = ["KEY_HEX_CHARS", "NON_IDENTITY_KEYS", "canonical", "canonical_json", "trial_key"]

NON_IDENTITY_KEYS = TRIAL.excluded


def trial_key(config: dict) -> str:
    """Hex digest naming a resolved config (the TRIAL identity's excluded keys, and keys still at
    their legacy values, left out)."""
    return identity_key(config, TRIAL, LEGACY_VALUES)
