"""Notebook data loading on edge settings: a misspelt source is refused, an empty one means auto."""

from __future__ import annotations

import pandas as pd
import pytest

from ladder.analysis.notebook_data import FIXTURES, load_runs
from ladder.errors import LadderInputError


@pytest.mark.parametrize("value", ["fixtures", "MLflow", "auto "])
def test_a_misspelt_notebook_source_is_refused(tmp_path, monkeypatch, value):
    monkeypatch.setenv("LADDER_NOTEBOOK_SOURCE", value)
    with pytest.raises(LadderInputError, match="LADDER_NOTEBOOK_SOURCE"):
        load_runs("sweep-demo", "demo_runs.csv", tracking_uri=f"sqlite:///{tmp_path / 'missing.db'}")


def test_an_empty_notebook_source_is_auto(tmp_path, monkeypatch):
    monkeypatch.setenv("LADDER_NOTEBOOK_SOURCE", "")
    runs, where = load_runs("sweep-demo", "demo_runs.csv", tracking_uri=f"sqlite:///{tmp_path / 'missing.db'}")
    assert where.startswith("fixture") and len(runs) == len(pd.read_csv(FIXTURES / "demo_runs.csv"))
    assert not (tmp_path / "missing.db").exists()  # reading never creates a store
