from pathlib import Path

import numpy as np
import pandas as pd
import pytest

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture(scope="session")
def epoch_240() -> pd.DataFrame:
    """Epoch's 245 digitised Chinchilla points minus the 5 largest losses (their outlier rule)."""
    df = pd.read_csv(DATA / "epoch_chinchilla_svg_extracted_data.csv")
    df = df[df["loss"] < np.sort(df["loss"].to_numpy())[-5]].copy()
    df["tokens"] = df["Training FLOP"] / (6.0 * df["Model Size"])
    return df


@pytest.fixture(scope="session")
def muennighoff_182() -> pd.DataFrame:
    return pd.read_csv(DATA / "muennighoff_fitset_182.csv")


@pytest.fixture(scope="session")
def steplaw_dense() -> pd.DataFrame:
    return pd.read_csv(DATA / "steplaw_dense_lr_bs_loss.csv")
