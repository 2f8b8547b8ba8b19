"""The per-cell tables of ``matrixrl report`` (docs/design.md §4, §5): summary and diagnostics (docs/report.md)."""

from __future__ import annotations

import pandas as pd

from matrixrl.analysis.axes import PerCell, extra_axes, missing
from matrixrl.analysis.cell_record import INTERVENTION_METRICS, LOGP_GAP_METRICS, ROLE_METRICS, cell_record, records_frame
from matrixrl.analysis.gradients import AMP_MAX, AMP_MEAN, NORM_RATIO
from matrixrl.analysis.gradients import SUMMARY_COLUMNS as DIAGNOSTIC_SUMMARY
from matrixrl.config import AXES, Analysis

CHECKPOINTS = ("base", "peak", "final")

SUMMARY_COLUMNS = [
    *AXES,
    "base",
    "peak",
    "peak_step",
    "final",
    "final_tail",
    "gain",
    "gain_z",
    "peak_gain_z",
    "cliff",
    "cliff_onset",
    "signature",
    "n_checkpoints",
]
INTERVENTION_SUFFIXES = tuple(f"{metric}_mean" for metric in INTERVENTION_METRICS)
ROLE_ACCURACY_SUFFIXES = tuple(f"{metric}_{at}" for metric in ROLE_METRICS for at in CHECKPOINTS)

DIAGNOSTICS_COLUMNS = [*AXES, *DIAGNOSTIC_SUMMARY[1:], *LOGP_GAP_METRICS]


def role_columns(columns, suffixes: tuple[str, ...]) -> list[str]:
    """The ``{role}_{suffix}`` columns among ``columns``, by role name, then in ``suffixes`` order."""
    found = []
    for column in columns:
        for rank, suffix in enumerate(suffixes):
            if column.endswith("_" + suffix) and len(column) > len(suffix) + 1:
                found.append((column[: -len(suffix) - 1], rank, column))
                break
    return [column for _, _, column in sorted(found)]


def summary_rows(per_cell: PerCell | pd.DataFrame) -> pd.DataFrame:
    """Cells with a base evaluation: ``cell``, ``SUMMARY_COLUMNS`` (extra axes after the fixed ones),
    then per-role accuracies."""
    per_cell = PerCell.of(per_cell)
    rows = per_cell.where(lambda row: not missing(row["base"]))
    columns = role_columns(per_cell.columns, ROLE_ACCURACY_SUFFIXES)
    # A role's metric keeps all three columns (base, peak, final) if it has any value.
    measured = {c.rsplit("_", 1)[0] for c in columns if _any_value(rows, c)}
    roles = [c for c in columns if c.rsplit("_", 1)[0] in measured]
    return rows.frame(
        ["cell", *AXES, *extra_axes(per_cell.columns), *SUMMARY_COLUMNS[len(AXES):], *roles],
        {"peak_step": "int64", "n_checkpoints": "int64", "cliff": "bool"},
    )


def diagnostics_rows(per_cell: PerCell | pd.DataFrame) -> pd.DataFrame:
    """Cells with gradient diagnostics: ``cell``, ``DIAGNOSTICS_COLUMNS``, then per-role columns.

    Per role: ``{role}_amp_mean`` / ``{role}_amp_max`` for roles with several agents
    and ``{role}_norm_ratio`` for every role (see ``cell_diagnostics``); where a cell
    trained with an intervention on, ``{role}_kl_mean`` and ``{role}_damper_scale_mean``.
    """
    per_cell = PerCell.of(per_cell)
    rows = per_cell.where(lambda row: bool(row["has_diagnostics"]))
    amp = [c for c in role_columns(rows.columns, (AMP_MEAN, AMP_MAX)) if _any_value(rows, c)]
    ratio = [c for c in role_columns(rows.columns, (NORM_RATIO,)) if _any_value(rows, c)]
    # The interventions' per-role means, where a cell of the table trained with one on.
    switched = [c for c in role_columns(rows.columns, INTERVENTION_SUFFIXES) if _any_value(rows, c)]
    columns = ["cell", *AXES, *extra_axes(rows.columns), *DIAGNOSTICS_COLUMNS[len(AXES):], *amp, *ratio, *switched]
    return rows.frame(columns)


def _any_value(rows: PerCell, column: str) -> bool:
    return any(not missing(row.get(column)) for row in rows.rows)


def summary_table(cells: pd.DataFrame, evals: pd.DataFrame, analysis: Analysis) -> pd.DataFrame:
    """The summary of every cell of ``cells`` (``cell`` + AXES) from its evaluations alone.

    Rows follow the order of ``cells``. (The ``analyse`` job's ``summary.json``.)
    """
    evals = evals[evals["cell"].isin(cells["cell"])]
    empty = pd.DataFrame(columns=["step", "role", "metric", "value"])
    records = {
        cell: cell_record(None, rows, empty, pd.DataFrame(), analysis)
        for cell, rows in evals.groupby("cell", sort=False)
    }
    per_cell = records_frame(records, cells[cells["cell"].isin(list(records))])
    return summary_rows(per_cell)
