"""Per-cell summaries of the per-update gradient diagnostics (design.md §3)."""

from __future__ import annotations

import math

import pandas as pd

SUMMARY_COLUMNS = ["cell", "dominant_role", "dominant_share", "amplification_mean", "amplification_max", "amplified_role"]


def summarize_diagnostics(rows_per_step: pd.DataFrame) -> pd.DataFrame:
    """One row per cell from the long rows of many updates.

    Input: the rows of ``gradient_diagnostics`` with ``cell`` and ``step`` columns
    added. Output columns (``SUMMARY_COLUMNS``), cells sorted:

    - ``dominant_role`` / ``dominant_share``: the role with the highest mean
      ``role_share`` over the cell's steps, and that mean. A role missing from a
      step that has ``role_share`` rows (it did not act) counts as share 0 there,
      so the mean shares of a cell still sum to at most 1. Ties go to the role
      whose name sorts first. Missing when the cell has no ``role_share`` rows.
    - ``amplified_role``, ``amplification_mean``, ``amplification_max``: among
      roles with ``amplification`` rows (roles with several agents), the one with
      the highest mean amplification over the steps where it was defined, with
      that mean and its maximum. Missing when no role has several agents.

    "Missing" means ``pd.isna(value)`` is true: NaN in the float columns, and in
    the role columns whatever missing marker the installed pandas stores for a
    ``None`` (NaN under pandas 3's string dtype), so test with ``pd.isna``.
    """
    if rows_per_step.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    out = []
    for cell, frame in rows_per_step.groupby("cell", sort=True):
        row = {"cell": cell, "dominant_role": None, "dominant_share": math.nan,
               "amplification_mean": math.nan, "amplification_max": math.nan, "amplified_role": None}
        shares = frame[frame["kind"] == "role_share"]
        if not shares.empty:
            table = shares.pivot_table(index="step", columns="role", values="value", aggfunc="mean")
            means = table.fillna(0.0).mean(axis=0).sort_index()
            best = means.idxmax()
            row["dominant_role"] = best
            row["dominant_share"] = float(means[best])
        amp = frame[frame["kind"] == "amplification"]
        if not amp.empty:
            stats = amp.groupby("role", sort=True)["value"].agg(["mean", "max"])
            best = stats["mean"].idxmax()
            row["amplified_role"] = best
            row["amplification_mean"] = float(stats.loc[best, "mean"])
            row["amplification_max"] = float(stats.loc[best, "max"])
        out.append(row)
    return pd.DataFrame(out, columns=SUMMARY_COLUMNS)
