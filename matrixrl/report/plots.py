"""PNG figures of a study: learning curves (one figure per task), and one cell's gradient diagnostics.

What each figure shows: docs/report.md, "Plots and the HTML report".
"""

from __future__ import annotations

import hashlib
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from matrixrl import atomic
from matrixrl.analysis.axes import extra_axes, grouped
from matrixrl.analysis.curves import summarize_cells
from matrixrl.analysis.gradients import share_table
from matrixrl.config import Analysis, Config
from matrixrl.config.sweeps import spelled
from matrixrl.errors import ConfigError, closest, did_you_mean

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# matplotlib is imported where a figure is drawn: a report whose figures are all cached draws none.

# Okabe–Ito colours: distinguishable with the common colour-vision deficiencies.
POLICY_COLOURS = {"shared": "#0072B2", "isolated": "#D55E00"}
_ROLE_PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#F0E442", "#000000")
LEGEND_WIDTH = 3.2  # inches added beside the panels for a legend of extra-axis values
PNG_DPI = 110
PANEL_SIZE = (4.2, 2.8)  # inches per learning-curve panel
SMOOTH_UPDATES = 5  # per-update diagnostics are noisy; the thick line averages this many updates


def policy_colour(policy: str) -> str:
    """The colour of a policy mode, the same in every figure."""
    return POLICY_COLOURS[policy]


def role_colours() -> dict[str, str]:
    """A fixed colour per role of every registered workflow (the same in every figure)."""
    from matrixrl.workflows import WORKFLOWS

    roles = dict.fromkeys(role for workflow in WORKFLOWS.values() for role in workflow.roles)
    return {role: _ROLE_PALETTE[i % len(_ROLE_PALETTE)] for i, role in enumerate(roles)}


def curves_name(task: str) -> str:
    """File stem of a task's learning-curve figure."""
    return f"curves-{task}"


def diagnostics_name(cell: str) -> str:
    """File stem of a cell's diagnostics figure."""
    return f"diagnostics-{cell}"


# --- the study's data -------------------------------------------------------------------


@dataclass(frozen=True)
class PlotData:
    """What the figures are drawn from: the grid's cells and the store's rows for them."""

    cells: pd.DataFrame  # cell + the grid axes, in the grid's order
    evals: pd.DataFrame  # the store's evaluations of these cells
    diagnostics: pd.DataFrame  # the store's gradient diagnostics of these cells
    analysis: Analysis  # the cliff rule's thresholds


def load_study(config: Config) -> PlotData:
    """Ingest new result files and read the grid's current rows back; ConfigError when there is nothing to plot."""
    from matrixrl.report.rows import grid_cells, nothing_stored, stored_rows
    from matrixrl.report.rows import current_specs
    from matrixrl.store import ingest_for_report

    ingest_for_report(config.results_dir)
    current = current_specs(config)
    evals = stored_rows(config, "evaluations", current)
    if evals.empty:
        raise nothing_stored(config.results_dir)
    cells = grid_cells(config).drop(columns="run")
    return PlotData(cells, evals, stored_rows(config, "diagnostics", current), config.analysis)


def cliff_cells(study: PlotData) -> list[str]:
    """Cells (grid order) whose curve ends in a terminal cliff and that have diagnostics."""
    summaries = summarize_cells(study.evals[["cell", "step", "accuracy", "n", "se"]], study.analysis)
    with_cliff = set(summaries.loc[summaries["cliff"], "cell"])
    with_diagnostics = set(study.diagnostics["cell"])
    return [c for c in study.cells["cell"] if c in with_cliff and c in with_diagnostics]


def study_figures(
    study: PlotData, diagnostics_cells: Sequence[str] = (), line_by: str = "policy", *, options: tuple[str, str] = ("--cell", "--lines")
) -> dict[str, Figure]:
    """The learning curves of every task (a line per value of ``line_by``), then each asked cell's
    diagnostics.

    An unknown cell, a cell without diagnostics or a bad ``line_by`` is a ConfigError naming ``options``.
    """
    check_line_by(study, line_by, options[1])
    check_diagnostics_cells(study, diagnostics_cells, options[0])
    figures = learning_curve_figures(study.cells, study.evals, study.analysis, line_by)
    for cell in dict.fromkeys(diagnostics_cells):
        figures[diagnostics_name(cell)] = diagnostics_figure(cell, study.diagnostics, study.evals, study.analysis)
    return figures


def check_line_by(study: PlotData, line_by: str, option: str = "--lines") -> None:
    """ConfigError unless the curves can draw one line per value of ``line_by``."""
    choices = ["policy", *extra_axes(study.cells.columns)]
    if line_by not in choices:
        why = "" if closest(line_by, choices) else " (workflow, task and scale have panels of their own, seeds make the band)"
        raise ConfigError(
            f"{option} {line_by}: not an axis the curves can draw one line per value of; {did_you_mean(line_by, choices)}{why}"
        )


def check_diagnostics_cells(study: PlotData, cells: Sequence[str], option: str = "--cell") -> None:
    """ConfigError unless every cell of ``cells`` is in the grid and has diagnostics stored."""
    known = list(study.cells["cell"])
    for cell in cells:
        if cell not in known:
            near = closest(cell, known)
            fix = f"did you mean {near}?" if near else f"`matrixrl plan` lists the cell ids (e.g. {known[0]})"
            raise ConfigError(f"{option} {cell}: not a cell of this grid; {fix}")
        if not (study.diagnostics["cell"] == cell).any():
            raise ConfigError(f"{option} {cell}: no gradient diagnostics stored yet; run `matrixrl run` first")


# --- learning curves --------------------------------------------------------------------


def learning_curve_figures(
    cells: pd.DataFrame, evals: pd.DataFrame, analysis: Analysis, line_by: str = "policy", tasks: Sequence[str] | None = None
) -> dict[str, Figure]:
    """``{curves_name(task): figure}``: a panel per (workflow, scale), a colour per value of ``line_by``, in
    grid order."""
    from matplotlib.figure import Figure

    evals = evals[evals["cell"].isin(cells["cell"])]
    summaries = summarize_cells(evals[["cell", "step", "accuracy", "n", "se"]], analysis).set_index("cell")
    others = [a for a in ("policy", *extra_axes(cells.columns)) if a != line_by and cells[a].nunique(dropna=False) > 1]
    styles = _line_styles(cells, line_by, others)
    figures = {}
    for task in cells["task"].drop_duplicates():
        if tasks is not None and task not in tasks:
            continue
        of_task = cells[cells["task"] == task]
        workflows = list(of_task["workflow"].drop_duplicates())
        scales = list(of_task["scale"].drop_duplicates())
        beside = line_by != "policy" or bool(others)  # labels like train.lr=5e-05: a legend column beside the panels
        fig = Figure(
            figsize=(PANEL_SIZE[0] * len(scales) + (LEGEND_WIDTH if beside else 0), PANEL_SIZE[1] * len(workflows) + 1.0),
            layout="constrained",
        )
        axes = fig.subplots(len(workflows), len(scales), sharex=True, sharey=True, squeeze=False)
        drawn: list[tuple] = []
        for r, workflow in enumerate(workflows):
            for c, scale in enumerate(scales):
                ax = axes[r][c]
                panel = of_task[(of_task["workflow"] == workflow) & (of_task["scale"] == scale)]
                lines = _curve_panel(ax, panel, evals, summaries, [line_by, *others], styles)
                drawn += [line for line in lines if line not in drawn]
                ax.set_title(f"{workflow} · {scale}")
                ax.grid(True, alpha=0.3)
                if r == len(workflows) - 1:
                    ax.set_xlabel("training step")
                if c == 0:
                    ax.set_ylabel("accuracy")
        axes[0][0].set_ylim(bottom=0)
        n_seeds = of_task["seed"].nunique()
        # Two lines and a narrower legend, so that a one-scale figure (one panel wide) is not cut.
        fig.suptitle(f"{task}: accuracy vs training step\nline: mean of {n_seeds} seed(s), band: min–max")
        wide = len(scales) > 1
        handles = _curve_legend([styles[line] for line in sorted(drawn, key=list(styles).index)], bool(others))
        if not beside:
            fig.legend(handles=handles, loc="outside lower center", ncols=4 if wide else 2,
                       fontsize="medium" if wide else "small", frameon=False)  # fmt: skip
        else:
            fig.legend(handles=handles, loc="outside right upper", ncols=1, fontsize="small", frameon=False)
        figures[curves_name(task)] = fig
    return figures


@dataclass(frozen=True)
class _LineStyle:
    colour: str
    dashes: str
    label: str  # the whole line: "train.lr=5e-05, policy=isolated"
    colour_label: str  # what its colour stands for: "train.lr=5e-05"
    dashes_label: str  # what its dash pattern stands for: "isolated" ("" when nothing else varies)


_DASHES = ("-", "--", ":", "-.")


def _line_styles(cells: pd.DataFrame, line_by: str, others: list[str]) -> dict[tuple, _LineStyle]:
    """A colour per value of ``line_by`` (the policy modes keep theirs) and a dash pattern per
    combination of ``others``, for every line the figures can draw, in the grid's order."""
    colours: dict = {}
    dashes: dict = {}
    styles = {}
    for key, _ in grouped(cells, [line_by, *others]):
        value, rest = key[0], key[1:]
        if value not in colours:
            colours[value] = POLICY_COLOURS[value] if line_by == "policy" else _ROLE_PALETTE[len(colours) % len(_ROLE_PALETTE)]
        if all(v is None for v in rest):  # the other axes leave these cells alone
            dash = "-"
        else:
            dash = dashes.setdefault(rest, _DASHES[len(dashes) % len(_DASHES)])
        names = [line_by, *others]
        parts = [_shown(name, v) for name, v in zip(names, key) if v is not None]
        rest_label = ", ".join(_shown(name, v) for name, v in zip(others, rest) if v is not None)
        styles[key] = _LineStyle(colours[value], dash, ", ".join(parts) or "n/a", _shown(line_by, value), rest_label)
    return styles


def _shown(axis: str, value) -> str:
    """``shared`` for the policy axis (as before extra axes), ``train.lr=5e-05`` for the others."""
    return spelled(value) if axis == "policy" else f"{axis}={spelled(value)}"


def _curve_panel(ax, panel: pd.DataFrame, evals: pd.DataFrame, summaries: pd.DataFrame, keys: list[str], styles) -> list[tuple]:
    """Draw one (workflow, task, scale) panel, a line per combination of ``keys``; returns the lines drawn."""
    drawn = []
    for key, line_cells in grouped(panel, keys):
        curves = evals[evals["cell"].isin(line_cells["cell"])]
        if curves.empty:
            continue
        style = styles[key]
        # Later lines draw thinner on top, so identical curves (``single`` has one role) all stay visible.
        width = max(3.2 - 1.2 * len(drawn), 1.2)
        # seeds as columns; a seed still running contributes to the steps it has reached
        # (one evaluation per cell and step, the store's key: a pivot, three times quicker than pivot_table)
        by_step = curves.pivot(index="step", columns="cell", values="accuracy").sort_index()
        ax.plot(by_step.index, by_step.mean(axis=1), color=style.colour, linewidth=width, linestyle=style.dashes)
        if by_step.shape[1] > 1:
            ax.fill_between(by_step.index, by_step.min(axis=1), by_step.max(axis=1), color=style.colour, alpha=0.2, linewidth=0)
        for cell in by_step.columns:
            summary = summaries.loc[cell]
            ax.plot([summary["peak_step"]], [summary["peak"]], marker="^", markersize=8, color=style.colour,
                    markeredgecolor="black", markeredgewidth=0.6, linestyle="none")
            if summary["cliff"]:
                ax.axvline(int(summary["cliff_onset"]), color=style.colour, linestyle="--", linewidth=1.2)
        drawn.append(key)
    if not drawn:
        ax.text(0.5, 0.5, "no evaluations yet", transform=ax.transAxes, ha="center", va="center", color="grey")
    return drawn


def _curve_legend(styles: Sequence[_LineStyle], by_two: bool = False) -> list:
    """A line and a band per style; with ``by_two`` (other axes vary too), a colour per
    value of the chosen axis and a dash pattern per combination of the others instead."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = []
    if not by_two:
        for style in styles:
            handles.append(Line2D([], [], color=style.colour, linewidth=2, label=f"{style.label} (mean)"))
            handles.append(Patch(color=style.colour, alpha=0.2, label=f"{style.label} (seed min–max)"))
    else:
        for label, colour in dict((s.colour_label, s.colour) for s in styles).items():
            handles.append(Line2D([], [], color=colour, linewidth=2, label=f"{label} (mean)"))
        for label, dash in dict((s.dashes_label, s.dashes) for s in styles if s.dashes_label).items():
            handles.append(Line2D([], [], color="black", linestyle=dash, linewidth=1.5, label=label))
        handles.append(Patch(color="grey", alpha=0.2, label="seed min–max"))
    handles.append(Line2D([], [], marker="^", color="grey", markeredgecolor="black", linestyle="none", label="peak (per seed)"))
    handles.append(Line2D([], [], color="grey", linestyle="--", label="cliff onset (per seed)"))
    return handles


# --- gradient diagnostics ---------------------------------------------------------------


def diagnostics_figure(cell: str, diagnostics: pd.DataFrame, evals: pd.DataFrame, analysis: Analysis) -> Figure:
    """One cell's per-role gradient norm, share and amplification at every update; ValueError without
    ``role_norm`` rows."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    rows = diagnostics[diagnostics["cell"] == cell]
    norms = rows[rows["kind"] == "role_norm"].pivot_table(index="step", columns="role", values="value", aggfunc="mean")
    if norms.empty:
        raise ValueError(f"cell {cell!r} has no gradient diagnostics")
    shares = share_table(rows)  # updates without any gradient are left out: a gap, not a dip to 0
    amplification = rows[rows["kind"] == "amplification"].pivot_table(index="step", columns="role", values="value", aggfunc="mean")
    colours = role_colours()
    fallback = iter(_ROLE_PALETTE[::-1])

    def colour(role: str) -> str:
        if role not in colours:  # a role of a workflow this build does not know
            colours[role] = next(fallback)
        return colours[role]

    n_panels = 3 if not amplification.empty else 2
    fig = Figure(figsize=(4.6 * n_panels, 3.6), layout="constrained")
    axes = fig.subplots(1, n_panels, sharex=True)
    panels = [
        (axes[0], norms.sort_index(), "gradient L2 norm per role", "‖g_role‖ (before clipping)"),
        (axes[1], shares, "gradient-mass share per role", "share of the step's total norm"),
    ]
    if not amplification.empty:
        panels.append((axes[2], amplification.sort_index(), "amplification of parallel agents", "‖Σ g_i‖ / mean ‖g_i‖"))
    for ax, table, title, ylabel in panels:
        for role in table.columns:
            ax.plot(table.index, table[role], color=colour(role), linewidth=0.8, alpha=0.35)
            smooth = table[role].rolling(SMOOTH_UPDATES, center=True, min_periods=1).mean()
            ax.plot(table.index, smooth, color=colour(role), linewidth=2, label=role)
        ax.set_title(title)
        ax.set_xlabel("training step")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    for ax in axes:
        ax.set_ylim(bottom=0)  # norms, shares and amplification are all >= 0
    axes[1].set_ylim(0, 1)
    if not amplification.empty:
        _amplification_references(axes[2], rows)
    _mark_peak_and_cliff(axes, cell, evals, analysis)
    fig.suptitle(f"{cell}: gradient diagnostics (thin: every update; thick: rolling mean of {SMOOTH_UPDATES})")
    handles = [Line2D([], [], color=colour(role), linewidth=1.5, label=role) for role in norms.columns]
    handles += [h for h in axes[0].get_lines() if h.get_label() in ("peak", "cliff onset")]
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), frameon=False)
    return fig


def _amplification_references(ax, rows: pd.DataFrame) -> None:
    """Dotted lines at N (aligned agents) and √N (orthogonal) for each amplified role's N."""
    agents = rows[rows["kind"] == "agent_norm"].groupby("role")["agent"].nunique()
    amplified = rows.loc[rows["kind"] == "amplification", "role"].unique()
    for n in sorted({int(agents[role]) for role in amplified if role in agents.index}):
        for level, what in ((n, "aligned"), (math.sqrt(n), "orthogonal")):
            ax.axhline(level, color="grey", linestyle=":", linewidth=1)
            ax.annotate(f"{what} (N={n})", (1, level), xycoords=("axes fraction", "data"), ha="right", va="bottom",
                        fontsize=8, color="grey")
        ax.set_ylim(0, max(ax.get_ylim()[1], n * 1.1))


def _mark_peak_and_cliff(axes, cell: str, evals: pd.DataFrame, analysis: Analysis) -> None:
    curve = evals[evals["cell"] == cell]
    if curve.empty:
        return
    summary = summarize_cells(curve[["cell", "step", "accuracy", "n", "se"]], analysis).iloc[0]
    for ax in axes:
        ax.axvline(int(summary["peak_step"]), color="black", linestyle=":", linewidth=1, label="peak")
        if summary["cliff"]:
            ax.axvline(int(summary["cliff_onset"]), color="black", linestyle="--", linewidth=1.2, label="cliff onset")


# --- files ------------------------------------------------------------------------------


def png_bytes(fig: Figure, dpi: int = PNG_DPI) -> bytes:
    """The figure as PNG bytes (Agg backend), with a 256-colour palette: a third of the size,
    for the HTML report that users mail."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from PIL import Image  # Pillow: a dependency of matplotlib

    # Drawn once on an Agg canvas: the same pixels as ``savefig``, which lays out and renders
    # twice and encodes a full-colour PNG that would only be decoded again here.
    canvas, old_dpi, old_face = fig.canvas, fig.get_dpi(), fig.get_facecolor()
    try:
        fig.set_dpi(dpi)
        fig.set_facecolor("white")
        agg = FigureCanvasAgg(fig)
        agg.draw()  # the layout engine (constrained) runs inside the draw
        image = Image.frombuffer("RGBA", agg.get_width_height(), agg.buffer_rgba(), "raw", "RGBA", 0, 1).convert("RGB")
    finally:
        fig.set_canvas(canvas)
        fig.set_dpi(old_dpi)
        fig.set_facecolor(old_face)
    image = image.quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    out = io.BytesIO()
    image.save(out, format="png", optimize=True)
    return out.getvalue()


def drawing_version() -> str:
    """What a drawn figure depends on besides its data: this module's code and the versions of
    matplotlib and Pillow (a cached PNG is drawn again when any of them changes)."""
    from importlib.metadata import version

    from matrixrl.analysis import axes, curves, gradients

    code = hashlib.sha256()
    for module in (__file__, axes.__file__, curves.__file__, gradients.__file__):  # what draws, and what it draws from
        code.update(Path(module).read_bytes())
    return f"{code.hexdigest()[:16]} matplotlib {version('matplotlib')} pillow {version('pillow')}"


def check_out_dir(folder: Path, option: str) -> None:
    """A folder to write PNG files to (``option`` names the CLI option in the error)."""
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{option} {folder}: is a file; pass a folder for the PNG files")


def write_pngs(figures: Mapping[str, Figure], out_dir: Path) -> list[Path]:
    """Render every figure first, then write ``out_dir/NAME.png`` for each; returns the paths."""
    rendered = {name: png_bytes(fig) for name, fig in figures.items()}
    paths = []
    for name, data in rendered.items():
        path = Path(out_dir) / f"{name}.png"
        atomic.write_bytes(path, data)
        paths.append(path)
    return paths

