"""The page of a study: its tables, plots (kept in the store), matrix and cards; written."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from matrixrl import atomic
from matrixrl.config import Config
from matrixrl.errors import ConfigError, output_named
from matrixrl.report.html.matrix import cards_html, matrix_html, squares_of
from matrixrl.report.html.page import FigureSection, TableSection, report_page


def build_report(
    config: Config,
    selected: Config | None = None,
    group_by: str | None = None,
) -> tuple[str, dict[str, bytes]]:
    """The HTML page of ``config``'s study and the PNGs it embeds (``{name: bytes}``).

    Ingests new result files first; ``selected``: the config narrowed by ``--only``. Raises
    ``ConfigError`` when nothing is stored yet.
    """
    from matrixrl import grid as G
    from matrixrl.layout import store_path
    from matrixrl.report.columns import shown
    from matrixrl.report.rows import current_specs, grid_cells, nothing_stored, stored_rows
    from matrixrl.report.tables import TABLES, build_tables, parse_group_by, selection
    from matrixrl.store import ingest_for_report

    axes = parse_group_by(group_by, list(config.grid.sweeps))
    shown_config = selected or config
    ingest_for_report(config.results_dir)  # one-line errors when there is nothing yet
    current = current_specs(shown_config)
    evals = stored_rows(shown_config, "evaluations", current)
    if evals.empty:
        raise nothing_stored(config.results_dir)
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

    Each is cached in the store under a key of what it is drawn from (docs/architecture.md,
    "Reports at scale"); ``current``: ``rows.current_specs`` of ``config``.
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
    from matrixrl.analysis.cell_record import rows_of_cells
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
    config: Config, selected: Config | None, group_by: str | None, html: Path | None, plots_dir: Path | None,
    experiments: Path | None = None,
) -> list[Path]:
    """Build the page and its plots, then write them atomically (plots first, the page
    last): ``html`` the page, ``plots_dir`` the PNGs; either may be None. Returns the paths.
    Neither may be an input of the study (``experiments``: the file ``config`` was read from)."""
    from matrixrl.report.outputs import check_output
    from matrixrl.report.plots import check_out_dir

    target = html.resolve() if html is not None else None  # through a symbolic link, its target
    if html is not None:
        if html.is_dir():
            raise ConfigError(f"--html {html}: is a folder; pass a file name such as report.html")
        if html.exists() and not target.is_file():
            raise ConfigError(f"--html {html}: is not a regular file; pass a file name such as report.html")
        if plots_dir is not None and target == plots_dir.resolve():
            raise ConfigError(f"--html and --plots both name {html}; give the page a file name of its own")
        check_output("--html", html, config, experiments, "report.html")
    if plots_dir is not None:
        check_out_dir(plots_dir, "--plots")
        check_output("--plots", plots_dir, config, experiments, "report-plots")
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
