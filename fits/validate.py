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
        raise FitInputError(f"has {int(bad.sum())} missing or non-finite value(s) (first at "
                            f"{row_name(df, int(np.argmax(bad)))}); drop or fill them first", column=column)
    if positive and (values <= 0).any():
        first = int(np.argmax(values <= 0))
        raise FitInputError(f"has non-positive value {values[first]:g} at {row_name(df, first)}; the law takes "
                            "its logarithm, so every value must be > 0", column=column)
    return values


def row_name(df: pd.DataFrame, position: int) -> str:
    """"row 3", or "line 5" for a table whose index names its rows as a file's lines (the CLI's CSVs):
    the label as a plain value, never a numpy repr."""
    label = df.index[position]
    label = label.item() if isinstance(label, np.generic) else label
    return f"{df.index.name or 'row'} {label}"


def require_points(n_distinct: int, minimum: int, form: str, column: str) -> None:
    if n_distinct < minimum:
        raise FitInputError(f"{form} needs at least {minimum} distinct values, got {n_distinct}", column=column)


def row_ids(df: pd.DataFrame, id_column: str | None) -> list:
    """What `rows_used` records: the run ids when the table has them, else the index labels."""
    if id_column and id_column in df.columns:
        return df[id_column].tolist()
    return df.index.tolist()


# Values equal up to this relative difference are one value: a product such as LR·WD computed from
# differently rounded factors (3e-3 · 0.1 vs 1e-3 · 0.3) differs in its last bits, and an exact
# count would call a constant two values.
DISTINCT_RTOL = 1e-6


def snap_close(values: np.ndarray, rtol: float = DISTINCT_RTOL) -> np.ndarray:
    """Each value replaced by the smallest value within `rtol` (relative) of it, chained in sorted order."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return v.copy()
    u = np.unique(v[np.isfinite(v)])
    if u.size == 0:
        return v.copy()
    new = np.concatenate([[True], np.diff(u) > rtol * np.maximum(np.abs(u[1:]), np.abs(u[:-1]))])
    reps = u[np.flatnonzero(new)][np.cumsum(new) - 1]
    out = v.copy()
    finite = np.isfinite(v)
    out[finite] = reps[np.searchsorted(u, v[finite])]
    return out


def n_distinct(values: np.ndarray, rtol: float = DISTINCT_RTOL) -> int:
    """How many distinct values, counting values within `rtol` of each other as one."""
    v = np.asarray(values, dtype=np.float64)
    return int(np.unique(snap_close(v[np.isfinite(v)], rtol)).size)


# Fewest resamples a bootstrap may ask for: its draws must be at least this many finite fits
# (`fits.bootstrap`), so a smaller count could only fail.
MIN_BOOTSTRAP = 10


def check_bootstrap(n: object) -> int:
    """A bootstrap count: 0 (no intervals) or a whole number ≥ MIN_BOOTSTRAP."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or (n != 0 and n < MIN_BOOTSTRAP):
        raise FitInputError(f"bootstrap must be 0 (no intervals) or a whole number of resamples ≥ {MIN_BOOTSTRAP}, "
                            f"got {n!r}")
    return int(n)


def check_level(level: object, name: str = "ci_level") -> float:
    """An interval's level: a number strictly between 0 and 1 (0.95 for 95%)."""
    if isinstance(level, bool) or not isinstance(level, (int, float, np.number)) or not 0 < float(level) < 1:
        raise FitInputError(f"{name} must be a number strictly between 0 and 1 (0.95 for a 95% interval), got "
                            f"{level!r}")
    return float(level)


def cluster_labels(df: pd.DataFrame, column: str) -> np.ndarray:
    """Integer codes of a bootstrap's clusters (rows sharing the column's value); every row needs one, and
    a resample of fewer than 2 clusters is the table itself (a zero-width interval)."""
    codes, uniques = pd.factorize(df[column], use_na_sentinel=True)
    if (codes < 0).any():
        first = int(np.argmax(codes < 0))
        raise FitInputError(f"has {int((codes < 0).sum())} missing value(s) (first at {row_name(df, first)}); every "
                            "row of a cluster bootstrap needs its cluster", column=column)
    if len(uniques) < 2:
        raise FitInputError(f"holds {len(uniques)} cluster(s); a cluster bootstrap needs at least 2 (each resample "
                            "draws whole clusters: of one, every resample is the table itself)", column=column)
    return codes


def check_group_values(df: pd.DataFrame, group: str) -> None:
    """Every row names its group (a missing one would drop the row from every fit of a group unsaid), and
    no two group values share a name (1 and "1": one group's result would overwrite the other's)."""
    missing = df[group].isna().to_numpy()
    if missing.any():
        first = int(np.argmax(missing))
        raise FitInputError(f"has {int(missing.sum())} missing value(s) (first at {row_name(df, first)}): those rows "
                            "would be in no fit; fill or drop them", column=group)
    names: dict[str, object] = {}
    for value in df[group].unique():
        other = names.setdefault(str(value), value)
        if other != value:
            raise FitInputError(f"holds both {other!r} and {value!r}, which name the same group {str(value)!r} (one "
                                "law or slice); make them one value", column=group)
