"""The study as a matrix of squares (a cell over its seeds), and each square's card."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd

from matrixrl.analysis.axes import extra_axes, grouped
from matrixrl.config.sweeps import spelled
from matrixrl.report.formats import is_missing, value_text
from matrixrl.report.html.assets import NEGATIVE, POLICY_COLOURS, POSITIVE
from matrixrl.report.html.page import class_attr, escape_attr, escape_text, image_html, sign_of


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
    """One ``<td class="square">``: peak and final gain (full colour at ±``full``), the cliff or
    collapse mark, a link to its card."""
    edge_class = " task-edge" if edge else ""
    if square.rows.empty:
        return (
            f'<td class="square none{edge_class}" data-square="{escape_attr(square.anchor)}">'
            f'<a href="#{escape_attr(square.anchor)}">no results yet</a></td>'
        )
    n = len(square.rows)
    cliffs = int(square.rows["cliff"].astype(bool).sum())
    collapses = _collapses(square)
    seeds = f"mean of {n} seeds" if n > 1 else f"seed {square.rows['seed'].iloc[0]}"
    tip = [f"{square.label} ({seeds})"]
    parts = []
    for name, column in (("peak", "peak_gain"), ("final", "gain")):
        value = square.mean(column)
        background, colour = _colour(value, full)
        text = "—" if value is None else f"{value:+.3f}"
        parts.append(
            f'<span class="{name}" style="background:{background};color:{colour}" data-value="{escape_attr(json.dumps(value))}">'
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
    if collapses:
        classes += " collapse"
        parts.append(f'<span class="collapse">▽ {f"collapse {collapses}/{n}" if n > 1 else "collapse"}</span>')
        tip.append(f"collapse (fell far below its base, with no real peak) in {collapses} of {n} seed(s)")
    if square.same_as:
        classes += " same"
        tip.append(f"one role: the same runs as {square.same_as}")
    return (
        f'<td class="{classes}{edge_class}" data-square="{escape_attr(square.anchor)}">'
        f'<a href="#{escape_attr(square.anchor)}" title="{escape_attr("; ".join(tip))}">{"".join(parts)}</a></td>'
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
        + "".join(f'<th colspan="{len(columns)}" class="task-edge">{escape_text(t)}</th>' for t in tasks)
        + "</tr><tr>"
        + "".join(
            f'<th colspan="{len(policies)}"{class_attr(**{"task-edge": i == 0})}>{escape_text(s)}</th>'
            for _ in tasks for i, s in enumerate(scales)
        )
        + "</tr><tr>"
        + "".join(
            f'<th{class_attr(**{"task-edge": i == 0})} style="color:{POLICY_COLOURS.get(p, "#333")}">{escape_text(p)}</th>'
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
            rows.append(f'<tr><th class="workflow">{escape_text(workflow)}</th>{"".join(tds)}</tr>')
        caption = ", ".join(_axis_label(a, v) for a, v in zip(extra, combo))
        blocks.append(
            (f"<h3>{escape_text(caption)}</h3>" if caption else "")
            + f'<table class="matrix" data-matrix="{escape_attr(caption)}">{head}<tbody>{"".join(rows)}</tbody></table>'
        )
    over = f"mean over {n_seeds} seeds" if n_seeds > 1 else "one seed"
    same = any(s.same_as for s in squares.values())
    collapsed = any(_collapses(s) for s in squares.values())
    legend = (
        f'<p class="legend">Each square: peak − base and final − base (the gain) of one cell, {over}; '
        f'<span class="scale-bar" style="background:linear-gradient(to right, {_colour(-full, full)[0]}, #fff, '
        f'{_colour(full, full)[0]})"></span> −{full:.2f} … +{full:.2f}; ▼ a terminal cliff (its onset step); '
        + ("▽ a collapse: far below its base, with no real peak before; " if collapsed else "")
        + ("dashed: a one-role workflow's isolated cell, the same runs as its shared one. " if same else "")
        + "A square links to its cell's curve and numbers below.</p>"
    )
    return f'<section id="matrix">{"".join(blocks)}{legend}</section>'


def _collapses(square: Square) -> int:
    """The square's seeds whose run collapsed (``signature``; rows built without one have none)."""
    if square.rows.empty or "signature" not in square.rows.columns:
        return 0
    return int((square.rows["signature"] == "collapse").sum())


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
        f'role="img" aria-label="accuracy of {escape_attr(square.label)} by training step">{"".join(parts)}</svg>'
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
            "signature": value_text(row.get("signature"), "signature"),
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
        head = f"<h3>{escape_text(square.label)}</h3>"
        if square.same_as:
            head += f'<p class="caption">One role: the same runs as {escape_text(square.same_as)}.</p>'
        if square.rows.empty:
            cards.append(f'<article class="{classes}" id="{escape_attr(square.anchor)}">{head}<p class="empty">No evaluations stored yet.</p></article>')
            continue
        body = "".join(
            f"<tr><th>{escape_text(name)}</th>"
            + "".join(f"<td{class_attr(num=name != 'seed', **(_text_sign(t) if name == 'gain' else {}))}>{escape_text(t)}</td>" for t in texts)
            + "</tr>"
            for name, texts in card_rows(square, diagnostics, mechanism)
        )
        task = square.axes["task"]
        links = " · ".join(
            [f'<a href="#plot-curves-{escape_attr(task)}">all {escape_text(task)} curves</a>']
            + [f'<a href="#table-{name}">{name}</a>' for name in ("summary", "diagnostics", "mechanism") if name in on_page]
        )
        links = f'<p class="caption">{links}</p>'
        figures = "".join(image_html(name, png) for name, png in square.images.items())
        cards.append(
            f'<article class="{classes}" id="{escape_attr(square.anchor)}">{head}<div class="beside">'
            f"{curve_svg(square, evals, y_range, x_max)}<table>{body}</table></div>"
            f"{links}{figures}</article>"
        )
    note = (
        '<p class="caption">Per cell: accuracy by training step on one scale for all cells (a line per seed; '
        "dotted: its base, circle: its peak, dashed black: its cliff onset), each seed's numbers, and the gradient "
        "diagnostics of a cell that ends in a terminal cliff.</p>"
    )
    return f'<section id="cells"><h2>Cells</h2>{note}<div class="cards">{"".join(cards)}</div></section>'


def _axis_label(axis: str, value) -> str:
    return spelled(value) if "." not in axis else f"{axis}={spelled(value)}"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text)


def _text_sign(text: str) -> dict:
    """The sign classes of a number shown as ``text`` (``-0.029``: neg)."""
    try:
        return sign_of(float(text))
    except ValueError:
        return {}
