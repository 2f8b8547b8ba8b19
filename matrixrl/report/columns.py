"""Which columns a report table shows: a short default that answers its question, all on request.

docs/report.md, "Which columns".
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd

from matrixrl.errors import ConfigError, closest
from matrixrl.report import TABLES
from matrixrl.report.formats import MISSING, cell_text, is_missing, row_keys

DEFAULT = "default"
ALL = "all"
SETS = (DEFAULT, ALL)
"""The named column sets ``--columns`` accepts besides column names and patterns; a table's
``default`` columns are its registry entry's (``matrixrl.report.TABLES``: ``columns``)."""


@dataclass(frozen=True)
class Joined:
    """A reading column made of ``parts``: ``text`` turns the parts' values into one text."""

    name: str
    parts: tuple[str, ...]
    text: Callable[..., str]


def _at(value, step) -> str:
    return MISSING if is_missing(value) else f"{cell_text(value)}@{cell_text(step)}"


def _cliff(cliff, onset) -> str:
    if is_missing(cliff) or not cliff:
        return cell_text(cliff)
    return "yes" if is_missing(onset) else f"yes@{cell_text(onset)}"


def _plus_minus(value, lo, hi) -> str:
    if is_missing(value) or is_missing(lo) or is_missing(hi):
        return cell_text(value)
    return f"{cell_text(value)}±{(float(hi) - float(lo)) / 2:.3f}"


def joined_columns(columns: Sequence[str]) -> dict[str, Joined]:
    """The joined reading columns that a table of ``columns`` offers, by name."""
    present = set(columns)
    joined = []
    if {"peak", "peak_step"} <= present:
        joined.append(Joined("peak@step", ("peak", "peak_step"), _at))
    if {"cliff", "cliff_onset"} <= present:
        joined.append(Joined("cliff@onset", ("cliff", "cliff_onset"), _cliff))
    if "n_cells" in present:  # the claims table's count under a header that does not wrap into "n_" over "cells"
        joined.append(Joined("cells", ("n_cells",), cell_text))
    for column in columns:
        for suffix, name in (("_mean", column.removesuffix("_mean")), ("_diff", column)):
            stem = column.removesuffix(suffix)
            if column.endswith(suffix) and {f"{stem}_lo", f"{stem}_hi"} <= present:
                joined.append(Joined(f"{name}±ci", (column, f"{stem}_lo", f"{stem}_hi"), _plus_minus))
        if {f"{column}_lo", f"{column}_hi"} <= present:  # X with X_lo, X_hi (memory's base_diff)
            joined.append(Joined(f"{column}±ci", (column, f"{column}_lo", f"{column}_hi"), _plus_minus))
    return {j.name: j for j in joined}


@dataclass(frozen=True)
class Shown:
    """What to render of a table: ``frame`` (joined columns as text), the joined columns'
    names (numbers, so right-aligned), and how many of the table's columns are left out."""

    frame: pd.DataFrame
    joined: tuple[str, ...]
    hidden: int


def parse_columns(spec: str, table: str, columns: Sequence[str]) -> list[str]:
    """``--columns`` text → the names it selects among a table's ``columns`` and joined columns
    (the axes aside), in the order given. Items: a column name, a shell pattern (``*_final``),
    ``default`` or ``all``. ConfigError (one line) for an item that selects nothing."""
    joined = joined_columns(columns)
    keys = row_keys(columns)
    items = [item.strip() for item in spec.split(",") if item.strip()]
    if not items:
        raise ConfigError(f"--columns {spec!r}: expected NAME[,NAME] (a column, a pattern such as '*_final', default or all)")
    chosen: list[str] = []
    for item in items:
        if item == DEFAULT:
            found = [c for c in TABLES[table].columns if c in joined or c in columns]
        elif item == ALL:
            found = list(columns)
        elif item in joined or item in columns:
            found = [item]
        else:
            found = [c for c in [*columns, *joined] if fnmatch.fnmatchcase(c, item)]
        if not found:
            offered = [*SETS, *(c for c in columns if c not in keys), *joined]
            near = None if any(ch in item for ch in "*?[") else closest(item, offered)  # a pattern is no slip of a name
            fix = f"did you mean {near}?" if near else f"use any of: {', '.join(offered)}"
            raise ConfigError(f"--columns {item}: the {table} table has no such column; {fix}")
        chosen += [c for c in found if c not in chosen and c not in keys]
    return chosen


READING_FORMATS = ("table", "markdown", "latex")
"""The formats for people: joined columns are text there; csv and json are for programs."""


def shown(table: str, frame: pd.DataFrame, spec: str | None, format: str) -> Shown:
    """The columns of report table ``table`` to render from ``frame`` (its ``cell`` column dropped)
    in ``format``.

    ``spec``: the ``--columns`` text (None: ``default`` for the reading formats, ``all``
    for csv and json). In csv and json a joined name stands for its parts.
    """
    reading = format in READING_FORMATS
    columns = [str(c) for c in frame.columns]
    joined = joined_columns(columns)
    chosen = parse_columns(spec if spec is not None else DEFAULT if reading else ALL, table, columns)
    keys = row_keys(columns)
    if not reading:
        names = []
        for name in chosen:
            names += [p for p in (joined[name].parts if name in joined else (name,)) if p not in names]
        out = frame[[*keys, *(n for n in names if n not in keys)]]
        return Shown(out, (), len(columns) - len(out.columns))
    covered = set(keys)
    out = frame[keys].copy()
    for name in chosen:
        if name in joined:
            parts = joined[name].parts
            values = zip(*(frame[p].tolist() for p in parts))
            out[name] = pd.Series([joined[name].text(*v) for v in values], index=frame.index, dtype=object)
            covered.update(parts)
        else:
            out[name] = frame[name]
            covered.add(name)
    out.attrs = dict(frame.attrs)
    return Shown(out, tuple(n for n in chosen if n in joined), len(set(columns) - covered))


def printable(
    table: str,
    frame: pd.DataFrame,
    format: str,
    *,
    columns: str | None = None,
    group_by: Sequence[str] = (),
):
    """Report table ``table`` (``frame`` as the table builders return it) as ``matrixrl report``
    prints it in ``format``: the columns of ``columns`` (``--columns``; ``all`` for ``--wide``),
    under its title, with its caption and notes. Text, or a rich renderable for ``table``."""
    from matrixrl.report.formats import render

    view = shown(table, frame.drop(columns="cell", errors="ignore"), columns, format)
    captions = [frame.attrs.get("caption")]
    if view.hidden and columns is None:
        captions.append(f"{view.hidden} more columns: --wide shows them all, --columns NAME,... picks (see --help).")
    return render(
        view.frame,
        format,
        title=TABLES[table].title,
        group_by=group_by,
        caption="\n".join(c for c in captions if c) or None,
        right=view.joined,
    )
