"""Typed input errors: the CLI turns these into one clear paragraph and exit code 2."""

from __future__ import annotations


class LadderInputError(ValueError):
    """Bad user input (a recipe, a flag, a spec): says where, what, and what would be valid.

    `where` names the file (or flag) and `field` the offending key, so the message a user sees is
    always "FILE: FIELD: what is wrong; what is valid".
    """

    def __init__(self, message: str, *, where: str | None = None, field: str | None = None) -> None:
        self.where = where
        self.field = field
        self.detail = message
        parts = [p for p in (where, field) if p]
        super().__init__(": ".join(parts + [message]))


class StoreError(LadderInputError):
    """The MLflow store named is missing, damaged, locked, or out of step with the run directories.

    Raised before anything is written; the message says what is wrong and the way out (a flag that
    creates a new store, one that re-registers finished results, or which file to move aside).
    """
