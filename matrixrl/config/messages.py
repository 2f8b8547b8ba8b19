"""A pydantic ``ValidationError`` of experiments.yaml as one line: the key path and the fix."""

from __future__ import annotations

from typing import Any, get_origin

from pydantic import BaseModel, ValidationError

from matrixrl.config.schema import Config, Grid
from matrixrl.errors import ConfigError, closest, did_you_mean, did_you_mean_registered
from matrixrl.settings import BOOLEAN_FOR_NUMBER, kind_values, models_in


def _describe(model: type[BaseModel] | None, loc: tuple, tag: Any = None) -> type[BaseModel] | None:
    """The pydantic model that owns the field at ``loc`` (to list valid keys).

    ``tag`` is the ``kind`` of a scale's or task's entry: it picks the union member.
    """
    parts = list(loc[:-1])
    while parts:
        part = parts.pop(0)
        field = model.model_fields.get(part) if model is not None and isinstance(part, str) else None
        if field is None:
            return None
        if get_origin(field.annotation) is dict:
            if not parts:
                return None  # the unknown key is a name (of a scale, a task): any name is valid
            parts.pop(0)  # the dict key (a scale's or task's name), not a field
        members = models_in(field.annotation)
        model = next((m for m in members if tag in kind_values(m)), members[0] if members else None)
    return model


def kinds(section: str) -> tuple[str, ...]:
    """The valid ``kind:`` values of the entries under ``scales:`` or ``tasks:``."""
    return tuple(k for model in models_in(Config.model_fields[section].annotation) for k in kind_values(model))


def _path(loc: tuple) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text or "(top level)"


def _shown(value: Any) -> str:
    if value is None:
        return "an empty value"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


_EXPECTED = {
    "int_type": "expected an integer",
    "int_parsing": "expected an integer",
    "int_from_float": "expected a whole number",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "bool_type": "expected true or false",
    "bool_parsing": "expected true or false",
    "string_type": "expected a string",
    "list_type": "expected a list, e.g. [a, b]",
    "dict_type": "expected a mapping of key: value pairs",
    "model_type": "expected a mapping of key: value pairs",
    "model_attributes_type": "expected a mapping of key: value pairs",
}


def format_validation_error(err: ValidationError, source: str) -> str:
    """The first error of ``err`` as ``SOURCE: key.path: what is wrong; the fix``."""
    first = err.errors()[0]
    loc = tuple(first["loc"])
    tag = None
    if len(loc) > 2 and loc[0] in ("scales", "tasks"):
        # (section, name, kind tag, ...): the discriminated union adds the tag.
        tag, loc = loc[2], loc[:2] + loc[3:]
    kind = first["type"]
    ctx = first.get("ctx") or {}
    if kind == BOOLEAN_FOR_NUMBER:  # found by the model, about one of its fields: its key path
        return f"{source}: {_path(loc + tuple(ctx['at']))}: expected {ctx['expected']} (got {ctx['got']})"
    path = _path(loc)
    got = first.get("input")
    if kind == "extra_forbidden":
        owner = _describe(Config, loc, tag)
        if owner is None:
            return f"{source}: {path}: unknown key; remove it"
        keys = [name for name in owner.model_fields if not (owner is Grid and name == "sweeps")]
        if not keys:  # workflows.single: a section with no settings at all
            return f"{source}: {path}: unknown key; {_path(loc[:-1])} has no settings, remove it"
        fix = did_you_mean(loc[-1], keys, "valid keys here")
        if owner is Grid and closest(loc[-1], keys) is None:
            fix += ", or a setting's dotted key as an extra axis (e.g. train.lr)"
        return f"{source}: {path}: unknown key; {fix}"
    if kind == "missing":
        return f"{source}: {path}: required key is missing; add it"
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        valid = kinds(loc[0]) if loc and loc[0] in ("scales", "tasks") else ()
        if kind == "union_tag_not_found":
            return f"{source}: {path}.kind: required key is missing; add it (one of: {', '.join(valid)})"
        # A task kind may be a plugin's; a scale's kind is matrixrl's own.
        fix = (did_you_mean_registered if loc and loc[0] == "tasks" else did_you_mean)(ctx.get("tag"), valid)
        return f"{source}: {path}.kind: unknown kind {ctx.get('tag')!r}; {fix}"
    if isinstance(ctx.get("error"), ConfigError):
        return f"{source}: {ctx['error']}"
    if kind == "too_short" and ctx.get("min_length") == 1:
        return f"{source}: {path}: the list is empty; list at least one value"
    if kind in _EXPECTED:
        return f"{source}: {path}: {_EXPECTED[kind]} (got {_shown(got)})"
    message = first["msg"]
    if message.startswith("Value error, "):
        return f"{source}: {path}: {message[len('Value error, ') :]}"
    if message.startswith("Input should be "):
        message = "must be " + message[len("Input should be ") :]
    shown = "" if isinstance(got, (dict, list)) else f" (got {_shown(got)})"
    return f"{source}: {path}: {message[0].lower()}{message[1:]}{shown}"
