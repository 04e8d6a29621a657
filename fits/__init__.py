"""Law fitting for the scaling ladder: DataFrames in, result objects out.

`fits` imports nothing of `ladder`, `rungs` or `sweeps`: every entry point takes a pandas
DataFrame (or arrays) and returns a result object that carries its parameters, intervals,
residuals, the rows it used, the options and the code version, and serialises to JSON.
"""

from fits.backtest import holdout_backtest, progressive_backtest
from fits.chinchilla import fit_chinchilla
from fits.chinchilla_backtest import chinchilla_holdout
from fits.data_constrained import fit_data_constrained
from fits.dropout import fit_dropout_law
from fits.efficiency import efficiency_gains, iso_bpb_multipliers, load_references
from fits.errors import FitBoundaryError, FitConvergenceError, FitError, FitInputError, FlatSurfaceError
from fits.hparam_laws import fit_hparam_laws
from fits.identify import NotIdentifiedError
from fits.power_law import fit_power_law
from fits.surfaces import fit_surface

__all__ = [
    "FitBoundaryError", "FitConvergenceError", "FitError", "FitInputError", "FlatSurfaceError", "NotIdentifiedError",
    "chinchilla_holdout", "efficiency_gains",
    "fit_chinchilla", "fit_data_constrained", "fit_dropout_law", "fit_hparam_laws", "fit_power_law", "fit_surface",
    "holdout_backtest", "iso_bpb_multipliers", "load_references", "progressive_backtest",
]
