"""Law fitting for the scaling ladder: DataFrames in, result objects out.

`fits` imports nothing of `ladder`, `rungs` or `sweeps`: every entry point takes a pandas
DataFrame (or arrays) and returns a result object that carries its parameters, intervals,
residuals, the rows it used, the options and the code version, and serialises to JSON.
"""

from __future__ import annotations

import importlib
from typing import Any

# Each public name and the module it lives in, loaded on first use: importing one light module
# (fits.results, fits.errors) does not load scipy and every law.
_EXPORTS = {
    "holdout_backtest": "fits.backtest", "progressive_backtest": "fits.backtest",
    "fit_chinchilla": "fits.chinchilla", "chinchilla_holdout": "fits.chinchilla_backtest",
    "fit_data_constrained": "fits.data_constrained", "fit_dropout_law": "fits.dropout",
    "efficiency_gains": "fits.efficiency", "iso_bpb_multipliers": "fits.efficiency", "load_references": "fits.efficiency",
    "FitBoundaryError": "fits.errors", "FitConvergenceError": "fits.errors", "FitError": "fits.errors",
    "FitInputError": "fits.errors", "FlatSurfaceError": "fits.errors", "fit_hparam_laws": "fits.hparam_laws",
    "NotIdentifiedError": "fits.identify", "fit_power_law": "fits.power_law", "fit_surface": "fits.surfaces",
    "fit_power_laws": "fits.compute_laws", "LawResult": "fits.results",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'fits' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
