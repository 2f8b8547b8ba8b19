"""The memory table: accuracy under each memory mode, and its difference from ``none`` (docs/report.md, ``memory``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from matrixrl.analysis.axes import cells_frame, extra_axes, grouped_rows, missing, typed
from matrixrl.analysis.seeds import GROUP_AXES, t_interval

NONE = "none"
MODES = (NONE, "own", "transfer", "self_contrast", "memcollab")
"""Every memory mode, in docs/memcollab.md's order (``none``: no memory, the ordinary evaluation)."""

FIGURES = [
    "n_seeds", "base", "peak", "peak_step",
    "base_diff", "base_diff_lo", "base_diff_hi", "peak_diff", "peak_diff_lo", "peak_diff_hi", "n_pairs",
    "entries", "base_tokens", "peak_tokens",
]  # fmt: skip
"""The memory table's columns after its axes and ``memory``."""


def _number(value) -> float:
    return math.nan if missing(value) else float(value)


def _curves(frame: pd.DataFrame, entries: bool) -> dict[str, dict[int, tuple[float, float, float]]]:
    """``{run: {step: (accuracy, response tokens, entries shown)}}`` of evaluation rows (``cell`` is the run)."""
    found: dict[str, dict[int, tuple[float, float, float]]] = {}
    tokens = frame["response_tokens"].tolist() if "response_tokens" in frame else [None] * len(frame)
    shown = frame["entries_mean"].tolist() if entries else [0.0] * len(frame)
    for run, step, accuracy, n_tokens, n_shown in zip(frame["cell"], frame["step"], frame["accuracy"], tokens, shown):
        found.setdefault(run, {})[int(step)] = (float(accuracy), _number(n_tokens), _number(n_shown))
    return found


def _mean(values: Sequence[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return float(np.mean(kept)) if kept else math.nan


def _peak_step(curves: Sequence[dict[int, tuple]]) -> int | None:
    """The step of the mean curve's highest accuracy among the steps every curve has (earliest on ties)."""
    if not curves:
        return None
    steps = sorted(set.intersection(*(set(curve) for curve in curves)))
    if not steps:
        return None
    means = [sum(curve[step][0] for curve in curves) / len(curves) for step in steps]
    return steps[int(np.argmax(means))]  # argmax: the first maximum


def memory_table(
    cells: pd.DataFrame,
    evaluations: pd.DataFrame,
    memory_evaluations: pd.DataFrame,
    modes: Sequence[str] = MODES,
    confidence: float = 0.95,
) -> pd.DataFrame:
    """The memory table of ``cells`` (the axes and ``run``) from their ordinary ``evaluations``
    (the ``none`` rows) and ``memory_evaluations``, for ``modes`` in order (``none`` first).
    A group gets rows only if a cell of it has a memory evaluation; groups in ``cells``' order.
    """
    extra = extra_axes(cells.columns)
    groups = [*GROUP_AXES, *extra]
    order = [NONE, *(m for m in dict.fromkeys(modes) if m != NONE)]
    by_mode = {NONE: _curves(evaluations, entries=False)}
    for mode, frame in memory_evaluations.groupby("memory", sort=False):
        if mode in order and mode != NONE:
            by_mode[mode] = _curves(frame, entries=True)
    columns = [*groups, "memory", *FIGURES]
    rows = []
    # Without a memory evaluation no group gets a row (every report without MemCollab results).
    cell_rows = []
    if len(by_mode) > 1:
        cell_rows = [dict(zip(cells.columns, values)) for values in zip(*(cells[c].tolist() for c in cells.columns))]
    for key, group in grouped_rows(cell_rows, groups):
        runs = list(dict.fromkeys(row["run"] for row in group))  # a seed's run (repeated where cells share one)
        if not any(run in by_mode.get(mode, {}) for mode in order[1:] for run in runs):
            continue
        none = {run: by_mode[NONE][run] for run in runs if run in by_mode[NONE]}
        none_peak = _peak_step(list(none.values()))
        for mode in order:
            curves = {run: by_mode.get(mode, {})[run] for run in runs if run in by_mode.get(mode, {})}
            if not curves:
                continue
            row = dict(zip(groups, key), memory=mode, **_figures(curves, none, none_peak, mode, confidence))
            rows.append(row)
    frame = cells_frame(rows, columns)
    return typed(frame, {"n_seeds": "int64", "peak_step": "Int64", "n_pairs": "Int64"})


def _figures(
    curves: dict[str, dict[int, tuple]], none: dict[str, dict[int, tuple]], none_peak: int | None, mode: str, confidence: float
) -> dict:
    peak_step = _peak_step(list(curves.values()))
    at_base = [curve[0] for curve in curves.values() if 0 in curve]
    at_peak = [curve[peak_step] for curve in curves.values()] if peak_step is not None else []
    figures = {
        "n_seeds": len(curves),
        "base": _mean([v[0] for v in at_base]),
        "peak": _mean([v[0] for v in at_peak]),
        "peak_step": peak_step,
        "entries": _mean([v[2] for curve in curves.values() for v in curve.values()]),
        "base_tokens": _mean([v[1] for v in at_base]),
        "peak_tokens": _mean([v[1] for v in at_peak]),
    }
    if mode == NONE:  # no difference from itself
        differences = ["base_diff", "base_diff_lo", "base_diff_hi", "peak_diff", "peak_diff_lo", "peak_diff_hi"]
        return {**figures, **dict.fromkeys(differences, math.nan), "n_pairs": None}
    paired = [run for run in curves if run in none]
    base_diffs = [curves[r][0][0] - none[r][0][0] for r in paired if 0 in curves[r] and 0 in none[r]]
    peak_diffs = (
        [curves[r][peak_step][0] - none[r][none_peak][0] for r in paired]
        if peak_step is not None and none_peak is not None
        else []
    )
    figures["base_diff"], figures["base_diff_lo"], figures["base_diff_hi"] = t_interval(base_diffs, confidence)
    figures["peak_diff"], figures["peak_diff_lo"], figures["peak_diff_hi"] = t_interval(peak_diffs, confidence)
    figures["n_pairs"] = len(paired)
    return figures
