"""Rendering one report table: a rich table, csv, markdown, latex or json.

Columns keep the frame's order. Two families of output:

- for reading (``table``, ``markdown``, ``latex``): floats with 3 decimals, integers
  as they are, booleans ``yes``/``no``, a missing value ``—`` (``--`` in LaTeX);
  numbers right-aligned, text (and the axes) left-aligned;
- for programs (``csv``, ``json``): every value at full precision (Python's
  shortest round-trip float text), booleans ``True``/``False`` in csv and
  ``true``/``false`` in json, a missing value empty in csv and ``null`` in json.

Markdown comes from pandas' ``to_markdown`` (tabulate), LaTeX from pandas'
``to_latex`` (a booktabs ``tabular``; needs jinja2), csv from ``to_csv``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from rich.table import Table

from matrixrl.config import AXES
from matrixrl.report import FORMATS

MISSING = "—"
LATEX_MISSING = "--"


def is_missing(value) -> bool:
    if value is None or value is pd.NA or value is pd.NaT:
        return True
    return isinstance(value, (float, np.floating)) and math.isnan(value)


def cell_text(value, missing: str = MISSING) -> str:
    """A value as readers see it: 3 decimals, ``yes``/``no``, ``missing`` for NaN/None/NA."""
    if is_missing(value):
        return missing
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return f"{float(value):.3f}"
    return str(value)


def is_numeric_column(frame: pd.DataFrame, column: str) -> bool:
    dtype = frame[column].dtype
    return column not in AXES and pd.api.types.is_numeric_dtype(dtype) and not pd.api.types.is_bool_dtype(dtype)


def _texts(frame: pd.DataFrame, missing: str) -> pd.DataFrame:
    return pd.DataFrame(
        {column: [cell_text(v, missing) for v in frame[column].tolist()] for column in frame.columns},
        columns=frame.columns,
        dtype=object,
    )


def _alignments(frame: pd.DataFrame) -> list[str]:
    return ["right" if is_numeric_column(frame, c) else "left" for c in frame.columns]


def to_csv(frame: pd.DataFrame) -> str:
    return frame.to_csv(index=False, lineterminator="\n")


def _json_value(value):
    if is_missing(value):
        return None
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    return str(value)


def to_json(frame: pd.DataFrame) -> str:
    """A list of one object per row, keys in column order."""
    records = [
        {column: _json_value(value) for column, value in zip(frame.columns, row)}
        for row in frame.itertuples(index=False, name=None)
    ]
    return json.dumps(records, indent=1, allow_nan=False) + "\n"


def to_markdown(frame: pd.DataFrame) -> str:
    align = _alignments(frame)
    text = _texts(frame, MISSING).to_markdown(index=False, disable_numparse=True, colalign=align)
    return text + "\n"


def to_latex(frame: pd.DataFrame) -> str:
    """A booktabs ``tabular`` (``\\usepackage{booktabs}``); text is escaped."""
    column_format = "".join("r" if a == "right" else "l" for a in _alignments(frame))
    return _texts(frame, LATEX_MISSING).to_latex(index=False, escape=True, column_format=column_format)


def to_rich(frame: pd.DataFrame, title: str = "", group_by: Sequence[str] = (), caption: str | None = None) -> Table:
    """A rich table; with ``group_by``, a rule between consecutive rows of different groups."""
    table = Table(title=title or None, caption=caption)
    for column, align in zip(frame.columns, _alignments(frame)):
        table.add_column(column, justify=align)
    keys = list(group_by)
    previous = None
    for position, row in enumerate(frame.itertuples(index=False, name=None)):
        group = tuple(frame[k].iloc[position] for k in keys)
        if keys and previous is not None and group != previous:
            table.add_section()
        previous = group
        table.add_row(*(cell_text(v) for v in row))
    return table


def render(
    frame: pd.DataFrame,
    format: str,
    *,
    title: str = "",
    group_by: Sequence[str] = (),
    caption: str | None = None,
) -> str | Table:
    """``frame`` in ``format`` (one of ``FORMATS``): a rich Table for ``table``, else text ending in a newline."""
    if format == "table":
        return to_rich(frame, title, group_by, caption)
    writers = {"csv": to_csv, "json": to_json, "markdown": to_markdown, "latex": to_latex}
    if format not in writers:
        raise ValueError(f"unknown format {format!r}; use one of: {', '.join(FORMATS)}")
    return writers[format](frame)
