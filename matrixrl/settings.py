"""What every settings model shares: the strict base, the runtime marker, ``science``, digests.

Imports no settings model, so any of them can import it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import types
import typing
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic_core import PydanticCustomError


class Strict(BaseModel):
    """A settings model: unknown keys are errors, and a validated value never changes."""

    # validate_default: a default is converted like a given value (16 → 16.0 for a float), so a
    # spec reads the same before and after a JSON round trip (digests compare specs across processes).
    # allow_inf_nan: no setting means anything at infinity (.inf), and JSON, which carries a spec to
    # its job, has no infinity: it would arrive as null and fail there, far from the file's line.
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, data: Any) -> Any:
        # pydantic takes true as 1 where a number goes: `steps: true` would be one step, and
        # `seed: [1, true]` two equal seeds. Here, rather than per field, so that every settings
        # model (each task's and workflow's too) refuses it, with the loose rest kept (4.0 is 4).
        if not isinstance(data, dict):
            return data
        for name, value in data.items():
            expected = _number_expected(cls, name)
            where, flag = _boolean_in(value, expected[1]) if expected is not None else ((), None)
            if flag is not None:
                raise PydanticCustomError(
                    BOOLEAN_FOR_NUMBER,
                    "{key}: expected {expected} (got {got})",
                    {"key": ".".join(map(str, (name, *where))), "at": (name, *where), "expected": expected[0],
                     "got": "true" if flag else "false"},
                )
        return data


BOOLEAN_FOR_NUMBER = "boolean_for_number"
"""The pydantic error type of a true or false where a number goes; its ``ctx["at"]`` is where, below the model."""

_NUMBER_NAMES = {int: "a whole number", float: "a number"}
_NUMBERS_EXPECTED: dict[tuple[type, str], tuple[str, int] | None] = {}


def _number_expected(model: type[BaseModel], name: str | None) -> tuple[str, int] | None:
    """What field ``name`` of ``model`` takes where a number goes, in words, and how deep in lists or
    mappings (0: the value itself; 1: each item of a list, each value of a mapping); None when no
    number is expected, or a boolean is as welcome (``bool | int``)."""
    key = (model, name or "")
    if key not in _NUMBERS_EXPECTED:
        field = model.model_fields.get(name or "")
        _NUMBERS_EXPECTED[key] = None if field is None else _numbers_in(field.annotation)
    return _NUMBERS_EXPECTED[key]


def _numbers_in(annotation: Any, depth: int = 0) -> tuple[str, int] | None:
    if annotation in _NUMBER_NAMES:
        return _NUMBER_NAMES[annotation], depth
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is Annotated:
        return _numbers_in(args[0], depth)
    if origin in (Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        if any(a is bool or a is str or get_origin(a) is Literal or a is Any for a in members):
            return None
        return next(filter(None, (_numbers_in(a, depth) for a in members)), None)
    if origin in (list, tuple, set, frozenset, dict, typing.Sequence, typing.Mapping) and args and depth == 0:
        return _numbers_in(args[-1], depth + 1)  # a list's items, a mapping's values
    return None


def _boolean_in(value: Any, depth: int) -> tuple[tuple, bool | None]:
    """(where, the boolean) of the first boolean in ``value`` at ``depth``: ``(1,)`` for a list's
    item, ``("aggregator",)`` for a mapping's value, ``()`` for the value itself; or ((), None)."""
    if depth == 0:
        return (), value if isinstance(value, bool) else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for key, item in items:
        if isinstance(item, bool):
            return (key,), item
    return (), None


RUNTIME = {"runtime": True}
"""``json_schema_extra`` of a setting that cannot change a result (threads, batch sizes,
devices), or a dataclass field's ``metadata`` that is not science on its own: it stays out of cell specs' digests and Snakemake params, so changing it
reruns nothing (see :func:`science`)."""


ADDED = {"omit_at_default": True}
"""``json_schema_extra`` of a setting added after results were computed without it: at
its default it stays out of :func:`science`, so existing results keep their digests
and rerun nothing. Its default must compute exactly what the code did before it."""


def inert_without(*names: str) -> dict:
    """``json_schema_extra`` of a setting that acts only through others (``names``, fields of the
    same model): while every one of them is at its default it stays out of :func:`science`, as
    :data:`ADDED` does at its own default; once one is set it is science, whatever its value."""
    return {"inert_without": names}


def is_runtime(field) -> bool:
    return isinstance(field.json_schema_extra, dict) and bool(field.json_schema_extra.get("runtime"))


def science(value: Any) -> Any:
    """``value`` as JSON-able data without its runtime settings: what a result is computed from."""
    if isinstance(value, BaseModel):
        return {
            name: science(getattr(value, name))
            for name, field in type(value).model_fields.items()
            if not is_runtime(field) and not _omitted(field, getattr(value, name)) and not _inert(field, value)
        }
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: science(getattr(value, f.name)) for f in dataclasses.fields(value) if not f.metadata.get("runtime")
        }
    if isinstance(value, dict):
        return {str(k): science(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [science(v) for v in value]
    return value


def _omitted(field, value) -> bool:
    extra = field.json_schema_extra
    if not (isinstance(extra, dict) and extra.get("omit_at_default")):
        return False
    default = field.default_factory() if field.default_factory is not None else field.default
    return value == default


def settings_digest(payload: Any) -> str:
    """A short stable hash of JSON-able settings: the identity of what a result was computed from."""
    blob = json.dumps(payload, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def models_in(annotation) -> list[type[BaseModel]]:
    """The pydantic models inside an annotation (every member of a union), in order."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found = []
    for arg in getattr(annotation, "__args__", ()) or ():
        found += [m for m in models_in(arg) if m not in found]
    return found


def kind_values(model: type[BaseModel]) -> tuple:
    """The ``kind:`` values a model of a discriminated union stands for (none: not a union member)."""
    kind = model.model_fields.get("kind")
    return get_args(kind.annotation) if kind is not None else ()


def _inert(field, model) -> bool:
    """Whether ``field`` of ``model`` acts only through fields that are all at their defaults."""
    extra = field.json_schema_extra
    names = extra.get("inert_without") if isinstance(extra, dict) else None
    if not names:
        return False
    fields = type(model).model_fields
    return all(
        getattr(model, name) == (fields[name].default_factory() if fields[name].default_factory else fields[name].default)
        for name in names
    )
