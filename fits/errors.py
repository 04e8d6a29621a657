"""Typed errors of the fitting package (it must not import `ladder`, so it has its own).

`FitInputError` is bad input (the caller can fix the table); the others say the fit itself is
not trustworthy. None of them is ever swallowed into a silently wrong number.
"""

from __future__ import annotations


class FitError(ValueError):
    """Base class: anything that stops a fit from returning a result worth using."""


class FitInputError(FitError):
    """The table cannot be fitted as given: missing columns, too few points, non-positive values
    under a logarithm, non-finite values. The message names the column and what would be valid."""

    def __init__(self, message: str, *, column: str | None = None) -> None:
        self.column = column
        self.detail = message
        super().__init__(f"column {column!r}: {message}" if column else message)


class FlatSurfaceError(FitInputError):
    """A hyperparameter slice whose loss does not vary (or whose design is rank-deficient), so
    no curvature, hence no optimum, can be estimated."""


class FitConvergenceError(FitError):
    """The optimiser returned non-finite parameters or objective."""


class FitBoundaryError(FitError):
    """The best solution lies on a parameter bound or on the edge of the start grid: the true
    optimum is probably outside the searched region, so the numbers would be an artefact."""

    def __init__(self, message: str, *, parameter: str | None = None, value: float | None = None) -> None:
        self.parameter = parameter
        self.value = value
        super().__init__(message)
