"""Law fitting for the scaling ladder: DataFrames in, result objects out.

`fits` imports nothing of `ladder`, `rungs` or `sweeps`: every entry point takes a pandas
DataFrame (or arrays) and returns a result object that carries its parameters, intervals,
residuals, the rows it used, the options and the code version, and serialises to JSON.
"""

from fits.errors import FitBoundaryError, FitConvergenceError, FitError, FitInputError, FlatSurfaceError

__all__ = ["FitBoundaryError", "FitConvergenceError", "FitError", "FitInputError", "FlatSurfaceError"]
