"""Reading a user's YAML file into a validated pydantic model, with one clear error on bad input.

Recipes (`ladder.plan.recipe`) and sweep specs (`sweeps.spec`) share this: a file that is not YAML, not
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
# pydantic names a union's member types in an error's location (`overrides.lr.float`): not a field.
_UNION_MEMBERS = frozenset({"bool", "int", "float", "str", "none"})


class DuplicateKeyError(yaml.YAMLError):
    """A mapping names one key twice: YAML leaves it to the loader, and safe_load keeps the last silently."""


class _StrictLoader(yaml.SafeLoader):
    """safe_load's loader, except that a mapping with a duplicate key is refused."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the base constructor reports it
                    continue
                mark = key_node.start_mark
                if first is not None:
                    raise DuplicateKeyError(f"duplicate key {key!r} at line {mark.line + 1}, column {mark.column + 1} "
                                            f"(first at line {first.line + 1}); YAML would keep only the last, so "
                                            f"remove or rename one")
                seen[key] = mark
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path) -> object:
    """Parse a YAML file (safe_load only: no tags that build Python objects)."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise LadderInputError(f"not UTF-8 text (byte {err.start} is 0x{err.object[err.start]:02x}); save it as "
                               f"UTF-8", where=str(path)) from None
    except IsADirectoryError:
        raise LadderInputError("is a directory, not a YAML file", where=str(path)) from None
    except OSError as err:
        raise LadderInputError(f"cannot read: {err.strerror or err}", where=str(path)) from None
    try:
        loader = _StrictLoader(text)  # SafeLoader's subclass (no Python objects), as yaml.safe_load builds one
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except DuplicateKeyError as err:
        raise LadderInputError(str(err), where=str(path)) from None
    except yaml.YAMLError as err:
        raise LadderInputError(describe_yaml_error(err), where=str(path)) from None


def describe_yaml_error(err: yaml.YAMLError) -> str:
    """One line that keeps where the parser stopped: "not valid YAML at line 2, column 3: mapping values
    are not allowed here", plus what it was reading and where that began ("while parsing a flow
    sequence that starts at line 1, column 4")."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None)
    if mark is None or not problem:
        return "not valid YAML: " + " ".join(str(err).split())
    text = f"not valid YAML at line {mark.line + 1}, column {mark.column + 1}: {' '.join(problem.split())}"
    context, start = getattr(err, "context", None), getattr(err, "context_mark", None)
    if context:
        text += f" ({' '.join(context.split())}"
        if start is not None and (start.line, start.column) != (mark.line, mark.column):
            text += f" that starts at line {start.line + 1}, column {start.column + 1}"
        text += ")"
    return text


def _field(error: dict, data: object = None) -> str:
    """The dotted place of `error` in the input. With the input `data`, a list item that is a mapping with a
    string `name` is named by it (`blocks.grid.seeds`, as the spec's own checks name places), not by its
    position; an unnamed item keeps its index."""
    parts: list[str] = []
    at = data
    for step in error["loc"]:
        text = str(step)
        if text.startswith("literal[") or text[:1].isupper() or text in _UNION_MEMBERS:
            continue  # a union member's name, not a place in the input
        if isinstance(at, list) and isinstance(step, int) and 0 <= step < len(at):
            at = at[step]
            name = at.get("name") if isinstance(at, dict) else None
            parts.append(name if isinstance(name, str) and name and "." not in name else text)
            continue
        at = at.get(step) if isinstance(at, dict) else None
        parts.append(text)
    return ".".join(parts) or "(top level)"


def describe_validation_error(err: ValidationError, *, schema: str, messages: dict[str, str] | None = None,
                              data: object = None) -> tuple[str, str]:
    """(dotted field, message) for the most telling of pydantic's errors.

    In a union (e.g. `centre: law | {lr, weight_decay}`) the literal branch's mismatch says least,
    so another error is preferred; union member names in the location are dropped. `messages`
    replaces pydantic's text for an error type; "{msg}" in it stands for pydantic's own text. `data`, the
    input validated, lets named list items be named (`_field`).
    """
    errors = err.errors()
    # A non-finite number inside a union (an override value) also fails the union's other members
    # (bool, str, ...); the finite-number error is the one that says what is wrong.
    first = next((e for e in errors if e["type"] == "finite_number"), None) or \
        next((e for e in errors if e["type"] != "literal_error"), errors[0])
    field = _field(first, data)
    defaults = {
        "finite_number": "must be a finite number (inf and nan are not values a run can use)",
        "extra_forbidden": f"unknown key; remove it or check its spelling against the schema ({schema})",
        "missing": "required key is missing",
    }
    template = {**defaults, **(messages or {})}.get(first["type"], "{msg}")
    msg = template.replace("{msg}", first["msg"].removeprefix("Value error, "))  # a rule's own words, unprefixed
    others = {_field(e, data) for e in errors} - {field}  # a union's member mismatches are one problem
    extra = f" (and {len(others)} more problem(s))" if others else ""
    return field, msg + extra


def validate_mapping(model: type[Model], data: object, *, where: str, what: str, schema: str,
                     messages: dict[str, str] | None = None, suffix: str = "") -> Model:
    """Validate parsed YAML (or JSON) as `model`; `what` names the kind of file in the error ("a recipe"),
    `suffix` ends every validation error's message (the way out, where it is one for the whole file)."""
    if not isinstance(data, dict):
        raise LadderInputError(f"{what} must be a YAML mapping of keys to values", where=where)
    try:
        return model.model_validate(data)
    except ValidationError as err:
        field, msg = describe_validation_error(err, schema=schema, messages=messages, data=data)
        raise LadderInputError(msg + suffix, where=where, field=field) from None
