"""The default MLflow store, named without importing MLflow.

The training config's default (`rungs.config.TrainConfig.tracking_uri`) is this constant, and
planning and trial keying import the config: so it lives apart from `rungs.tracking`, which needs
MLflow to write runs.
"""

from __future__ import annotations

DEFAULT_TRACKING_URI = "sqlite:///runs/mlflow.db"  # the one place the embedded store is named
