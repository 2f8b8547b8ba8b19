"""Comparisons between policy modes, and against the single-agent control (docs/design.md §4).

The rows and columns: docs/report.md, "The tables and their columns" (``compare``).
"""

from __future__ import annotations

import math

import pandas as pd

from matrixrl.analysis.axes import PerCell, cells_frame, extra_axes, grouped, grouped_rows, typed
from matrixrl.analysis.seeds import t_interval
from matrixrl.config.sweeps import spelled as _text

CONTROL = "single"
POLICY_PAIR = ("isolated", "shared")
METRICS = ("peak", "final", "gain", "cliff_rate", "collapse_rate")
COMPARE_COLUMNS = [
    "workflow", "task", "scale", "policy", "comparison", "n_pairs",
    *(f"{metric}_{part}" for metric in METRICS for part in ("diff", "lo", "hi")),
]  # fmt: skip


def paired_row(treated: pd.DataFrame, control: pd.DataFrame, confidence: float) -> dict:
    """Mean paired difference (treated − control) per metric over the seeds both frames have."""
    a, b = _by_seed(treated), _by_seed(control)
    seeds = [seed for seed in a if seed in b]
    row: dict = {"n_pairs": len(seeds)}
    for i, metric in enumerate(METRICS):
        diff = [a[seed][i] - b[seed][i] for seed in seeds]
        row[f"{metric}_diff"], row[f"{metric}_lo"], row[f"{metric}_hi"] = t_interval(diff, confidence)
    return row


def _by_seed(cells: pd.DataFrame | list[dict]) -> dict[int, tuple[float, ...]]:
    # Plain tuples: a handful of seeds per side, where pandas joins cost milliseconds each.
    columns = [[float(v) for v in _listed(cells, c)] for c in ("peak", "final", "gain", "cliff")]
    has_signature = "signature" in (cells.columns if isinstance(cells, pd.DataFrame) else (cells[0] if cells else {}))
    signatures = _listed(cells, "signature") if has_signature else [None] * len(columns[0])
    columns.append([math.nan if not isinstance(s, str) else float(s == "collapse") for s in signatures])
    return {int(seed): values for seed, *values in zip(_listed(cells, "seed"), *columns)}


def _listed(cells: pd.DataFrame | list[dict], column: str) -> list:
    """A column of a frame, or of a group of rows (``analysis.axes.grouped_rows``), as a list."""
    return cells[column].tolist() if isinstance(cells, pd.DataFrame) else [cell[column] for cell in cells]


def compare_table(per_cell: PerCell | pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """The built-in comparison rows (``COMPARE_COLUMNS``) that ``per_cell`` has cells for, paired on every
    other axis."""
    per_cell = PerCell.of(per_cell)
    extra = extra_axes(per_cell.columns)
    keys = ["workflow", "task", "scale", "policy", *extra]
    cells = dict(grouped_rows(per_cell.rows, keys))
    rows = []
    treated_mode, control_mode = POLICY_PAIR
    others = ["workflow", "task", "scale", *extra]
    for key, group in grouped_rows(per_cell.rows, others):
        workflow, task, scale, *sweep = key
        axes = {"workflow": workflow, "task": task, "scale": scale, **dict(zip(extra, sweep))}
        by_policy = {
            policy: cells[(workflow, task, scale, policy, *sweep)] for policy in dict.fromkeys(cell["policy"] for cell in group)
        }
        paired = treated_mode in by_policy and control_mode in by_policy
        if paired and "run" in per_cell.dtypes:
            paired = {cell["run"] for cell in by_policy[treated_mode]} != {cell["run"] for cell in by_policy[control_mode]}
        if paired:
            row = paired_row(by_policy[treated_mode], by_policy[control_mode], confidence)
            rows.append({**axes, "policy": None, "comparison": f"{treated_mode} - {control_mode}", **row})
        if workflow == CONTROL:
            continue
        for policy, treated in by_policy.items():
            control = _control_of(cells, (CONTROL, task, scale, policy), sweep)
            if control is not None:
                row = paired_row(treated, control, confidence)
                rows.append({**axes, "policy": policy, "comparison": f"{workflow} - {CONTROL}", **row})
    columns = [*COMPARE_COLUMNS[:4], *extra, *COMPARE_COLUMNS[4:]]
    table = cells_frame(rows, columns)
    table = table[table["n_pairs"] > 0].reset_index(drop=True)
    return typed(table, {"n_pairs": "int64"})


def against_table(per_cell: pd.DataFrame, axis: str, control, confidence: float = 0.95) -> pd.DataFrame:
    """Each value of ``axis`` against its ``control`` value (``compare --against AXIS=VALUE``), paired as in
    :func:`compare_table`."""
    extra = extra_axes(per_cell.columns)
    keys = [a for a in ["workflow", "task", "scale", "policy", *extra] if a != axis]
    values = ["seed", "peak", "final", "gain", "cliff"]
    if "signature" in per_cell.columns:
        values.append("signature")
    if "amplification_mean" in per_cell.columns:
        values.append("amplification_mean")
    per_cell = per_cell[per_cell[axis].notna()]
    wanted = _text(control)
    rows = []
    for key, group in grouped(per_cell, keys):
        axes = dict(zip(keys, key))
        by_value = {_text(v): (v, g[values]) for (v,), g in grouped(group, [axis])}
        if wanted not in by_value:
            continue
        _, control_cells = by_value[wanted]
        for text, (value, treated) in by_value.items():
            if text == wanted:
                continue
            row = paired_row(treated, control_cells, confidence)
            row.update(_paired_amplification(treated, control_cells, confidence))
            rows.append({**axes, axis: value, "comparison": f"{axis}={text} - {axis}={wanted}", **row})
    columns = ["workflow", "task", "scale", "policy", *extra, *COMPARE_COLUMNS[4:], *AGAINST_COLUMNS]
    table = cells_frame(rows, columns)
    table = table[table["n_pairs"] > 0].reset_index(drop=True)
    return table.astype({"n_pairs": "int64"})


AGAINST_COLUMNS = ["amplification_diff", "amplification_lo", "amplification_hi"]


def _paired_amplification(treated: pd.DataFrame, control: pd.DataFrame, confidence: float) -> dict:
    """Mean paired difference of the cells' mean amplification, over the seeds where both have one."""
    if "amplification_mean" not in treated.columns:
        return dict.fromkeys(AGAINST_COLUMNS)
    a = dict(zip(treated["seed"].astype(int), treated["amplification_mean"].astype(float)))
    b = dict(zip(control["seed"].astype(int), control["amplification_mean"].astype(float)))
    diffs = [a[s] - b[s] for s in a if s in b and not (pd.isna(a[s]) or pd.isna(b[s]))]
    return dict(zip(AGAINST_COLUMNS, t_interval(diffs, confidence)))


def _control_of(cells: dict, fixed: tuple, sweep: list) -> pd.DataFrame | None:
    """The control's cells: the same extra-axis values, or none where the axis leaves the control alone."""
    for key, frame in cells.items():
        if key[:4] == fixed and all(theirs is None or theirs == ours for theirs, ours in zip(key[4:], sweep)):
            return frame
    return None
