"""Byte sizes as people write them (141GB, 80GiB) and as device specs state them (decimal units)."""

from __future__ import annotations

import math
import re

from ladder.errors import LadderInputError

__all__ = ["format_bytes", "parse_bytes"]

_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(text: str, *, field: str = "--gpu-memory") -> int:
    """'141GB' → 141·10⁹, '80GiB' → 80·2³⁰, '2.5TB'; decimal (kB, MB, GB, TB) and binary (KiB...) units."""
    match = _SIZE.match(str(text))
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise LadderInputError(f"expected a memory size with a unit such as 141GB, 80GiB or 2.5TB, got {text!r} "
                               f"(units: B, kB, MB, GB, TB, KiB, MiB, GiB, TiB)", field=field)
    value = float(match.group(1)) * _UNITS[unit]
    if not math.isfinite(value) or value < 1:
        raise LadderInputError(f"a memory size must be at least one byte, got {text!r}", field=field)
    return int(value)


def format_bytes(n: float) -> str:
    """Decimal units, as device specs state them: 141e9 → '141.0 GB'."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"
