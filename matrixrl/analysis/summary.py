"""The per-cell summary table of ``matrixrl report`` (design.md §2)."""

from __future__ import annotations

import pandas as pd

from matrixrl.analysis.curves import CliffRule, summarize_cells
from matrixrl.analysis.diagnostics import SUMMARY_COLUMNS as DIAGNOSTIC_SUMMARY
from matrixrl.analysis.diagnostics import summarize_diagnostics
from matrixrl.config import AXES, Analysis

SUMMARY_COLUMNS = [
    *AXES,
    "base",
    "peak",
    "peak_step",
    "final",
    "gain",
    "cliff",
    "cliff_onset",
    "n_checkpoints",
]


def cliff_rule(analysis: Analysis) -> CliffRule:
    return CliffRule(delta=analysis.cliff_delta, noise_se=analysis.cliff_noise_se, final_tail_k=analysis.final_tail_k)


def summary_table(cells: pd.DataFrame, evals: pd.DataFrame, analysis: Analysis) -> pd.DataFrame:
    """One row per cell of ``cells`` (columns ``cell`` + AXES) that has evaluations.

    Rows follow the order of ``cells`` (the grid's order), so tables are stable.
    """
    evals = evals[evals["cell"].isin(cells["cell"])]
    per_cell = summarize_cells(evals[["cell", "step", "accuracy", "n"]], cliff_rule(analysis))
    table = cells.merge(per_cell, on="cell", how="inner")
    return table[["cell", *SUMMARY_COLUMNS]].reset_index(drop=True)


DIAGNOSTICS_COLUMNS = [*AXES, *DIAGNOSTIC_SUMMARY[1:]]


def diagnostics_table(cells: pd.DataFrame, diagnostics: pd.DataFrame) -> pd.DataFrame:
    """Per cell of ``cells`` with stored diagnostics: dominant role, amplification (design.md §3)."""
    diagnostics = diagnostics[diagnostics["cell"].isin(cells["cell"])]
    if diagnostics.empty:
        return pd.DataFrame(columns=["cell", *DIAGNOSTICS_COLUMNS])
    per_cell = summarize_diagnostics(diagnostics)
    return cells.merge(per_cell, on="cell", how="inner")[["cell", *DIAGNOSTICS_COLUMNS]].reset_index(drop=True)
