"""Comparisons between policy modes, and against the single-agent control (design.md §2).

Two kinds of row:

- ``isolated - shared`` per (workflow, task, scale): the isolated cell minus the
  shared cell of the same seed (``policy`` is empty: the row compares across it);
- ``WORKFLOW - single`` per (workflow, task, scale, policy) for every multi-agent
  workflow: the workflow's cell minus the ``single`` cell of the same task, scale,
  policy and seed — the control the study uses.

Cells are paired by seed (same base model, same problems, same seed), and only
seeds present on both sides count (``n_pairs``). For peak, final, gain and the
cliff indicator (whose mean difference is the difference in cliff rate) the table
gives the mean paired difference and its Student-t interval (see
``matrixrl.analysis.seeds``), which needs two pairs or more; with one pair the
bounds are missing. For the 0/1 cliff indicator and few seeds this interval is a
rough guide only.
"""

from __future__ import annotations

import pandas as pd

from matrixrl.analysis.seeds import t_interval

CONTROL = "single"
POLICY_PAIR = ("isolated", "shared")
METRICS = ("peak", "final", "gain", "cliff_rate")
COMPARE_COLUMNS = [
    "workflow", "task", "scale", "policy", "comparison", "n_pairs",
    *(f"{metric}_{part}" for metric in METRICS for part in ("diff", "lo", "hi")),
]  # fmt: skip


def _values(cells: pd.DataFrame) -> pd.DataFrame:
    return cells.set_index("seed")[["peak", "final", "gain"]].assign(cliff_rate=cells.set_index("seed")["cliff"].astype(float))


def paired_row(treated: pd.DataFrame, control: pd.DataFrame, confidence: float) -> dict:
    """Mean paired difference (treated − control) per metric over the seeds both have."""
    a, b = _values(treated), _values(control)
    seeds = a.index.intersection(b.index)
    row: dict = {"n_pairs": len(seeds)}
    for metric in METRICS:
        diff = a.loc[seeds, metric] - b.loc[seeds, metric]
        row[f"{metric}_diff"], row[f"{metric}_lo"], row[f"{metric}_hi"] = t_interval(diff, confidence)
    return row


def compare_table(per_cell: pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """The comparison rows (``COMPARE_COLUMNS``) that ``per_cell`` has cells for.

    ``per_cell``: one row per cell with the axes and ``peak, final, gain, cliff``.
    Rows with no seed in common are left out.
    """
    rows = []
    treated_mode, control_mode = POLICY_PAIR
    for (workflow, task, scale), group in per_cell.groupby(["workflow", "task", "scale"], sort=False):
        by_policy = dict(tuple(group.groupby("policy", sort=False)))
        if treated_mode in by_policy and control_mode in by_policy:
            row = paired_row(by_policy[treated_mode], by_policy[control_mode], confidence)
            rows.append({"workflow": workflow, "task": task, "scale": scale, "policy": None,
                         "comparison": f"{treated_mode} - {control_mode}", **row})  # fmt: skip
        if workflow == CONTROL:
            continue
        for policy, cells in by_policy.items():
            control = per_cell[
                (per_cell["workflow"] == CONTROL) & (per_cell["task"] == task)
                & (per_cell["scale"] == scale) & (per_cell["policy"] == policy)
            ]  # fmt: skip
            if not control.empty:
                row = paired_row(cells, control, confidence)
                rows.append({"workflow": workflow, "task": task, "scale": scale, "policy": policy,
                             "comparison": f"{workflow} - {CONTROL}", **row})  # fmt: skip
    table = pd.DataFrame(rows, columns=COMPARE_COLUMNS)
    table = table[table["n_pairs"] > 0].reset_index(drop=True)
    return table.astype({"n_pairs": "int64"})
