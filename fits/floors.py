"""The floor rule of a compute law y = E + A·x^(−α): what an E that runs to zero becomes.

Over a ladder's span of compute (often two decades) the loss floor E is rarely visible: the fit walks
E to its lower bound, where E and α are no longer separately identified, although the law's
predictions inside and near the fitted range still are. A rule says what to do then, and every
command that fits a compute law (`ladder fit power-law`, `ladder extrapolate`, `ladder demo`, the
notebooks) names the one it used. Its own module, light (no scipy), so the CLI can offer the choices
without loading a fitter.
"""

from __future__ import annotations

from fits.errors import FitInputError

FLOOR_RULES = {
    "fit": "E fitted; a law whose E runs to zero (no loss floor in the data) is refused",
    "auto": "E fitted; where the data show no loss floor, the nested law A·x^(−α) (E = 0, flagged floor_at_zero)",
    "zero": "E fixed at 0: the nested law A·x^(−α), for the fit and every bootstrap resample",
}
DEFAULT_FLOOR = "fit"  # report no E the data cannot show; "auto" is asked for by name


def check_floor(floor: str) -> str:
    """`floor` itself, or a `FitInputError` naming the valid rules."""
    if floor not in FLOOR_RULES:
        raise FitInputError(f"floor must be one of {sorted(FLOOR_RULES)}, got {floor!r}")
    return floor
