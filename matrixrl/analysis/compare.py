"""Comparisons between policy modes, and against the single-agent control (docs/design.md §4).

Two kinds of row:

- ``isolated - shared`` per (workflow, task, scale): the isolated cell minus the
  shared cell of the same seed (``policy`` is empty: the row compares across it);
- ``WORKFLOW - single`` per (workflow, task, scale, policy) for every multi-agent
  workflow: the workflow's cell minus the ``single`` cell of the same task, scale,
  policy and seed — the control the study uses.

A workflow whose isolated cells are its shared runs (one role, ``grid.run_of``;
``per_cell``'s ``run`` column says) has no ``isolated - shared`` row: it would be
zero by construction.

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


def paired_row(treated: pd.DataFrame, control: pd.DataFrame, confidence: float) -> dict:
    """Mean paired difference (treated − control) per metric over the seeds both have.

    Both frames: one row per seed with ``seed, peak, final, gain, cliff``.
    """
    a, b = _by_seed(treated), _by_seed(control)
    seeds = [seed for seed in a if seed in b]
    row: dict = {"n_pairs": len(seeds)}
    for i, metric in enumerate(METRICS):
        diff = [a[seed][i] - b[seed][i] for seed in seeds]
        row[f"{metric}_diff"], row[f"{metric}_lo"], row[f"{metric}_hi"] = t_interval(diff, confidence)
    return row


def _by_seed(cells: pd.DataFrame) -> dict[int, tuple[float, float, float, float]]:
    # Plain tuples: a handful of seeds per side, where pandas joins cost milliseconds each.
    columns = [cells[c].astype(float).tolist() for c in ("peak", "final", "gain", "cliff")]
    return {int(seed): values for seed, *values in zip(cells["seed"].tolist(), *columns)}


def compare_table(per_cell: pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """The comparison rows (``COMPARE_COLUMNS``) that ``per_cell`` has cells for.

    ``per_cell``: one row per cell with the axes and ``peak, final, gain, cliff``.
    Rows with no seed in common are left out.
    """
    values = ["seed", "peak", "final", "gain", "cliff"]
    if "run" in per_cell.columns:
        values.append("run")
    per_cell = per_cell[["workflow", "task", "scale", "policy", *values]]
    cells = {key: group[values] for key, group in per_cell.groupby(["workflow", "task", "scale", "policy"], sort=False)}
    rows = []
    treated_mode, control_mode = POLICY_PAIR
    for (workflow, task, scale), group in per_cell.groupby(["workflow", "task", "scale"], sort=False):
        by_policy = {policy: cells[(workflow, task, scale, policy)] for policy in group["policy"].unique()}
        paired = treated_mode in by_policy and control_mode in by_policy
        if paired and "run" in values:
            paired = set(by_policy[treated_mode]["run"]) != set(by_policy[control_mode]["run"])
        if paired:
            row = paired_row(by_policy[treated_mode], by_policy[control_mode], confidence)
            rows.append({"workflow": workflow, "task": task, "scale": scale, "policy": None,
                         "comparison": f"{treated_mode} - {control_mode}", **row})  # fmt: skip
        if workflow == CONTROL:
            continue
        for policy, treated in by_policy.items():
            control = cells.get((CONTROL, task, scale, policy))
            if control is not None:
                row = paired_row(treated, control, confidence)
                rows.append({"workflow": workflow, "task": task, "scale": scale, "policy": policy,
                             "comparison": f"{workflow} - {CONTROL}", **row})  # fmt: skip
    table = pd.DataFrame(rows, columns=COMPARE_COLUMNS)
    table = table[table["n_pairs"] > 0].reset_index(drop=True)
    return table.astype({"n_pairs": "int64"})
