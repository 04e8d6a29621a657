"""Is an exponent identified by these data? Refuse before fitting when it cannot be, and flag
fitted exponents whose interval is wider than the value.

An exponent is read off the curvature of y against log x: over a narrow span of x a power law is
indistinguishable from a straight line (or a constant plus noise), and the optimiser walks off to
whatever its bounds allow. Measured on five models spanning 1.2× in N: α 1.43, A 7e10, no error.
MIN_SPAN is deliberately lenient (real ladders span 10–1000×); it only stops fits that
cannot mean anything.
"""

from __future__ import annotations

import numpy as np

from fits.errors import FitInputError

MIN_SPAN = 3.0  # max(x) / min(x) an exponent on x needs


class NotIdentifiedError(FitInputError):
    """The data cannot pin this law down (too narrow a range of x); the message says what would help."""


def require_span(values: np.ndarray, column: str, symbol: str, minimum: float = MIN_SPAN) -> float:
    span = float(np.max(values) / np.min(values))
    if span < minimum:
        raise NotIdentifiedError(f"{symbol} spans {span:.3g}x ({np.min(values):.4g} to {np.max(values):.4g}); the "
                                 f"exponent on {symbol} needs ≥ {minimum:g}x: add runs further apart in {symbol}",
                                 column=column)
    return span


def wide_interval_flags(params: dict[str, float], ci: dict[str, tuple[float, float]], exponents: tuple[str, ...]) -> list[str]:
    """A flag for each exponent whose interval is wider than the exponent itself."""
    flags = []
    for name in exponents:
        if name in ci and name in params:
            lo, hi = ci[name]
            if hi - lo > abs(params[name]):
                flags.append(f"{name} interval [{lo:.4g}, {hi:.4g}] is wider than {name} = {params[name]:.4g}: "
                             "the exponent is barely identified by these points")
    return flags
