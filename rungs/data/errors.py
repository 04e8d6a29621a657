"""Typed data errors. `rungs` must not import `ladder`; the CLI converts these to LadderInputError."""

from __future__ import annotations


class DataInputError(ValueError):
    """Bad data input (a manifest, a corpus file, a plan): says where, which field, and what is valid."""

    def __init__(self, message: str, *, where: str | None = None, field: str | None = None) -> None:
        self.where = where
        self.field = field
        self.detail = message
        parts = [str(p) for p in (where, field) if p]
        super().__init__(": ".join(parts + [message]))


class SourceTooSmallError(DataInputError):
    """A source holds fewer tokens than the plan's unique-token cap for it."""


class DataDiskFullError(OSError):
    """A prepare ran out of space (ENOSPC/EDQUOT): says which file; no half-written file is left visible,
    and a rerun once space is freed continues from the last finished step."""
