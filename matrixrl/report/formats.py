"""Rendering one report table: a rich table, csv, markdown, latex or json (docs/report.md has the rules)."""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from rich.box import Box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.table import Table
from rich.text import Text

from matrixrl.analysis.axes import axes_of
from matrixrl.config import AXES
from matrixrl.config.sweeps import spelled
from matrixrl.report import FORMATS

MISSING = "—"
LATEX_MISSING = "--"


ROW_KEYS = ("comparison", "memory", "claim")
"""Columns besides the axes that say what a row is (repeated in each stacked section)."""


def row_keys(columns: Sequence[str]) -> list[str]:
    """The columns among ``columns`` that say what a row is: the axes, then :data:`ROW_KEYS`."""
    present = set(columns)
    return [c for c in [*axes_of(columns), *ROW_KEYS] if c in present]


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


def is_axis(column: str) -> bool:
    """The fixed axes and the extra ones (dotted keys such as ``train.lr``)."""
    return column in AXES or "." in column


def value_text(value, column: str, missing: str = MISSING) -> str:
    """:func:`cell_text`, but an axis value as ``--only`` takes it (``5e-05``, not ``0.000``)."""
    if is_axis(str(column)) and not is_missing(value):
        return spelled(value.item() if isinstance(value, np.generic) else value)
    return cell_text(value, missing)


def column_texts(frame: pd.DataFrame, column: str, missing: str = MISSING) -> list[str]:
    return [value_text(v, column, missing) for v in frame[column].tolist()]


def _texts(frame: pd.DataFrame, missing: str) -> pd.DataFrame:
    return pd.DataFrame(
        {column: column_texts(frame, column, missing) for column in frame.columns},
        columns=frame.columns,
        dtype=object,
    )


def _alignments(frame: pd.DataFrame, right: Collection[str] = ()) -> list[str]:
    return ["right" if c in right or is_numeric_column(frame, c) else "left" for c in frame.columns]


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


def to_markdown(frame: pd.DataFrame, right: Collection[str] = ()) -> str:
    align = _alignments(frame, right)
    text = _texts(frame, MISSING).to_markdown(index=False, disable_numparse=True, colalign=align)
    return text + "\n"


LATEX_SYMBOLS = {"±": r"$\pm$", "×": r"$\times$", "²": r"$^{2}$", "−": "-", "→": r"$\to$", "≥": r"$\geq$", "≤": r"$\leq$", "…": r"\dots{}"}
"""Symbols the tables' text uses, as LaTeX writes them (pdfLaTeX stops at a Unicode character it has no definition for)."""


def _latex_symbol(char: str) -> str:
    if char in LATEX_SYMBOLS:
        return LATEX_SYMBOLS[char]
    name = unicodedata.name(char, "")
    if name.startswith("GREEK SMALL LETTER ") and " " not in name[19:]:  # ω, η: $\omega$, $\eta$
        return f"$\\{name[19:].lower()}$"
    return char


def to_latex(frame: pd.DataFrame, right: Collection[str] = ()) -> str:
    """A booktabs ``tabular`` (``\\usepackage{booktabs}``); text is escaped, and the symbols the
    tables use are LaTeX's (``ω²`` is ``$\\omega^{2}$``)."""
    column_format = "".join("r" if a == "right" else "l" for a in _alignments(frame, right))
    texts = _texts(frame, LATEX_MISSING).replace(MISSING, LATEX_MISSING)  # joined columns' missing values
    text = texts.to_latex(index=False, escape=True, column_format=column_format)
    text = "".join(_latex_symbol(c) if ord(c) > 127 else c for c in text)
    return re.sub(r"(?<!\\)\$\$", "", text)  # two symbols side by side: one math group (a $ of the text is \$)


# No vertical lines: a rule under the header and between groups; columns two spaces apart
# (padding on the right only, none after the last column).
READING_BOX = Box("    \n    \n ── \n    \n ── \n ── \n    \n    \n")
COLUMN_GAP = 2
MAX_HEADER_LINES = 3
# A header may break after an underscore, and before the @ or ± of a joined column.
_HEADER_BREAKS = re.compile(r"(?<=_)(?=.)|(?=[@±])")


def header_lines(name: str, width: int) -> list[str]:
    """``name`` broken into lines of at most ``width`` cells where it may break (a piece
    longer than ``width`` keeps a line of its own)."""
    lines: list[str] = []
    for piece in _HEADER_BREAKS.split(name):
        if lines and cell_len(lines[-1] + piece) <= width:
            lines[-1] += piece
        else:
            lines.append(piece)
    return lines


def narrowest_header(name: str, values_width: int, max_lines: int = MAX_HEADER_LINES) -> str:
    """``name`` wrapped (``\\n``) to the narrowest width in at most ``max_lines`` lines,
    never narrower than the column's values."""
    longest_piece = max(cell_len(p) for p in _HEADER_BREAKS.split(name))
    for width in range(max(values_width, longest_piece, 1), cell_len(name) + 1):
        lines = header_lines(name, width)
        if len(lines) <= max_lines:
            return "\n".join(lines)
    return name


@dataclass(frozen=True)
class _Column:
    name: str
    justify: str
    texts: list[str]
    header: str  # the name, or the name wrapped onto lines

    @property
    def width(self) -> int:
        return max([cell_len(line) for line in self.header.split("\n")] + [cell_len(t) for t in self.texts])


def _table_width(columns: Sequence[_Column]) -> int:
    return sum(c.width for c in columns) + COLUMN_GAP * max(len(columns) - 1, 0)


class FittedTable:
    """A report table for the terminal that fits the width it is printed at, and never
    shortens a value (rich would squeeze every column to "0.2…").

    At print time, the first layout that fits, in docs/report.md's order; stacked sections
    repeat the ``keys``.
    """

    def __init__(
        self,
        frame: pd.DataFrame,
        title: str = "",
        group_by: Sequence[str] = (),
        caption: str | None = None,
        right: Collection[str] = (),
        keys: Sequence[str] = (),
    ):
        self.title = title
        self.caption = caption
        self.columns = [
            _Column(str(name), justify, column_texts(frame, name), str(name))
            for name, justify in zip(frame.columns, _alignments(frame, right))
        ]
        self.keys = {str(k) for k in keys}
        self.n_rows = len(frame)
        groups = list(frame[list(group_by)].itertuples(index=False, name=None)) if group_by else [()] * self.n_rows
        # A rule before each row that starts another group.
        self.new_group = [i > 0 and groups[i] != groups[i - 1] for i in range(self.n_rows)]

    def layout(self, width: int) -> tuple[list[list[_Column]] | None, list[_Column]]:
        """``(sections, same)`` at ``width``: the columns of each stacked section (one if it all
        fits; None when not even the keys and one more column fit) and the columns with one
        value in every row that were moved under the table to make it fit."""
        columns = [c for c in self.columns if c.name in self.keys] + [c for c in self.columns if c.name not in self.keys]
        if _table_width(columns) <= width:
            return [columns], []
        wrapped = _wrapped_to_fit(columns, width)
        if _table_width(wrapped) <= width:
            return [wrapped], []
        constant = [c for c in columns if self.n_rows > 1 and len(set(c.texts)) == 1]
        # Counts first (n_pairs = 3), then the axes (task = arith), then figures: each kind all at once.
        kinds = [
            [c for c in constant if c.name.startswith("n_")],
            [c for c in constant if c.name in self.keys],
            [c for c in constant if not c.name.startswith("n_") and c.name not in self.keys],
        ]
        same: list[_Column] = []
        for kind in (k for k in kinds if k):
            same += kind
            wrapped = _wrapped_to_fit([c for c in columns if c not in same], width)
            if _table_width(wrapped) <= width:
                return [wrapped], same
        n_keys = sum(c.name in self.keys for c in wrapped)
        keys, values = wrapped[:n_keys], wrapped[n_keys:]
        sections: list[list[_Column]] = []
        for column in values:
            if sections and _table_width([*keys, *sections[-1], column]) <= width:
                sections[-1].append(column)
            elif _table_width([*keys, column]) <= width:
                sections.append([column])
            else:
                return None, same
        return ([[*keys, *section] for section in sections] or None), same

    def _rich_table(self, columns: Sequence[_Column], title: str) -> Table:
        table = Table(
            title=title or None, box=READING_BOX, show_edge=False, pad_edge=False, padding=(0, COLUMN_GAP - 1, 0, 0)
        )
        for column in columns:
            table.add_column(column.header, justify=column.justify, no_wrap=True, min_width=column.width)
        for i in range(self.n_rows):
            if self.new_group[i]:
                table.add_section()
            table.add_row(*(column.texts[i] for column in columns))
        return table

    def _records(self, columns: Sequence[_Column]) -> list:
        """Each row as ``column  value`` lines: for a terminal too narrow for any table."""
        width = max(cell_len(c.name) for c in columns)
        records: list = [Text(self.title, style="table.title")] if self.title else []
        for i in range(self.n_rows):
            lines = Table.grid(padding=(0, COLUMN_GAP, 0, 0))
            lines.add_column(min_width=width, no_wrap=True)
            lines.add_column(overflow="fold")
            for column in columns:
                lines.add_row(column.name, column.texts[i])
            records += [Text(f"row {i + 1} of {self.n_rows}", style="bold"), lines]
        return records

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        sections, same = self.layout(options.max_width)
        if sections is None:
            yield Group(*self._records([c for c in self.columns if c not in same]))
        else:
            for i, columns in enumerate(sections):
                numbered = f"{self.title} ({i + 1}/{len(sections)})" if len(sections) > 1 and self.title else self.title
                if i:
                    yield Text("")
                yield self._rich_table(columns, numbered)
        if same:
            yield Text("\n".join(_packed([f"{c.name} = {c.texts[0]}" for c in same], "in every row: ", options.max_width)))
        if self.caption:
            yield Text(self.caption)


def _packed(items: Sequence[str], lead: str, width: int) -> list[str]:
    """``lead`` and ``items`` joined by commas into lines of at most ``width`` where they can
    be, breaking only between items (continuation lines indented like the first item)."""
    lines = [lead + items[0]]
    for item in items[1:]:
        if cell_len(lines[-1] + ", " + item) <= width:
            lines[-1] += ", " + item
        else:
            lines[-1] += ","
            lines.append(" " * len(lead) + item)
    return lines


def _wrapped_to_fit(columns: Sequence[_Column], width: int) -> list[_Column]:
    """``columns`` with headers wrapped until the table fits ``width``: onto two lines first,
    the headers that save the most first, then onto three (or until every header is)."""
    result = list(columns)
    for lines in range(2, MAX_HEADER_LINES + 1):
        narrow = [
            _Column(c.name, c.justify, c.texts, narrowest_header(c.name, max(map(cell_len, c.texts), default=0), lines))
            for c in columns
        ]
        for i in sorted(range(len(columns)), key=lambda i: result[i].width - narrow[i].width, reverse=True):
            if _table_width(result) <= width:
                return result
            if narrow[i].width < result[i].width:
                result[i] = narrow[i]
    return result


def to_rich(
    frame: pd.DataFrame,
    title: str = "",
    group_by: Sequence[str] = (),
    caption: str | None = None,
    right: Collection[str] = (),
    keys: Sequence[str] | None = None,
) -> FittedTable:
    """The terminal table; with ``group_by``, a rule between consecutive rows of different groups.

    ``keys``: the columns repeated in each section when the table is stacked (default:
    the axes, ``comparison`` and ``memory`` among the frame's columns).
    """
    if keys is None:
        keys = row_keys([str(c) for c in frame.columns])
    return FittedTable(frame, title, group_by, caption, right, keys)


def render(
    frame: pd.DataFrame,
    format: str,
    *,
    title: str = "",
    group_by: Sequence[str] = (),
    caption: str | None = None,
    right: Collection[str] = (),
) -> str | FittedTable:
    """``frame`` in ``format`` (one of ``FORMATS``): a rich renderable for ``table``, else text
    ending in a newline. ``right``: text columns to right-align as numbers (joined columns)."""
    if format == "table":
        return to_rich(frame, title, group_by, caption, right)
    if format in ("markdown", "latex"):
        return (to_markdown if format == "markdown" else to_latex)(frame, right)
    writers = {"csv": to_csv, "json": to_json}
    if format not in writers:
        raise ValueError(f"unknown format {format!r}; use one of: {', '.join(FORMATS)}")
    return writers[format](frame)
