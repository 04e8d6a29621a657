"""One test of a number given by a user or a caller: every input check of the planning and analysis code
reads it the same way."""

from __future__ import annotations

import math
import numbers


def finite_real(value: object) -> bool:
    """A finite real number: not a bool (True is 1 to Python, so `tpp: true` would plan TPP 1), not text,
    not NaN or ±inf. numpy scalars count."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
