"""The page assembled from its sections: sortable tables holding exact values, and figures."""

from __future__ import annotations

import base64
import html
import json
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from matrixrl.report.formats import is_missing, is_numeric_column, to_json, value_text
from matrixrl.report.html.assets import CSP, SCRIPT, STYLE

SIGNED = {"gain", "gain_z", "peak_gain_z", "change"}
"""Columns whose sign is the point (colored): these, ``gain_*``, and every figure of ``compare``."""
VERDICT_SIGNS = {"supported": {"pos": True}, "contradicted": {"neg": True}}
"""A claim's verdict, coloured as a gain (supported) or a loss (contradicted)."""


@dataclass(frozen=True)
class TableSection:
    """One table of the page: ``frame`` is what ``--format json`` prints for it.

    ``brief``: the columns shown before "every column" is ticked (all if None);
    ``omitted``: why the table is left out (then it is that one line).
    """

    name: str
    title: str
    frame: pd.DataFrame
    caption: str | None = None
    empty: str = "no rows"
    brief: Sequence[str] | None = None
    omitted: str | None = None
    first: bool = False
    """Shown first, above the matrix (``TABLES``' ``first``: the claims, the study's answer)."""


@dataclass(frozen=True)
class FigureSection:
    """A group of plots: ``images`` maps a plot's name (its PNG's file stem) to its PNG bytes."""

    title: str
    images: Mapping[str, bytes]
    note: str | None = None


def signed(table: str, frame: pd.DataFrame, column: str) -> bool:
    """Is ``column`` of ``table`` a signed figure, coloured by its sign?"""
    if not is_numeric_column(frame, column) or column.startswith("n_"):
        return False
    return table == "compare" or column in SIGNED or column.startswith("gain_")


def table_html(section: TableSection) -> str:
    """``<table data-table=NAME>``: header cells carry ``data-column``, body cells ``data-value`` (JSON)."""
    frame = section.frame
    if section.omitted:
        return f'<p class="empty omitted" data-table="{escape_attr(section.name)}">{escape_text(section.omitted)}</p>'
    if frame.empty:
        return f'<p class="empty" data-table="{escape_attr(section.name)}">{escape_text(section.empty)}</p>'
    records = json.loads(to_json(frame))
    brief = set(frame.columns if section.brief is None else section.brief)
    columns = [
        (c, is_numeric_column(frame, c), signed(section.name, frame, c), c not in brief) for c in frame.columns
    ]
    head = "".join(
        f'<th data-column="{escape_attr(c)}"{class_attr(num=n, more=m)}>{escape_text(c)}</th>' for c, n, _, m in columns
    )
    rows = []
    for values, record in zip(frame.itertuples(index=False, name=None), records):
        cells = "".join(
            f'<td data-value="{escape_attr(json.dumps(record[c]))}"'
            f'{class_attr(num=n, more=m, **sign_of(v) if s else VERDICT_SIGNS.get(v, {}) if c == "verdict" else {})}>'
            f"{escape_text(value_text(v, c))}</td>"
            for (c, n, s, m), v in zip(columns, values)
        )
        rows.append(f"<tr>{cells}</tr>")
    more = sum(m for *_, m in columns)
    toggle = ""
    if more:
        box = f"every-{escape_attr(section.name)}"
        toggle = f'<input type="checkbox" class="every" id="{box}"><label for="{box}">every column ({more} more)</label>'
    return (
        f'{toggle}<div class="scroll{" brief" if more else ""}"><table data-table="{escape_attr(section.name)}">'
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


def image_html(name: str, png: bytes) -> str:
    """A ``<figure>`` with the PNG inline as a data: URI."""
    data = base64.b64encode(png).decode("ascii")
    return (
        f'<figure id="plot-{escape_attr(name)}"><img src="data:image/png;base64,{data}" alt="{escape_attr(name)}">'
        f"<figcaption>{escape_text(name)}.png</figcaption></figure>"
    )


def report_page(
    title: str,
    meta: str,
    tables: Sequence[TableSection],
    figures: Sequence[FigureSection],
    *,
    matrix: str = "",
    cards: str = "",
) -> str:
    """The whole page as text: the tables marked ``first`` (the claims: the answer), ``matrix``,
    the figures, the ``cards`` of the cells, then the other tables. ``matrix`` and ``cards``
    are HTML (:func:`matrix_html`, :func:`cards_html`)."""
    leading = [t for t in tables if t.first]
    tables = [t for t in tables if not t.first]
    toc = [(f"table-{t.name}", t.name) for t in leading]
    toc += [("matrix", "Matrix")] if matrix else []
    toc += [(f"figures-{i}", f.title) for i, f in enumerate(figures)]
    toc += [("cells", "Cells")] if cards else []
    toc += [(f"table-{t.name}", t.name) for t in tables]
    nav = " ".join(f'<a href="#{escape_attr(anchor)}">{escape_text(name)}</a>' for anchor, name in toc)
    body = [f"<h1>{escape_text(title)}</h1>", f'<p class="meta">{escape_text(meta)}</p>', f"<nav>{nav}</nav>"]
    body.extend(_table_section(t) for t in leading)
    if matrix:
        body.append(matrix)
    for i, f in enumerate(figures):
        body.append(f'<section id="figures-{i}"><h2>{escape_text(f.title)}</h2>')
        if f.note:
            body.append(f'<p class="caption">{escape_text(f.note)}</p>')
        body.extend(image_html(name, png) for name, png in f.images.items())
        body.append("</section>")
    if cards:
        body.append(cards)
    body.extend(_table_section(t) for t in tables)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{escape_attr(CSP)}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape_text(title)}</title><style>{STYLE}</style></head>\n<body>\n"
        + "\n".join(body)
        + f"\n<script>{SCRIPT}</script>\n</body></html>\n"
    )


def _table_section(t: TableSection) -> str:
    caption = "".join(f'<p class="caption">{escape_text(line)}</p>' for line in t.caption.split("\n")) if t.caption and not t.omitted else ""
    return f'<section id="table-{escape_attr(t.name)}"><h2>{escape_text(t.title)}</h2>{caption}{table_html(t)}</section>'


def sign_of(value) -> dict:
    if is_missing(value) or isinstance(value, bool) or not isinstance(value, numbers.Real) or value == 0:
        return {}
    return {"pos": value > 0, "neg": value < 0}


def class_attr(**flags: bool) -> str:
    names = [name for name, on in flags.items() if on]
    return f' class="{" ".join(names)}"' if names else ""


def escape_text(value: str) -> str:
    return html.escape(str(value), quote=False)


def escape_attr(value: str) -> str:
    return html.escape(str(value), quote=True)
