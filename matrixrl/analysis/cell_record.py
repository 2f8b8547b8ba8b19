"""One record per cell: everything the report tables need, from that cell's rows alone.

Cached per cell in the store (matrixrl.report.records); docs/architecture.md, "Reports at scale".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, fields
from typing import Any

import numpy as np
import pandas as pd

from matrixrl.analysis.curves import CurveSummary, summarize_curve
from matrixrl.analysis.gradients import cell_diagnostics, share_table
from matrixrl.analysis.mechanism import FIELDS as MECHANISM_FIELDS
from matrixrl.analysis.mechanism import Signal, assess, signal_of
from matrixrl.analysis.axes import PerCell, axes_of, cells_frame
from matrixrl.config import Analysis

CURVE_FIELDS = tuple(f.name for f in fields(CurveSummary))

ROLE_METRICS = ("answer_acc", "verdict_acc", "disagreement")
"""The eval-time role metrics a record keeps (:func:`role_accuracies`)."""

INTERVENTION_METRICS = ("kl", "damper_scale")
"""The training-time role metrics of the interventions a record keeps (:func:`intervention_signals`)."""

LOGP_GAP_METRICS = ("logp_gap_mean", "logp_gap_max")
"""The training-time role metrics of the rollout–update log-probability gap (:func:`logp_gap`)."""

TRAINING_METRICS = (*INTERVENTION_METRICS, *LOGP_GAP_METRICS)
"""Every training-time role metric a record reads."""

_DTYPES = {
    **dict.fromkeys(["base", "peak", "final", "final_tail", "gain", "peak_gain", "gain_z", "peak_gain_z", "drop_z", "base_se"], "float64"),
    **dict.fromkeys(["dominant_share", "amplification_mean", "amplification_max", "baseline", "change"], "float64"),
    **dict.fromkeys([f"{metric}_mean" for metric in INTERVENTION_METRICS], "float64"),
    **dict.fromkeys(LOGP_GAP_METRICS, "float64"),
    **dict.fromkeys(["peak_step", "n_checkpoints", "cliff_onset", "pre_onset", "rise_step", "lead"], "Int64"),
    **dict.fromkeys(["cliff", "rose"], "boolean"),
    "has_diagnostics": "bool",
    **dict.fromkeys(["dominant_role", "amplified_role", "signal", "signal_role", "verdict", "signature"], "object"),
}


def role_accuracies(role_rows: pd.DataFrame, steps: dict[str, int]) -> dict[str, float | None]:
    """``{role}_{metric}_{at}`` for one cell's eval-time role metrics at the ``steps`` named (None where missing)."""
    out: dict[str, float | None] = {}
    by_role: dict[tuple[str, str], dict[int, float]] = {}
    columns = (role_rows[c].tolist() for c in ("role", "metric", "step", "value"))
    for role, metric, step, value in zip(*columns):
        if metric in ROLE_METRICS:
            by_role.setdefault((role, metric), {})[int(step)] = float(value)
    for (role, metric), by_step in sorted(by_role.items()):
        for at, step in steps.items():
            out[f"{role}_{metric}_{at}"] = by_step.get(step)
    return out


def intervention_signals(train_roles: pd.DataFrame, until: int | None) -> dict[str, float | None]:
    """The interventions' per-step signals of one cell's training (``step, role, metric, value``):
    ``{role}_kl_mean`` and ``{role}_damper_scale_mean`` over the whole run, and ``kl_mean``,
    ``damper_scale_mean`` over every role up to step ``until`` (the cliff's onset; all steps if None)."""
    out: dict[str, float | None] = dict.fromkeys(f"{metric}_mean" for metric in INTERVENTION_METRICS)
    rows = train_roles[train_roles["metric"].isin(INTERVENTION_METRICS)] if not train_roles.empty else train_roles
    if rows.empty:
        return out
    for (role, metric), group in rows.groupby(["role", "metric"], sort=True):
        out[f"{role}_{metric}_mean"] = float(group["value"].mean())
    span = rows if until is None else rows[rows["step"] <= until]
    for metric in INTERVENTION_METRICS:
        values = span.loc[span["metric"] == metric, "value"]
        out[f"{metric}_mean"] = float(values.mean()) if len(values) else None
    return out


def logp_gap(train_roles: pd.DataFrame) -> dict[str, float | None]:
    """How far the update's log-probabilities were from the rollout's over one cell's training:
    ``logp_gap_mean``, the mean over steps and roles of each step's mean |Δ log p|, and
    ``logp_gap_max``, the largest single token's (None for a training that recorded none)."""
    out: dict[str, float | None] = dict.fromkeys(LOGP_GAP_METRICS)
    for metric, reduce in (("logp_gap_mean", "mean"), ("logp_gap_max", "max")):
        values = train_roles.loc[train_roles["metric"] == metric, "value"] if not train_roles.empty else []
        if len(values):
            out[metric] = float(getattr(values, reduce)())
    return out


def training_part(
    policy: str | None, diagnostics: pd.DataFrame, train_roles: pd.DataFrame | None = None
) -> dict:
    """What a cell's record takes from its training alone (JSON-able), kept while its evaluations come in."""
    shares = share_table(diagnostics) if not diagnostics.empty else pd.DataFrame()
    summary = cell_diagnostics(diagnostics, shares) if not diagnostics.empty else {}
    signal = signal_of(diagnostics, policy, summary.get("dominant_role"), shares) if policy else None
    if train_roles is not None:
        rows = train_roles[train_roles["metric"].isin(INTERVENTION_METRICS)] if not train_roles.empty else train_roles
        kept = [[int(s), r, m, float(v)] for s, r, m, v in zip(rows["step"], rows["role"], rows["metric"], rows["value"])]
    gaps = logp_gap(train_roles) if train_roles is not None else dict.fromkeys(LOGP_GAP_METRICS)
    return {
        "has_diagnostics": not diagnostics.empty,
        "summary": {**summary, **gaps},
        "signal": None if signal is None else {
            "name": signal.name, "role": signal.role,
            "steps": [int(s) for s in signal.values.index], "values": [float(v) for v in signal.values],
        },
        "train_roles": None if train_roles is None else kept,
    }  # fmt: skip


_TRAIN_ROLE_COLUMNS = ["step", "role", "metric", "value"]


def record_of(training: dict, evals: pd.DataFrame, roles: pd.DataFrame, analysis: Analysis) -> dict:
    """One cell's record from its :func:`training_part` and its evaluations (see :func:`cell_record`)."""
    record: dict = dict.fromkeys(CURVE_FIELDS)
    record["has_diagnostics"] = training["has_diagnostics"]
    record.update(training["summary"])
    record.update(dict.fromkeys(MECHANISM_FIELDS))
    if evals.empty or not (evals["step"] == 0).any():
        return record
    evals = evals.sort_values("step", kind="stable")
    steps = [int(s) for s in evals["step"].tolist()]
    se = evals["se"].tolist() if "se" in evals.columns else None
    curve = summarize_curve(steps, evals["accuracy"].tolist(), evals["n"].tolist(), analysis, se)
    record.update(asdict(curve))
    record.update(role_accuracies(roles, {"base": 0, "peak": curve.peak_step, "final": steps[-1]}))
    kept = training["signal"]
    signal = None
    if kept is not None:
        values = pd.Series(kept["values"], index=pd.Index(kept["steps"], dtype="int64"), dtype="float64")
        signal = Signal(kept["name"], kept["role"], values)
    record.update(assess(signal, curve.cliff_onset, steps, analysis, collapse=curve.signature == "collapse"))
    if training["train_roles"]:
        train_roles = pd.DataFrame(training["train_roles"], columns=_TRAIN_ROLE_COLUMNS)
        record.update(intervention_signals(train_roles.astype({"step": "int64", "value": "float64"}), curve.cliff_onset))
    elif training["train_roles"] is not None:  # no intervention was on: what intervention_signals gives for no rows
        record.update(dict.fromkeys(f"{metric}_mean" for metric in INTERVENTION_METRICS))
    return record


def cell_record(
    policy: str | None,
    evals: pd.DataFrame,
    roles: pd.DataFrame,
    diagnostics: pd.DataFrame,
    analysis: Analysis,
    train_roles: pd.DataFrame | None = None,
) -> dict:
    """One cell's record (JSON-able) from its ``evals``, eval-time ``roles``, ``diagnostics`` and
    ``train_roles`` rows."""
    return record_of(training_part(policy, diagnostics, train_roles), evals, roles, analysis)


def rows_of_cells(frame: pd.DataFrame, runs: Mapping[str, str]) -> pd.DataFrame:
    """The rows of ``frame`` (keyed by ``cell``: stored results) for each cell of ``runs``
    (cell id → the run id its results are stored under): a run's rows appear once per
    cell that is that run (``single``'s isolated cell is its shared run)."""
    if all(cell == run for cell, run in runs.items()):
        return frame[frame["cell"].isin(list(runs))]
    mapping = pd.DataFrame({"cell": list(runs), "run": list(runs.values())})
    return mapping.merge(frame.rename(columns={"cell": "run"}), on="run").drop(columns="run")


def records_frame(records: Mapping[str, dict], cells: pd.DataFrame) -> pd.DataFrame:
    """One typed row per cell of ``cells`` that has a record: ``cell``, the axes, every record field."""
    return per_cell_rows(records, cells).frame()


def per_cell_rows(records: Mapping[str, dict], cells: pd.DataFrame) -> PerCell:
    """The rows of :func:`records_frame`, each value as that frame holds it (what the tables read)."""
    names = list(cells.columns)
    at = names.index("cell")
    rows = [
        {**dict(zip(names, values)), **records[values[at]]}
        for values in zip(*(cells[column].tolist() for column in names))
        if values[at] in records
    ]
    per_role = [key for row in rows for key in row]  # the role columns some records have
    axes = ["cell", *axes_of(cells.columns)]
    columns = list(dict.fromkeys([*axes, *CURVE_FIELDS, *_DTYPES, *per_role]))
    if rows:  # the axes as ``cells`` holds them (a frame of its rows would have the same types)
        dtypes: dict[str, Any] = {axis: cells[axis].dtype for axis in axes}
    else:
        dtypes = dict(cells_frame([], axes).dtypes.items())
    dtypes["seed"] = np.dtype("int64")
    for column in columns[len(axes) :]:
        dtypes[column] = _DTYPES.get(column, "float64")
        if dtypes[column] == "object":
            # Text as a column of text holds it (NaN where missing), then as objects.
            values = [row.get(column) for row in rows]
            for row, value in zip(rows, pd.Series(values, dtype=None if values else object).astype(object).tolist()):
                row[column] = value
    return PerCell(rows, dtypes)


