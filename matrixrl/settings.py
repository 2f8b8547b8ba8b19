"""What every settings model shares: the strict base, the runtime marker, ``science``, digests.

experiments.yaml's schema (``matrixrl.config``), each task kind's settings
(``matrixrl.tasks``), each workflow's and the chat prompt style's
(``matrixrl.workflows``) are all :class:`Strict` models. This module imports none
of them, so any of them can import it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, get_args

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """A settings model: unknown keys are errors, and a validated value never changes."""

    # validate_default: a default is converted like a given value (16 → 16.0 for a float), so a
    # spec reads the same before and after a JSON round trip (digests compare specs across processes).
    # allow_inf_nan: no setting means anything at infinity (.inf), and JSON, which carries a spec to
    # its job, has no infinity: it would arrive as null and fail there, far from the file's line.
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)


RUNTIME = {"runtime": True}
"""``json_schema_extra`` of a setting that cannot change a result (threads, batch sizes,
devices), or a dataclass field's ``metadata`` that is not science on its own: it stays out of cell specs' digests and Snakemake params, so changing it
reruns nothing (see :func:`science`)."""


ADDED = {"omit_at_default": True}
"""``json_schema_extra`` of a setting added after results were computed without it: at
its default it stays out of :func:`science`, so existing results keep their digests
and rerun nothing. Its default must compute exactly what the code did before it."""


def is_runtime(field) -> bool:
    return isinstance(field.json_schema_extra, dict) and bool(field.json_schema_extra.get("runtime"))


def science(value: Any) -> Any:
    """``value`` as JSON-able data without its runtime settings: what a result is computed from."""
    if isinstance(value, BaseModel):
        return {
            name: science(getattr(value, name))
            for name, field in type(value).model_fields.items()
            if not is_runtime(field) and not _omitted(field, getattr(value, name))
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
