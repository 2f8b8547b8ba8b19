"""One self-contained HTML page of the study (``matrixrl report --html``): the answer first.

The page opens with the study's findings tested on it (the claims table: each
finding's evidence and verdict), then the study as a matrix: a row per workflow, a
column per task × scale with shared beside isolated, one matrix per combination of
the extra axes' values. Each square is coloured by the cell's gain at its peak and at its final
checkpoint (mean over seeds), marks a terminal cliff, and links to the cell's card
further down: its learning curve (inline SVG), its numbers and, for a cell with a
cliff, its gradient diagnostics. Then the learning-curve figures, the cards, and
every table whose registry entry says so (``matrixrl.report.TABLES``: ``page``), sortable by any column (a small inline script) with signed numbers
coloured by sign; a table without rows (memory without a memory axis) is left out
with its links, one that says nothing for this study (the across-seeds table with one
seed) with a line saying why, and so are the rows of a one-role workflow's isolated
cells, which repeat its shared runs.

The page makes no request of its own: CSS and the script are inline, every plot is
a PNG in a ``data:`` URI, and a Content-Security-Policy forbids anything else (the
script is allowed by its hash), so it can be opened from disk or mailed as one file.

Tables hold the same numbers as ``matrixrl report --format json``: each cell shows
the reading text of ``--format table`` (3 decimals, yes/no, —) and carries the
exact JSON value in ``data-value``, taken from the very JSON that ``--format json``
prints for that table. Every column is there; the columns beyond the table's
default (``report.columns``) show on ticking "every column".
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
import numbers
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from matrixrl import atomic
from matrixrl.analysis.axes import extra_axes, grouped
from matrixrl.config import Config
from matrixrl.config.sweeps import spelled
from matrixrl.errors import ConfigError, output_named
from matrixrl.report.formats import is_missing, is_numeric_column, to_json, value_text

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1rem auto; max-width: 84rem;
       padding: 0 1rem; color: #1a1a1a; line-height: 1.4; }
h1 { font-size: 1.4rem; margin: 0; }
h2 { font-size: 1.25rem; margin-top: 2.5rem; border-bottom: 1px solid #ddd; padding-bottom: 0.2rem; }
h3 { font-size: 1.05rem; margin: 0.2rem 0 0.4rem; }
#table-claims h2 { margin: 0.8rem 0 0.2rem; }
#table-claims td, #table-claims th { padding: 0.08rem 0.6rem; }
p.meta, p.caption, p.empty, p.legend { color: #555; margin: 0.3rem 0; }
p.meta { font-size: 0.9rem; }
nav { font-size: 0.9rem; margin: 0.3rem 0 0.6rem; }
nav a { margin-right: 0.9rem; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-size: 0.85rem; font-variant-numeric: tabular-nums; }
th, td { padding: 0.2rem 0.6rem; border-bottom: 1px solid #e5e5e5; white-space: nowrap; }
th { background: #f3f3f3; position: sticky; top: 0; text-align: left; }
td.num, th.num { text-align: right; }
tbody tr:nth-child(even) { background: #fafafa; }
td.pos { color: #1b7837; } td.neg { color: #762a83; }
table[data-table] thead th { cursor: pointer; user-select: none; }
table[data-table] thead th[aria-sort="ascending"]::after { content: " ▲"; }
table[data-table] thead th[aria-sort="descending"]::after { content: " ▼"; }
.brief .more { display: none; }
input.every:checked + label + .scroll .more { display: table-cell; }
label { font-size: 0.85rem; color: #555; }
table.matrix { font-size: 0.85rem; margin: 0.3rem 0; }
table.matrix th { background: none; position: static; text-align: center; border: none; padding: 0.1rem 0.3rem; }
table.matrix th.workflow { text-align: right; padding-right: 0.6rem; }
table.matrix td { padding: 2px; border: none; }
table.matrix tbody tr { background: none; }
table.matrix td.task-edge, table.matrix th.task-edge { border-left: 2px solid #999; }
.square a { display: block; min-width: 7.2rem; border: 2px solid #ddd; text-decoration: none; color: inherit; }
.square a:hover { border-color: #333; }
.square span { display: block; padding: 0.05rem 0.4rem; text-align: right; }
.square span.label { float: left; color: inherit; opacity: 0.75; }
.square.cliff a { border-color: #000; border-width: 3px; }
.square span.cliff { background: #000; color: #fff; text-align: center; font-weight: 600; }
.square.same a { opacity: 0.55; border-style: dashed; }
.square.none a { color: #888; text-align: center; padding: 0.6rem 0.2rem; }
.scale-bar { display: inline-block; width: 9rem; height: 0.8rem; vertical-align: middle; border: 1px solid #ccc; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(36rem, 1fr)); gap: 0.8rem; }
article.card { border: 1px solid #ddd; border-radius: 4px; padding: 0.5rem 0.8rem; }
article.card.cliff { border: 2px solid #000; grid-column: 1 / -1; }
article.card .beside { display: flex; gap: 1rem; align-items: flex-start; flex-wrap: wrap; }
article.card table { font-size: 0.8rem; }
article.card th { background: none; position: static; color: #555; font-weight: normal; }
article.card tr:first-child td { font-weight: 600; }
figure { margin: 1.5rem 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9rem; }
"""

# Click (or Enter on) a header to sort by its column, again for the other way; missing values last.
SCRIPT = """
document.querySelectorAll("table[data-table]").forEach((table) => {
  const headers = Array.from(table.tHead.rows[0].cells);
  headers.forEach((th, index) => {
    th.tabIndex = 0;
    const sort = () => {
      const descending = th.getAttribute("aria-sort") === "ascending";
      headers.forEach((other) => other.removeAttribute("aria-sort"));
      th.setAttribute("aria-sort", descending ? "descending" : "ascending");
      const value = (row) => JSON.parse(row.cells[index].dataset.value);
      const rows = Array.from(table.tBodies[0].rows);
      rows.sort((a, b) => {
        const x = value(a), y = value(b);
        if (x === null || y === null) return (x === null) - (y === null);
        const order = typeof x === "number" && typeof y === "number" ? x - y
          : String(x).localeCompare(String(y), undefined, {numeric: true});
        return descending ? -order : order;
      });
      table.tBodies[0].append(...rows);
    };
    th.addEventListener("click", sort);
    th.addEventListener("keydown", (event) => {
      if (event.key === "Enter" || event.key === " ") { event.preventDefault(); sort(); }
    });
  });
});
"""
# Nothing may load from anywhere: images only from data: URIs, styles inline, the one script by its hash.
SCRIPT_HASH = base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
CSP = f"default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'sha256-{SCRIPT_HASH}'"

POSITIVE, NEGATIVE = (27, 120, 55), (118, 42, 131)  # green and purple: apart from the policy colours
POLICY_COLOURS = {"shared": "#0072B2", "isolated": "#D55E00"}  # as the plots draw them
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
        return f'<p class="empty omitted" data-table="{_attr(section.name)}">{_text(section.omitted)}</p>'
    if frame.empty:
        return f'<p class="empty" data-table="{_attr(section.name)}">{_text(section.empty)}</p>'
    records = json.loads(to_json(frame))
    brief = set(frame.columns if section.brief is None else section.brief)
    columns = [
        (c, is_numeric_column(frame, c), signed(section.name, frame, c), c not in brief) for c in frame.columns
    ]
    head = "".join(
        f'<th data-column="{_attr(c)}"{_classes(num=n, more=m)}>{_text(c)}</th>' for c, n, _, m in columns
    )
    rows = []
    for values, record in zip(frame.itertuples(index=False, name=None), records):
        cells = "".join(
            f'<td data-value="{_attr(json.dumps(record[c]))}"'
            f'{_classes(num=n, more=m, **_sign(v) if s else VERDICT_SIGNS.get(v, {}) if c == "verdict" else {})}>'
            f"{_text(value_text(v, c))}</td>"
            for (c, n, s, m), v in zip(columns, values)
        )
        rows.append(f"<tr>{cells}</tr>")
    more = sum(m for *_, m in columns)
    toggle = ""
    if more:
        box = f"every-{_attr(section.name)}"
        toggle = f'<input type="checkbox" class="every" id="{box}"><label for="{box}">every column ({more} more)</label>'
    return (
        f'{toggle}<div class="scroll{" brief" if more else ""}"><table data-table="{_attr(section.name)}">'
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


def image_html(name: str, png: bytes) -> str:
    """A ``<figure>`` with the PNG inline as a data: URI."""
    data = base64.b64encode(png).decode("ascii")
    return (
        f'<figure id="plot-{_attr(name)}"><img src="data:image/png;base64,{data}" alt="{_attr(name)}">'
        f"<figcaption>{_text(name)}.png</figcaption></figure>"
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
    nav = " ".join(f'<a href="#{_attr(anchor)}">{_text(name)}</a>' for anchor, name in toc)
    body = [f"<h1>{_text(title)}</h1>", f'<p class="meta">{_text(meta)}</p>', f"<nav>{nav}</nav>"]
    body.extend(_table_section(t) for t in leading)
    if matrix:
        body.append(matrix)
    for i, f in enumerate(figures):
        body.append(f'<section id="figures-{i}"><h2>{_text(f.title)}</h2>')
        if f.note:
            body.append(f'<p class="caption">{_text(f.note)}</p>')
        body.extend(image_html(name, png) for name, png in f.images.items())
        body.append("</section>")
    if cards:
        body.append(cards)
    body.extend(_table_section(t) for t in tables)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_attr(CSP)}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_text(title)}</title><style>{STYLE}</style></head>\n<body>\n"
        + "\n".join(body)
        + f"\n<script>{SCRIPT}</script>\n</body></html>\n"
    )


def _table_section(t: TableSection) -> str:
    caption = "".join(f'<p class="caption">{_text(line)}</p>' for line in t.caption.split("\n")) if t.caption and not t.omitted else ""
    return f'<section id="table-{_attr(t.name)}"><h2>{_text(t.title)}</h2>{caption}{table_html(t)}</section>'


# --- the matrix and the cells' cards --------------------------------------------------------


@dataclass
class Square:
    """One square of the matrix: the cells of one (workflow, task, scale, policy, extra values)
    over their seeds, with their summary rows (``rows``: those with a base evaluation)."""

    key: tuple
    axes: dict
    cells: list[str]
    rows: pd.DataFrame
    same_as: str | None = None  # the square whose runs these cells are (one-role workflows' isolated)
    images: dict[str, bytes] = field(default_factory=dict)

    @property
    def anchor(self) -> str:
        return "cell-" + _slug("-".join(spelled(v) for v in self.axes.values() if v is not None))

    @property
    def label(self) -> str:
        return " · ".join(_axis_label(a, v) for a, v in self.axes.items() if v is not None)

    def mean(self, column: str) -> float | None:
        values = [float(v) for v in self.rows[column] if not is_missing(v)]
        return sum(values) / len(values) if values else None


def squares_of(cells: pd.DataFrame, summary: pd.DataFrame, runs: Mapping[str, str]) -> dict[tuple, Square]:
    """The squares of ``cells`` (``cell`` + the axes, grid order), keyed by their axes but the seed.

    ``summary``: the summary table's rows (``cell``, ``peak``, ``gain``, ...); ``runs``:
    each cell's run id (``grid.run_ids``), to find the squares that are another's runs.
    """
    keys = ["workflow", "task", "scale", "policy", *extra_axes(cells.columns)]
    by_cell = summary.set_index("cell")
    squares = {}
    for key, group in grouped(cells, keys):
        ids = list(group["cell"])
        rows = by_cell.loc[[c for c in ids if c in by_cell.index]].reset_index()
        squares[key] = Square(key, dict(zip(keys, key)), ids, rows)
    run_square = {cell: square.key for square in squares.values() for cell in square.cells}
    for square in squares.values():
        home = {run_square.get(runs.get(cell, cell)) for cell in square.cells}
        if len(home) == 1 and (other := home.pop()) not in (None, square.key):
            square.same_as = squares[other].label
    return squares


def _colour(value: float | None, scale: float) -> tuple[str, str]:
    """Background and text colour for a gain: white at 0, full green (purple) at ±``scale``."""
    if value is None:
        return "#f3f3f3", "#888"
    t = min(abs(value) / scale, 1.0)
    end = POSITIVE if value > 0 else NEGATIVE
    rgb = tuple(round(255 + (e - 255) * t) for e in end)
    return "#%02x%02x%02x" % rgb, "#fff" if t > 0.55 else "#1a1a1a"


def _colour_scale(squares: Sequence[Square]) -> float:
    """The gain at full colour: the largest |gain| of the study, rounded up to 0.05 (at least 0.05)."""
    gains = [abs(v) for s in squares for v in (s.mean("peak_gain"), s.mean("gain")) if v is not None]
    return max(0.05, math.ceil(max(gains, default=0.0) / 0.05 - 1e-9) * 0.05)


def square_html(square: Square, full: float, edge: bool) -> str:
    """One ``<td class="square">``: peak and final gain (full colour at ±``full``), the cliff mark,
    a link to its card."""
    edge_class = " task-edge" if edge else ""
    if square.rows.empty:
        return (
            f'<td class="square none{edge_class}" data-square="{_attr(square.anchor)}">'
            f'<a href="#{_attr(square.anchor)}">no results yet</a></td>'
        )
    n = len(square.rows)
    cliffs = int(square.rows["cliff"].astype(bool).sum())
    seeds = f"mean of {n} seeds" if n > 1 else f"seed {square.rows['seed'].iloc[0]}"
    tip = [f"{square.label} ({seeds})"]
    parts = []
    for name, column in (("peak", "peak_gain"), ("final", "gain")):
        value = square.mean(column)
        background, colour = _colour(value, full)
        text = "—" if value is None else f"{value:+.3f}"
        parts.append(
            f'<span class="{name}" style="background:{background};color:{colour}" data-value="{_attr(json.dumps(value))}">'
            f'<span class="label">{name}</span>{text}</span>'
        )
        tip.append(f"{name} − base: {text}")
    classes = "square"
    if cliffs:
        classes += " cliff"
        onsets = sorted({int(v) for v in square.rows["cliff_onset"] if not is_missing(v)})
        mark = f"cliff {cliffs}/{n}" if n > 1 else f"cliff @{onsets[0]}" if onsets else "cliff"
        parts.append(f'<span class="cliff">▼ {mark}</span>')
        tip.append(f"terminal cliff in {cliffs} of {n} seed(s), onset {', '.join(map(str, onsets))}")
    if square.same_as:
        classes += " same"
        tip.append(f"one role: the same runs as {square.same_as}")
    return (
        f'<td class="{classes}{edge_class}" data-square="{_attr(square.anchor)}">'
        f'<a href="#{_attr(square.anchor)}" title="{_attr("; ".join(tip))}">{"".join(parts)}</a></td>'
    )


def matrix_html(cells: pd.DataFrame, squares: Mapping[tuple, Square], n_seeds: int) -> str:
    """The study as matrices (one per combination of extra-axis values): a row per workflow,
    a column per task × scale × policy (shared beside isolated)."""
    extra = extra_axes(cells.columns)
    workflows, tasks, scales, policies = (list(dict.fromkeys(cells[a])) for a in ("workflow", "task", "scale", "policy"))
    full = _colour_scale(list(squares.values()))
    columns = [(s, p) for s in scales for p in policies]  # under each task
    head = (
        '<thead><tr><th rowspan="3"></th>'
        + "".join(f'<th colspan="{len(columns)}" class="task-edge">{_text(t)}</th>' for t in tasks)
        + "</tr><tr>"
        + "".join(
            f'<th colspan="{len(policies)}"{_classes(**{"task-edge": i == 0})}>{_text(s)}</th>'
            for _ in tasks for i, s in enumerate(scales)
        )
        + "</tr><tr>"
        + "".join(
            f'<th{_classes(**{"task-edge": i == 0})} style="color:{POLICY_COLOURS.get(p, "#333")}">{_text(p)}</th>'
            for _ in tasks for i, (_, p) in enumerate(columns)
        )
        + "</tr></thead>"
    )
    combos = [()]
    for axis in extra:
        combos = [(*c, v) for c in combos for v in dict.fromkeys(v for v in cells[axis] if v is not None)]
    blocks = []
    for combo in combos:
        rows = []
        for workflow in workflows:
            tds = []
            for task in tasks:
                for i, (scale, policy) in enumerate(columns):
                    square = _square_at(squares, (workflow, task, scale, policy), combo)
                    tds.append(square_html(square, full, i == 0) if square else '<td class="square"></td>')
            rows.append(f'<tr><th class="workflow">{_text(workflow)}</th>{"".join(tds)}</tr>')
        caption = ", ".join(_axis_label(a, v) for a, v in zip(extra, combo))
        blocks.append(
            (f"<h3>{_text(caption)}</h3>" if caption else "")
            + f'<table class="matrix" data-matrix="{_attr(caption)}">{head}<tbody>{"".join(rows)}</tbody></table>'
        )
    over = f"mean over {n_seeds} seeds" if n_seeds > 1 else "one seed"
    same = any(s.same_as for s in squares.values())
    legend = (
        f'<p class="legend">Each square: peak − base and final − base (the gain) of one cell, {over}; '
        f'<span class="scale-bar" style="background:linear-gradient(to right, {_colour(-full, full)[0]}, #fff, '
        f'{_colour(full, full)[0]})"></span> −{full:.2f} … +{full:.2f}; ▼ a terminal cliff (its onset step); '
        + ("dashed: a one-role workflow's isolated cell, the same runs as its shared one. " if same else "")
        + "A square links to its cell's curve and numbers below.</p>"
    )
    return f'<section id="matrix">{"".join(blocks)}{legend}</section>'


def _square_at(squares: Mapping[tuple, Square], fixed: tuple, combo: tuple) -> Square | None:
    """The square of the fixed axes ``fixed`` (but the seed) whose extra-axis values are ``combo``,
    or that the extra axes leave alone (None)."""
    for key, square in squares.items():
        if key[:4] == fixed and all(mine is None or mine == want for mine, want in zip(key[4:], combo)):
            return square
    return None


def curve_svg(square: Square, evals: pd.DataFrame, y_range: tuple[float, float], x_max: int) -> str:
    """The square's accuracy curves (one line per seed, in its policy's colour) as inline SVG on
    the accuracy scale ``y_range``: the base dotted, each seed's peak a circle, its cliff onset dashed."""
    width, height, left, bottom = 300, 120, 34, 18
    colour = POLICY_COLOURS.get(square.axes["policy"], "#333")
    y_low, y_high = y_range

    def x(step) -> float:
        return left + (width - left - 6) * float(step) / max(x_max, 1)

    def y(value) -> float:
        return (height - bottom) - (height - bottom - 6) * (float(value) - y_low) / (y_high - y_low)

    parts = [
        f'<line x1="{left}" y1="{y(y_low):.1f}" x2="{width - 4}" y2="{y(y_low):.1f}" stroke="#999"/>',
        f'<line x1="{left}" y1="{y(y_low):.1f}" x2="{left}" y2="4" stroke="#999"/>',
        f'<text x="{left - 4}" y="{y(y_high) + 4:.1f}" text-anchor="end">{y_high:.2f}</text>',
        f'<text x="{left - 4}" y="{y(y_low) + 4:.1f}" text-anchor="end">{y_low:.2f}</text>',
        f'<text x="{left}" y="{height - 4}">0</text>',
        f'<text x="{x(x_max):.1f}" y="{height - 4}" text-anchor="end">step {x_max}</text>',
    ]
    for cell in square.cells:
        curve = evals[evals["cell"] == cell].sort_values("step")
        if curve.empty:
            continue
        points = " ".join(f"{x(s):.1f},{y(a):.1f}" for s, a in zip(curve["step"], curve["accuracy"]))
        parts.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"/>')
        row = square.rows[square.rows["cell"] == cell]
        if row.empty:
            continue
        row = row.iloc[0]
        parts.append(
            f'<line x1="{left}" y1="{y(row["base"]):.1f}" x2="{width - 4}" y2="{y(row["base"]):.1f}" '
            f'stroke="{colour}" stroke-dasharray="2 3" stroke-width="1"/>'
        )
        parts.append(f'<circle cx="{x(row["peak_step"]):.1f}" cy="{y(row["peak"]):.1f}" r="3.5" fill="{colour}"/>')
        if bool(row["cliff"]) and not is_missing(row["cliff_onset"]):
            parts.append(
                f'<line x1="{x(row["cliff_onset"]):.1f}" y1="4" x2="{x(row["cliff_onset"]):.1f}" y2="{y(y_low):.1f}" '
                'stroke="#000" stroke-dasharray="5 3" stroke-width="1.5"/>'
            )
    return (
        f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-size="10" fill="#555" '
        f'role="img" aria-label="accuracy of {_attr(square.label)} by training step">{"".join(parts)}</svg>'
    )


def card_rows(square: Square, diagnostics: pd.DataFrame, mechanism: pd.DataFrame) -> list[tuple[str, list[str]]]:
    """The numbers of a card, a row per figure and a column per seed: ``[(figure, texts)]``."""
    from matrixrl.report.columns import joined_columns

    joined = joined_columns(list(square.rows.columns))
    rows: dict[str, list[str]] = {}
    for _, row in square.rows.iterrows():
        d = diagnostics.loc[row["cell"]] if row["cell"] in diagnostics.index else None
        m = mechanism.loc[row["cell"]] if row["cell"] in mechanism.index else None
        texts = {
            "seed": value_text(row["seed"], "seed"),
            "base": value_text(row["base"], "base"),
            "peak@step": joined["peak@step"].text(row["peak"], row["peak_step"]),
            "final": value_text(row["final"], "final"),
            "gain": value_text(row["gain"], "gain"),
            "cliff@onset": joined["cliff@onset"].text(row["cliff"], row["cliff_onset"]),
            "dominant (share)": _role_and(d, "dominant_role", "dominant_share"),
            "amplified (mean)": _role_and(d, "amplified_role", "amplification_mean"),
            "mechanism": "—" if m is None else value_text(m["verdict"], "verdict"),
        }
        for name, text in texts.items():
            rows.setdefault(name, []).append(text)
    return list(rows.items())


def _role_and(row, role: str, figure: str) -> str:
    if row is None or is_missing(row[role]):
        return "—"
    return f"{row[role]} ({value_text(row[figure], figure)})"


def cards_html(
    squares: Mapping[tuple, Square],
    evals: pd.DataFrame,
    diagnostics: pd.DataFrame,
    mechanism: pd.DataFrame,
    on_page: Sequence[str] = ("summary", "diagnostics", "mechanism"),
) -> str:
    """A card per square (``id`` its anchor): its curve beside its seeds' numbers (summary,
    diagnostics, mechanism), links to its task's curves and to those of the tables that are
    ``on_page``, and the gradient diagnostics plot of each of its cells that ends in a terminal cliff."""
    low, high = (float(evals["accuracy"].min()), float(evals["accuracy"].max())) if not evals.empty else (0.0, 1.0)
    # One accuracy scale for every card, so that their curves compare; 0.05 steps around the study's range.
    y_range = (max(0.0, math.floor(low / 0.05) * 0.05 - 0.05), math.ceil(high / 0.05) * 0.05 + 0.05)
    x_max = int(evals["step"].max()) if not evals.empty else 1
    diagnostics = diagnostics.set_index("cell") if "cell" in diagnostics.columns else pd.DataFrame()
    mechanism = mechanism.set_index("cell") if "cell" in mechanism.columns else pd.DataFrame()
    cards = []
    for square in squares.values():
        classes = "card cliff" if square.images else "card"
        head = f"<h3>{_text(square.label)}</h3>"
        if square.same_as:
            head += f'<p class="caption">One role: the same runs as {_text(square.same_as)}.</p>'
        if square.rows.empty:
            cards.append(f'<article class="{classes}" id="{_attr(square.anchor)}">{head}<p class="empty">No evaluations stored yet.</p></article>')
            continue
        body = "".join(
            f"<tr><th>{_text(name)}</th>"
            + "".join(f"<td{_classes(num=name != 'seed', **(_text_sign(t) if name == 'gain' else {}))}>{_text(t)}</td>" for t in texts)
            + "</tr>"
            for name, texts in card_rows(square, diagnostics, mechanism)
        )
        task = square.axes["task"]
        links = " · ".join(
            [f'<a href="#plot-curves-{_attr(task)}">all {_text(task)} curves</a>']
            + [f'<a href="#table-{name}">{name}</a>' for name in ("summary", "diagnostics", "mechanism") if name in on_page]
        )
        links = f'<p class="caption">{links}</p>'
        figures = "".join(image_html(name, png) for name, png in square.images.items())
        cards.append(
            f'<article class="{classes}" id="{_attr(square.anchor)}">{head}<div class="beside">'
            f"{curve_svg(square, evals, y_range, x_max)}<table>{body}</table></div>"
            f"{links}{figures}</article>"
        )
    note = (
        '<p class="caption">Per cell: accuracy by training step on one scale for all cells (a line per seed; '
        "dotted: its base, circle: its peak, dashed black: its cliff onset), each seed's numbers, and the gradient "
        "diagnostics of a cell that ends in a terminal cliff.</p>"
    )
    return f'<section id="cells"><h2>Cells</h2>{note}<div class="cards">{"".join(cards)}</div></section>'


# --- the page of a study ----------------------------------------------------------------------


def build_report(
    config: Config,
    selected: Config | None = None,
    group_by: str | None = None,
) -> tuple[str, dict[str, bytes]]:
    """The HTML page of ``config``'s study and the PNGs it embeds (``{name: bytes}``).

    Ingests new result files first. ``selected`` is the config narrowed by
    ``--only`` (rows and plots of its cells; comparisons still take their controls
    from ``config``'s whole grid). Plots: the learning curves of every task, and the
    gradient diagnostics of every cell that ends in a terminal cliff (the cells the
    mechanism table asks about). Raises ``ConfigError`` when nothing is stored yet.
    """
    from matrixrl import grid as G
    from matrixrl.layout import store_path
    from matrixrl.report.columns import shown
    from matrixrl.report.rows import current_specs, grid_cells, stored_rows
    from matrixrl.report.tables import TABLES, build_tables, parse_group_by, selection
    from matrixrl.store import ingest_for_report

    axes = parse_group_by(group_by, list(config.grid.sweeps))
    shown_config = selected or config
    ingest_for_report(config.results_dir)  # one-line errors when there is nothing yet
    current = current_specs(shown_config)
    evals = stored_rows(shown_config, "evaluations", current)
    if evals.empty:
        raise ConfigError(f"{Path(config.results_dir)}: no evaluations stored for the cells of this grid; run `matrixrl run` first")
    cells = grid_cells(shown_config).drop(columns="run")
    only = selection(selected)
    # --group-by sorts the tables that have those axes; the others (seeds aggregates over seed) keep their order.
    # The tables the page shows: those of the registry that say so (the summary, diagnostics and
    # mechanism tables always: the matrix and the cards read them).
    names = [name for name, table in TABLES.items() if table.page or name in ("summary", "diagnostics", "mechanism")]
    grouped_names = [name for name in names if not axes or TABLES[name].axes and set(axes) <= {*TABLES[name].axes, *config.grid.sweeps}]
    frames = build_tables(store_path(config.results_dir), config, grouped_names, axes or None, only=only) if grouped_names else {}
    rest = [name for name in names if name not in grouped_names]
    frames |= build_tables(store_path(config.results_dir), config, rest, only=only) if rest else {}
    frames = {name: frames[name] for name in names}

    runs = G.run_ids(selected or config)
    # Workflows whose isolated cells are their shared runs (one role).
    repeats = {cell.workflow for cell in G.cells(selected or config) if runs[cell.id] != cell.id}
    n_seeds = len((selected or config).grid.seed)
    tables = [_section(name, frames[name], TABLES[name], repeats, n_seeds, shown) for name in names if TABLES[name].page]
    # A table with no rows for this study (memory without a memory axis, diagnostics before any
    # are stored) is left out, with its links: an empty section says only what the study is not.
    tables = [table for table in tables if not table.frame.empty]

    # Cells whose curve ends in a terminal cliff and that have diagnostics, in grid order.
    with_cliff = set(frames["summary"].loc[frames["summary"]["cliff"], "cell"]) & set(frames["diagnostics"]["cell"])
    pngs = report_pngs(shown_config, cells, evals, [c for c in cells["cell"] if c in with_cliff], current)
    curves = {name: png for name, png in pngs.items() if name.startswith("curves-")}

    summary = frames["summary"].assign(peak_gain=frames["summary"]["peak"] - frames["summary"]["base"])
    squares = squares_of(cells, summary, runs)
    for square in squares.values():
        square.images = {f"diagnostics-{c}": pngs[f"diagnostics-{c}"] for c in square.cells if f"diagnostics-{c}" in pngs}
    sections = [
        FigureSection(
            "Learning curves",
            curves,
            "One panel per workflow and scale; line: mean over seeds, band: min–max over seeds, "
            "triangles: each seed's peak, dashed lines: each seed's cliff onset.",
        )
    ]
    n_cells = len(cells)
    cliffs = int(frames["summary"]["cliff"].astype(bool).sum()) if not frames["summary"].empty else 0
    meta = (
        f"{n_cells} cells of {Path(config.results_dir)}; {cliffs} with a terminal cliff (a drop of at least "
        f"{config.analysis.cliff_delta} below the peak and more than {config.analysis.cliff_noise_se} standard "
        "errors of the evaluation, to the end)."
    )
    page = report_page(
        "matrixrl report",
        meta,
        tables,
        sections,
        matrix=matrix_html(cells, squares, n_seeds),
        cards=cards_html(squares, evals, frames["diagnostics"], frames["mechanism"], [t.name for t in tables]),
    )
    return page, pngs


def report_pngs(
    config: Config, cells: pd.DataFrame, evals: pd.DataFrame, cliff_cells: Sequence[str], current: Mapping[str, tuple[str, str]]
) -> dict[str, bytes]:
    """The page's plots as PNGs: the learning curves of every task, then the gradient
    diagnostics of each of ``cliff_cells``, as ``study_figures`` draws them.

    Each is kept in the store under a cache key of what it is drawn from (the digests of
    its cells' results, the grid's cells, the thresholds, the drawing code and the
    versions of matplotlib and Pillow) and drawn again only when that changes: drawing
    is most of the time of a page, and after a new evaluation only its task's curves
    change. ``cells`` (grid order) and ``evals`` as in ``plots.Study``; ``current``:
    ``rows.current_specs`` of ``config``.
    """
    from matrixrl import grid as G
    from matrixrl.layout import store_path
    from matrixrl.report.plots import curves_name, diagnostics_name, drawing_version
    from matrixrl.store import Store, repairing

    runs = G.run_ids(config)
    drawn_from = {
        "drawing": drawing_version(),
        "analysis": config.analysis.model_dump(),
        # Line styles follow every cell of the grid, so each task's figure depends on them all.
        "cells": [[repr(v) for v in row] for row in cells.itertuples(index=False, name=None)],
    }
    tasks = list(dict.fromkeys(cells["task"]))
    db_file = store_path(config.results_dir)

    def key(kind: str, name: str, of: Sequence[str], inputs: Mapping[str, str]) -> str:
        what = {**drawn_from, "kind": kind, "name": name, "inputs": [(c, runs[c], inputs.get(runs[c])) for c in of]}
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()

    def cached() -> tuple[dict[str, str], dict[str, tuple[str, bytes]]]:
        with Store(db_file) as store:
            inputs = store.input_keys(sorted(set(runs.values())), current)
            wanted = {curves_name(t): key("curves", t, list(cells.loc[cells["task"] == t, "cell"]), inputs) for t in tasks}
            wanted |= {diagnostics_name(c): key("diagnostics", c, [c], inputs) for c in cliff_cells}
            return wanted, store.cached_figures(list(wanted))

    wanted, found = repairing(db_file, cached)
    stale = [name for name, cache_key in wanted.items() if found.get(name, (None,))[0] != cache_key]
    drawn = _draw(config, cells, evals, [t for t in tasks if curves_name(t) in stale],
                  [c for c in cliff_cells if diagnostics_name(c) in stale], runs, current) if stale else {}  # fmt: skip
    if drawn:
        with Store(db_file) as store:
            store.save_figures({name: (wanted[name], png) for name, png in drawn.items()})
    return {name: drawn[name] if name in drawn else found[name][1] for name in wanted}


def _draw(
    config: Config, cells: pd.DataFrame, evals: pd.DataFrame, tasks: Sequence[str], cliff_cells: Sequence[str],
    runs: Mapping[str, str], current: Mapping[str, tuple[str, str]],
) -> dict[str, bytes]:
    """The PNGs of the curves of ``tasks`` and the diagnostics of ``cliff_cells`` (``study_figures``'
    figures), reading the diagnostics of those cells only."""
    from matrixrl.analysis.cell import rows_of_cells
    from matrixrl.layout import store_path
    from matrixrl.report.plots import diagnostics_figure, diagnostics_name, learning_curve_figures, png_bytes
    from matrixrl.report.rows import current_trainings
    from matrixrl.store import Store, repairing

    figures = learning_curve_figures(cells, evals, config.analysis, tasks=tasks) if tasks else {}
    if cliff_cells:
        wanted = {cell: runs[cell] for cell in cliff_cells}

        def read() -> pd.DataFrame:
            with Store(store_path(config.results_dir)) as store:
                ids = sorted(set(wanted.values()))
                frame = current_trainings(store.rows("diagnostics", ids), store.rows("cells", ids), current)
            return rows_of_cells(frame.drop(columns="id"), wanted).reset_index(drop=True)

        diagnostics = repairing(store_path(config.results_dir), read)
        for cell in cliff_cells:
            figures[diagnostics_name(cell)] = diagnostics_figure(cell, diagnostics, evals, config.analysis)
    return {name: png_bytes(fig) for name, fig in figures.items()}


def _section(name: str, frame: pd.DataFrame, spec, repeats: set[str], n_seeds: int, shown) -> TableSection:
    """The page's section of table ``name``: without the isolated rows of the workflows in
    ``repeats`` (they repeat the shared runs), or left out with the reason where it says
    nothing for this study (one seed: no interval across seeds)."""
    caption = frame.attrs.get("caption")
    omitted = None
    per_mode = name != "compare" and {"workflow", "policy"} <= set(frame.columns)
    repeated = frame["workflow"].isin(repeats) & (frame["policy"] == "isolated") if per_mode else None
    if repeated is not None and repeated.any():
        frame = frame[~repeated]
        note = (
            f"{', '.join(sorted(repeats))}: one role, so isolated is the same computation as shared; its isolated "
            "rows, which would repeat the shared ones, are left out (the matrix shows both)."
        )
        # The summary's own caption says they repeat: this one says where they went instead.
        caption = note if name == "summary" or not caption else f"{caption}\n{note}"
    if name == "seeds" and n_seeds == 1 and not frame.empty:
        omitted = (
            "Left out: every cell has one seed, so there is no interval and each row would repeat the summary. "
            "List more seeds in grid.seed for it."
        )
    frame = frame.drop(columns="cell", errors="ignore").reset_index(drop=True)
    brief = list(shown(name, frame, "default", "csv").frame.columns) if not frame.empty else None
    return TableSection(
        name,
        spec.title,
        frame,
        caption=caption,
        empty=f"No rows: this table needs {spec.needs} of the matching cells.",
        brief=brief,
        omitted=omitted,
        first=spec.first,
    )


def write_report(
    config: Config, selected: Config | None, group_by: str | None, html: Path | None, plots_dir: Path | None
) -> list[Path]:
    """Build the page and its plots, then write them atomically (plots first, the page
    last): ``html`` the page, ``plots_dir`` the PNGs; either may be None. Returns the paths."""
    from matrixrl.report.plots import check_out_dir

    target = html.resolve() if html is not None else None  # through a symbolic link, its target
    if html is not None:
        if html.is_dir():
            raise ConfigError(f"--html {html}: is a folder; pass a file name such as report.html")
        if html.exists() and not target.is_file():
            raise ConfigError(f"--html {html}: is not a regular file; pass a file name such as report.html")
        if plots_dir is not None and target == plots_dir.resolve():
            raise ConfigError(f"--html and --plots both name {html}; give the page a file name of its own")
    if plots_dir is not None:
        check_out_dir(plots_dir, "--plots")
    page, pngs = build_report(config, selected, group_by)
    written = []
    if plots_dir is not None:
        with output_named("--plots", plots_dir):
            for name, png in pngs.items():
                written.append(plots_dir / f"{name}.png")
                atomic.write_bytes(written[-1], png)
    if html is not None:
        with output_named("--html", html):
            atomic.write_text(target, page)
        written.append(html)
    return written


def _axis_label(axis: str, value) -> str:
    return spelled(value) if "." not in axis else f"{axis}={spelled(value)}"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text)


def _sign(value) -> dict:
    if is_missing(value) or isinstance(value, bool) or not isinstance(value, numbers.Real) or value == 0:
        return {}
    return {"pos": value > 0, "neg": value < 0}


def _text_sign(text: str) -> dict:
    """The sign classes of a number shown as ``text`` (``-0.029``: neg)."""
    try:
        return _sign(float(text))
    except ValueError:
        return {}


def _classes(**flags: bool) -> str:
    names = [name for name, on in flags.items() if on]
    return f' class="{" ".join(names)}"' if names else ""


def _text(value: str) -> str:
    return html.escape(str(value), quote=False)


def _attr(value: str) -> str:
    return html.escape(str(value), quote=True)
