"""One self-contained HTML page with every report table and plot (``matrixrl report --html``).

The page makes no request of its own: CSS is inline, every plot is a PNG in a
``data:`` URI, and a Content-Security-Policy forbids anything else, so it can be
opened from disk or mailed as one file.

Tables hold the same numbers as ``matrixrl report --format json``: each cell shows
the reading text of ``--format table`` (3 decimals, yes/no, —) and carries the
exact JSON value in ``data-value``, taken from the very JSON that ``--format json``
prints for that table.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from matrixrl import atomic
from matrixrl.config import Config
from matrixrl.errors import ConfigError
from matrixrl.report.formats import cell_text, is_numeric_column, to_json

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 80rem;
       padding: 0 1rem; color: #1a1a1a; line-height: 1.4; }
h1 { font-size: 1.6rem; margin-bottom: 0.2rem; }
h2 { font-size: 1.25rem; margin-top: 2.5rem; border-bottom: 1px solid #ddd; padding-bottom: 0.2rem; }
h3 { font-size: 1.05rem; margin-top: 1.5rem; }
p.meta, p.caption, p.empty { color: #555; }
nav ul { columns: 2; padding-left: 1.2rem; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-size: 0.85rem; font-variant-numeric: tabular-nums; }
th, td { padding: 0.2rem 0.6rem; border-bottom: 1px solid #e5e5e5; white-space: nowrap; }
th { background: #f3f3f3; position: sticky; top: 0; text-align: left; }
td.num, th.num { text-align: right; }
tbody tr:nth-child(even) { background: #fafafa; }
figure { margin: 1.5rem 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9rem; }
"""
# Nothing may load from anywhere: images only from data: URIs, styles only inline.
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


@dataclass(frozen=True)
class TableSection:
    """One table of the page: ``frame`` is what ``--format json`` prints for it."""

    name: str
    title: str
    frame: pd.DataFrame
    caption: str | None = None
    empty: str = "no rows"


@dataclass(frozen=True)
class FigureSection:
    """A group of plots: ``images`` maps a plot's name (its PNG's file stem) to its PNG bytes."""

    title: str
    images: Mapping[str, bytes]
    note: str | None = None


def table_html(section: TableSection) -> str:
    """``<table data-table=NAME>``: header cells carry ``data-column``, body cells ``data-value`` (JSON)."""
    frame = section.frame
    if frame.empty:
        return f'<p class="empty" data-table="{_attr(section.name)}">{_text(section.empty)}</p>'
    records = json.loads(to_json(frame))
    numeric = [is_numeric_column(frame, c) for c in frame.columns]
    head = "".join(
        f'<th data-column="{_attr(c)}"{_num(n)}>{_text(c)}</th>' for c, n in zip(frame.columns, numeric)
    )
    rows = []
    for values, record in zip(frame.itertuples(index=False, name=None), records):
        cells = "".join(
            f'<td data-value="{_attr(json.dumps(record[c]))}"{_num(n)}>{_text(cell_text(v))}</td>'
            for c, v, n in zip(frame.columns, values, numeric)
        )
        rows.append(f"<tr>{cells}</tr>")
    return (
        f'<div class="scroll"><table data-table="{_attr(section.name)}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def image_html(name: str, png: bytes) -> str:
    """A ``<figure>`` with the PNG inline as a data: URI."""
    data = base64.b64encode(png).decode("ascii")
    return (
        f'<figure id="plot-{_attr(name)}"><img src="data:image/png;base64,{data}" alt="{_attr(name)}">'
        f"<figcaption>{_text(name)}.png</figcaption></figure>"
    )


def report_page(title: str, meta: str, tables: Sequence[TableSection], figures: Sequence[FigureSection]) -> str:
    """The whole page as text."""
    toc = [f'<li><a href="#table-{_attr(t.name)}">{_text(t.title)}</a></li>' for t in tables]
    toc += [f'<li><a href="#figures-{i}">{_text(f.title)}</a></li>' for i, f in enumerate(figures)]
    body = [f"<h1>{_text(title)}</h1>", f'<p class="meta">{_text(meta)}</p>', f"<nav><ul>{''.join(toc)}</ul></nav>"]
    for t in tables:
        body.append(f'<section id="table-{_attr(t.name)}"><h2>{_text(t.title)}</h2>')
        if t.caption:
            body.append(f'<p class="caption">{_text(t.caption)}</p>')
        body.append(table_html(t) + "</section>")
    for i, f in enumerate(figures):
        body.append(f'<section id="figures-{i}"><h2>{_text(f.title)}</h2>')
        if f.note:
            body.append(f'<p class="caption">{_text(f.note)}</p>')
        body.extend(image_html(name, png) for name, png in f.images.items())
        body.append("</section>")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_attr(CSP)}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_text(title)}</title><style>{STYLE}</style></head>\n<body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


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
    from matrixrl.report.plots import cliff_cells, load_study, png_bytes, study_figures
    from matrixrl.report.tables import TABLES, build_tables, parse_group_by, selection
    from matrixrl.layout import store_path

    axes = parse_group_by(group_by, list(config.grid.sweeps))
    study = load_study(selected or config)  # ingests; one-line errors when there is nothing yet
    only = selection(selected)
    # --group-by sorts the tables that have those axes; the others (seeds aggregates over seed) keep their order.
    grouped = [name for name in TABLES if set(axes) <= {*TABLES[name].axes, *config.grid.sweeps}]
    frames = build_tables(store_path(config.results_dir), config, grouped, axes or None, only=only) if grouped else {}
    rest = [name for name in TABLES if name not in grouped]
    frames |= build_tables(store_path(config.results_dir), config, rest, only=only) if rest else {}
    frames = {name: frames[name] for name in TABLES}
    tables = [
        TableSection(
            name,
            TABLES[name].title,
            frame.drop(columns="cell", errors="ignore"),
            caption=frame.attrs.get("caption"),
            empty=f"No rows: this table needs {TABLES[name].needs} of the matching cells.",
        )
        for name, frame in frames.items()
    ]
    with_cliff = cliff_cells(study)
    figures = study_figures(study, with_cliff)
    pngs = {name: png_bytes(fig) for name, fig in figures.items()}
    curves = {name: png for name, png in pngs.items() if name.startswith("curves-")}
    diagnostics = {name: png for name, png in pngs.items() if name not in curves}
    sections = [
        FigureSection(
            "Learning curves",
            curves,
            "One panel per workflow and scale; line: mean over seeds, band: min–max over seeds, "
            "triangles: each seed's peak, dashed lines: each seed's cliff onset.",
        ),
        FigureSection(
            "Gradient diagnostics of the cells with a terminal cliff",
            diagnostics,
            "Per-role gradient norm, gradient-mass share and amplification at every update; "
            "dotted line: the cell's peak, dashed line: its cliff onset."
            if diagnostics
            else "No cell with stored diagnostics ends in a terminal cliff.",
        ),
    ]
    n_cells = len(study.cells)
    meta = (
        f"{n_cells} cells of {Path(config.results_dir)}; cliff: drop of at least {config.analysis.cliff_delta} "
        f"below the peak and more than {config.analysis.cliff_noise_se} standard errors of the evaluation, to the end."
    )
    return report_page("matrixrl report", meta, tables, sections), pngs


def write_report(
    config: Config, selected: Config | None, group_by: str | None, html: Path | None, plots_dir: Path | None
) -> list[Path]:
    """Build the page and its plots, then write them atomically (plots first, the page
    last): ``html`` the page, ``plots_dir`` the PNGs; either may be None. Returns the paths."""
    from matrixrl.report.plots import check_out_dir

    if html is not None and html.is_dir():
        raise ConfigError(f"--html {html}: is a folder; pass a file name such as report.html")
    if plots_dir is not None:
        check_out_dir(plots_dir, "--plots")
    page, pngs = build_report(config, selected, group_by)
    written = []
    if plots_dir is not None:
        for name, png in pngs.items():
            written.append(plots_dir / f"{name}.png")
            atomic.write_bytes(written[-1], png)
    if html is not None:
        atomic.write_text(html, page)
        written.append(html)
    return written


def _text(value: str) -> str:
    return html.escape(str(value), quote=False)


def _attr(value: str) -> str:
    return html.escape(str(value), quote=True)


def _num(numeric: bool) -> str:
    return ' class="num"' if numeric else ""
