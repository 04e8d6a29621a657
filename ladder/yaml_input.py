"""Reading a user's YAML file into a validated pydantic model, with one clear error on bad input.

Recipes (`ladder.recipe`) and sweep specs (`sweeps.spec`) share this: a file that is not YAML, not
a mapping, or fails validation raises `LadderInputError` naming the file, the first bad key and
what is wrong with it, which the CLI prints as one line with exit code 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from ladder.errors import LadderInputError

Model = TypeVar("Model", bound=BaseModel)


def read_yaml(path: Path) -> object:
    try:
        return yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as err:
        raise LadderInputError(f"not valid YAML: {err}", where=str(path)) from None


def describe_validation_error(err: ValidationError, *, schema: str,
                              messages: dict[str, str] | None = None) -> tuple[str, str]:
    """(dotted field, message) for the most telling of pydantic's errors.

    In a union (e.g. `centre: law | {lr, weight_decay}`) the literal branch's mismatch says least,
    so another error is preferred; union member names in the location are dropped. `messages`
    replaces pydantic's text for an error type; "{msg}" in it stands for pydantic's own text.
    """
    errors = err.errors()
    first = next((e for e in errors if e["type"] != "literal_error"), errors[0])
    parts = [str(p) for p in first["loc"]]
    field = ".".join(p for p in parts if not p.startswith("literal[") and not p[:1].isupper()) or "(top level)"
    defaults = {
        "extra_forbidden": f"unknown key; remove it or check its spelling against the schema ({schema})",
        "missing": "required key is missing",
    }
    template = {**defaults, **(messages or {})}.get(first["type"], "{msg}")
    msg = template.replace("{msg}", first["msg"])
    extra = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    return field, msg + extra


def validate_mapping(model: type[Model], data: object, *, where: str, what: str, schema: str,
                     messages: dict[str, str] | None = None) -> Model:
    """Validate parsed YAML as `model`; `what` names the kind of file in the error ("a recipe")."""
    if not isinstance(data, dict):
        raise LadderInputError(f"{what} must be a YAML mapping of keys to values", where=where)
    try:
        return model.model_validate(data)
    except ValidationError as err:
        field, msg = describe_validation_error(err, schema=schema, messages=messages)
        raise LadderInputError(msg, where=where, field=field) from None
