"""Across seeds: the mean and a Student-t interval of each per-cell figure (docs/design.md §4).

Why Student-t, unclipped: docs/report.md (``seeds``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from matrixrl.analysis.axes import PerCell, cells_frame, extra_axes, grouped_rows, typed

GROUP_AXES = ("workflow", "task", "scale", "policy")
FIGURES = ("base", "peak", "final", "gain")
SEEDS_COLUMNS = [
    *GROUP_AXES,
    *(f"{figure}_{part}" for figure in FIGURES for part in ("mean", "lo", "hi")),
    "cliff_rate",
    "collapse_rate",
    "n_seeds",
]


def t_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """``(mean, lo, hi)`` of the Student-t interval; NaN bounds below two values, all NaN for none.

    NaN values are ignored.
    """
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    if x.size == 0:
        return math.nan, math.nan, math.nan
    # x.mean() and x.std(ddof=1) as numpy computes them, without their Python layers (a
    # report takes hundreds of these intervals of a few seeds each); test_analysis checks
    # that they agree to the last bit.
    mean = np.add.reduce(x) / x.size
    if x.size < 2:
        return float(mean), math.nan, math.nan
    deviations = x - mean
    std = np.sqrt(np.add.reduce(deviations * deviations) / (x.size - 1))
    half = _t_quantile(confidence, x.size - 1) * float(std) / math.sqrt(x.size)
    return float(mean), float(mean) - half, float(mean) + half


@functools.cache
def _t_quantile(confidence: float, dof: int) -> float:
    from scipy.special import stdtrit  # here: only tables with several seeds need it

    return float(stdtrit(dof, (1 + confidence) / 2))


def seeds_table(per_cell: PerCell | pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """One row per (workflow, task, scale, policy, extra axes) over its seeds (``SEEDS_COLUMNS``).

    ``per_cell`` has the axes and ``base, peak, final, gain, cliff, signature`` per cell (one
    row per seed). Groups appear in the order of their first row. ``cliff_rate`` and
    ``collapse_rate``: the seeds whose run ends in a cliff, or a collapse (``signature``), of
    all its seeds.
    """
    per_cell = PerCell.of(per_cell)
    rows = []
    groups = [*GROUP_AXES, *extra_axes(per_cell.columns)]
    for key, group in grouped_rows(per_cell.rows, groups):
        row: dict = dict(zip(groups, key))
        for figure in FIGURES:
            values = [cell[figure] for cell in group]
            row[f"{figure}_mean"], row[f"{figure}_lo"], row[f"{figure}_hi"] = t_interval(values, confidence)
        cliffs = [bool(cell["cliff"]) for cell in group]
        row["cliff_rate"] = sum(cliffs) / len(cliffs)
        row["collapse_rate"] = sum(cell.get("signature") == "collapse" for cell in group) / len(cliffs)
        row["n_seeds"] = len(cliffs)
        rows.append(row)
    columns = [*GROUP_AXES, *groups[len(GROUP_AXES):], *SEEDS_COLUMNS[len(GROUP_AXES):]]
    return typed(cells_frame(rows, columns), {"n_seeds": "int64"})
