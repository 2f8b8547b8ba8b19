"""docs/config-reference.md, the reference of every experiments.yaml setting, generated from the schema.

``python tools/config_reference.py`` rewrites docs/config-reference.md; ``--check`` only
compares, and exits 1 with one line when the file is out of date (the test suite
runs it). Each section lists its keys with their type, default, description and
whether they are runtime settings; a ``scales:`` or ``tasks:`` entry is listed once
per ``kind:``.
"""

from __future__ import annotations

import argparse
import inspect
import sys
import textwrap
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types as at
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from matrixrl.config.schema import Config, TrainOverrides
from matrixrl.settings import is_runtime, kind_values, models_in

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "config-reference.md"
COMMAND = "python tools/config_reference.py"
WIDTH = 100

HEADER = f"""\
# Configuration reference

<!-- Generated from matrixrl/config/schema.py and the settings of each task and workflow
     module by `{COMMAND}`; edit those, not this file. -->

Every key experiments.yaml accepts, section by section: its type, its default and
what it does. `NAME` stands for a name you choose (a scale's, a task's). A key
marked **runtime** cannot change a result (threads, batch sizes, devices): it is
left out of every digest, so changing it reruns nothing. Unknown keys are errors.
How to override keys for one command (`--set`, `--only`) and what a change reruns
are in [configuration.md](configuration.md).
"""


# --- walking the schema ------------------------------------------------------------------


def fields(model: type[BaseModel] = Config, prefix: str = "") -> Iterator[tuple[str, type[BaseModel], str, FieldInfo]]:
    """Every field of every model reachable from ``model``, depth first, as
    ``(key path, owning model, field name, field)``.

    A mapping of named entries (``scales:``, ``tasks:``) shows its key as ``NAME``; the
    members of a union (one per ``kind:``) are each walked, so a key path may repeat
    with another owner.
    """
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        yield path, model, name, field
        below = f"{path}.NAME." if get_origin(field.annotation) is dict else f"{path}."
        for member in models_in(field.annotation):
            yield from fields(member, below)


def _sections(model: type[BaseModel], path: str) -> list[tuple[str, type[BaseModel], str]]:
    """The nested sections of ``model`` to document after its own keys: (path, model, label)."""
    found = []
    for name, field in model.model_fields.items():
        if _is_overrides(field):
            continue
        nested = models_in(field.annotation)
        if get_origin(field.annotation) is dict:
            for member in nested:
                found.append((f"{path}{name}.NAME", member, _kind_label(member)))
        elif nested:
            found.append((f"{path}{name}", nested[0], ""))
    return found


def _is_overrides(field: FieldInfo) -> bool:
    return TrainOverrides in models_in(field.annotation)


def _kind_label(model: type[BaseModel]) -> str:
    kinds = kind_values(model)
    return "kind: " + " | ".join(kinds) if kinds else ""


# --- text of one key ---------------------------------------------------------------------


def _bounds(metadata: list) -> list[str]:
    lower = next((m for m in metadata if isinstance(m, (at.Ge, at.Gt))), None)
    upper = next((m for m in metadata if isinstance(m, (at.Le, at.Lt))), None)
    low = None if lower is None else (lower.ge if isinstance(lower, at.Ge) else lower.gt)
    high = None if upper is None else (upper.le if isinstance(upper, at.Le) else upper.lt)
    if isinstance(lower, at.Ge) and isinstance(upper, at.Le):
        return [f"{low} to {high}"]
    parts = []
    if lower is not None:
        parts.append(f"{'≥' if isinstance(lower, at.Ge) else '>'} {low}")
    if upper is not None:
        parts.append(f"{'≤' if isinstance(upper, at.Le) else '<'} {high}")
    return parts


def type_text(annotation: Any, metadata: list = ()) -> str:
    """An annotation in words: ``integer ≥ 1``, ``list of strings, at least one``, ``one of `a`, `b```."""
    metadata = list(metadata)
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        inner = [m for extra in args[1:] for m in (extra.metadata if isinstance(extra, FieldInfo) else [extra])]
        return type_text(args[0], metadata + inner)
    if origin in (Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        optional = len(members) < len(args)
        if len(members) == 1:
            text = type_text(members[0], metadata)
        elif all(models_in(m) for m in members):
            text = "a section whose keys depend on its kind (below)"
        else:
            text = " or ".join(type_text(m, metadata) for m in members)
        return f"{text} or null" if optional else text
    if origin is Literal:
        values = ", ".join(f"`{_inline(v)}`" for v in args)
        return f"one of {values}" if len(args) > 1 else values
    minimum = next((m.min_length for m in metadata if isinstance(m, at.MinLen)), None)
    if origin is list:
        item = args[0]
        if get_origin(item) is Literal:
            text = "list of " + ", ".join(f"`{_inline(v)}`" for v in get_args(item))
        else:
            text = f"list of {_plural(type_text(item))}"
        return text + (", at least one" if minimum == 1 else f", at least {minimum}" if minimum else "")
    if origin is dict and models_in(args[1]):
        return "mapping of names to entries, each with a `kind:` (below)"
    if origin is dict:
        return "dotted keys, each with a list of values"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section (below)"
    words = {int: "integer", float: "number", bool: "true or false", str: "string"}
    text = words.get(annotation, getattr(annotation, "__name__", str(annotation)))
    if annotation is str and minimum:
        text = "non-empty string"
    bounds = _bounds(metadata)
    return f"{text} {', '.join(bounds)}" if bounds else text


def _plural(text: str) -> str:
    head, _, rest = text.partition(" ")
    plural = {"integer": "integers", "number": "numbers", "string": "strings"}.get(head)
    return f"{plural} {rest}".strip() if plural else text


def _inline(value: Any) -> str:
    """A value as it would be written in experiments.yaml."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_inline(v) for v in value) + "]"
    return str(value)


def default_text(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return ""  # a section: its keys have the defaults
    return f"default `{_inline(value)}`"


def _key(path: str, field: FieldInfo) -> str:
    """One key as a list item: its path, type, default and runtime mark, then its description."""
    kind = "section: any key of [`train`](#train)" if _is_overrides(field) else type_text(field.annotation, field.metadata)
    facts = [f"**`{path}`**", kind, default_text(field), "**runtime**" if is_runtime(field) else ""]
    head = _wrap(" · ".join(f for f in facts if f), initial="- ", indent="  ")
    body = _wrap(_markdown(field.description or ""), initial="  ", indent="  ")
    return f"{head}  \n{body}" if body.strip() else head


def _wrap(text: str, initial: str = "", indent: str = "") -> str:
    """``text`` filled to ``WIDTH`` columns, never breaking inside a `code span`."""
    spans = text.split("`")
    protected = "`".join(part.replace(" ", "\0") if i % 2 else part for i, part in enumerate(spans))
    filled = textwrap.fill(
        protected, WIDTH, initial_indent=initial, subsequent_indent=indent, break_on_hyphens=False, break_long_words=False
    )
    return filled.replace("\0", " ")


def _markdown(text: str) -> str:
    """Docstring or description text as markdown: reStructuredText literals become code
    spans, and a ``<`` outside them is escaped (it would open an HTML tag)."""
    spans = text.replace("``", "`").split("`")
    return "`".join(part if i % 2 else part.replace("<", "\\<") for i, part in enumerate(spans))


def _doc(model: type[BaseModel]) -> str:
    text = inspect.cleandoc(model.__doc__ or "")
    paragraphs = [" ".join(p.split()) for p in text.split("\n\n") if p.strip()]
    return "\n\n".join(_wrap(_markdown(p)) for p in paragraphs)


def _in_order(model: type[BaseModel]) -> list[tuple[str, FieldInfo]]:
    """A model's fields as documented: ``kind`` first (a file-based task's comes after the
    shared file keys in the model), then in the model's order."""
    return sorted(model.model_fields.items(), key=lambda item: item[0] != "kind")


# --- the page ----------------------------------------------------------------------------


def _section(path: str, model: type[BaseModel], label: str, level: int) -> list[str]:
    title = f"`{path}`" + (f" ({label})" if label else "")
    lines = [f"{'#' * level} {title}", ""]
    if _doc(model):
        lines += [_doc(model), ""]
    keys = [_key(f"{path}.{name}", field) for name, field in _in_order(model)]
    lines += keys + [""] if keys else ["No keys.", ""]
    for sub_path, sub_model, sub_label in _sections(model, f"{path}."):
        lines += _section(sub_path, sub_model, sub_label, min(level + 1, 4))
    return lines


def render() -> str:
    """The whole of docs/config-reference.md."""
    lines = [HEADER, "## Top level", "", _doc(Config), ""]
    lines += [_key(name, field) for name, field in Config.model_fields.items()]
    lines.append("")
    for name, field in Config.model_fields.items():
        nested = models_in(field.annotation)
        if not nested:
            continue
        lines += [f"## `{name}`", ""]
        if get_origin(field.annotation) is dict:
            kinds = ", ".join(f"`{k}`" for m in nested for k in kind_values(m))
            intro = f"{field.description[0].upper()}{field.description[1:]}. Each entry is `NAME: {{kind: ..., ...}}`"
            lines += [_wrap(f"{intro}; its keys depend on its kind: {kinds}."), ""]
            for member in nested:
                lines += _section(f"{name}.NAME", member, _kind_label(member), 3)
        else:
            lines += _section(name, nested[0], "", 2)[2:]  # the ## heading above stands for it
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description="Write docs/config-reference.md from the schema.")
    parser.add_argument("--check", action="store_true", help="only check that the file is up to date")
    parser.add_argument("--path", type=Path, default=DOC, help="the file (default: docs/config-reference.md of the repository)")
    args = parser.parse_args(argv)
    from matrixrl.plugins import ENV, plugin_modules

    if plugin_modules():  # their entries are in the schema now, and docs/config-reference.md is the package's own
        print(
            f"Error: {ENV} is set ({', '.join(plugin_modules())}), and docs/config-reference.md documents the package's own "
            f"workflows and task kinds only; unset {ENV} and run {COMMAND} again",
            file=sys.stderr,
        )
        return 2
    text = render()
    if args.check:
        current = args.path.read_text() if args.path.is_file() else None
        if current != text:
            shown = "docs/config-reference.md" if args.path == DOC else str(args.path)
            print(f"{shown} is out of date; run {COMMAND}", file=sys.stderr)
            return 1
        return 0
    args.path.write_text(text)
    print(f"wrote {args.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
