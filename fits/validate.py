"""Input checks at the boundary of every fit: columns present, finite, positive under a log,
enough distinct points for the form. Everything below trusts what passes here."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from fits.errors import FitInputError


def require_columns(df: pd.DataFrame, columns: Iterable[str]) -> None:
    if not isinstance(df, pd.DataFrame):
        raise FitInputError(f"expected a pandas DataFrame, got {type(df).__name__}")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise FitInputError(
            f"missing column(s) {missing}; the table has {sorted(map(str, df.columns))}", column=missing[0])


def numeric_column(df: pd.DataFrame, column: str, *, positive: bool = False) -> np.ndarray:
    """The column as float64; raises on non-numeric, non-finite or (with positive) values ≤ 0."""
    try:
        values = pd.to_numeric(df[column], errors="raise").to_numpy(dtype=np.float64)
    except (ValueError, TypeError):
        raise FitInputError("has non-numeric values; expected numbers", column=column) from None
    bad = ~np.isfinite(values)
    if bad.any():
        raise FitInputError(f"has {int(bad.sum())} missing or non-finite value(s) (first at row "
                            f"{df.index[np.argmax(bad)]!r}); drop or fill them first", column=column)
    if positive and (values <= 0).any():
        first = int(np.argmax(values <= 0))
        raise FitInputError(f"has non-positive value {values[first]:g} at row {df.index[first]!r}; the law takes "
                            "its logarithm, so every value must be > 0", column=column)
    return values


def require_points(n_distinct: int, minimum: int, form: str, column: str) -> None:
    if n_distinct < minimum:
        raise FitInputError(f"{form} needs at least {minimum} distinct values, got {n_distinct}", column=column)


def row_ids(df: pd.DataFrame, id_column: str | None) -> list:
    """What `rows_used` records: the run ids when the table has them, else the index labels."""
    if id_column and id_column in df.columns:
        return df[id_column].tolist()
    return df.index.tolist()
