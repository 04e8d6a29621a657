"""The default MLflow store, named without importing MLflow.

The training config's default (`rungs.config.TrainConfig.tracking_uri`) is this constant, and
planning and trial keying import the config: so it lives apart from `rungs.tracking`, which needs
MLflow to write runs.
"""

from __future__ import annotations

import os

DEFAULT_TRACKING_URI = "sqlite:///runs/mlflow.db"  # the one place the embedded store is named
TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"  # MLflow's own variable (the cluster pods set it)
# how --tracking-uri's help names the default that `default_tracking_uri` resolves
DEFAULT_STORE_HELP = f"default: ${TRACKING_URI_ENV} if set, else {DEFAULT_TRACKING_URI}"


def default_tracking_uri(given: str | None = None) -> str:
    """The store a command uses: `given` (its --tracking-uri; an empty one stays empty, for the caller to refuse),
    else $MLFLOW_TRACKING_URI, else DEFAULT_TRACKING_URI. Every command resolves it so, so a sweep and the fit of
    its experiment read one store."""
    if given is not None:
        return given
    return os.environ.get(TRACKING_URI_ENV) or DEFAULT_TRACKING_URI


def is_embedded_default(given: str | None) -> bool:
    """No --tracking-uri and no $MLFLOW_TRACKING_URI: the embedded store, which a command may create unasked."""
    return given is None and not os.environ.get(TRACKING_URI_ENV)
