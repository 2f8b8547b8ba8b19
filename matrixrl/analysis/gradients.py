"""Per-cell summaries of the per-update gradient diagnostics (docs/design.md §5).

Updates without any gradient are left out of share and norm averages.
"""

from __future__ import annotations

import pandas as pd

SUMMARY_COLUMNS = ["cell", "dominant_role", "dominant_share", "amplification_mean", "amplification_max", "amplified_role"]

AMP_MEAN, AMP_MAX, NORM_RATIO = "amp_mean", "amp_max", "norm_ratio"
"""Suffixes of the per-role columns: ``{role}_amp_mean``, ``{role}_amp_max``, ``{role}_norm_ratio``."""


def share_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One cell's role shares as a step × role table, 0 where a role did not act.

    Steps whose shares are all zero (no gradient at all) are dropped.
    """
    shares = frame[frame["kind"] == "role_share"]
    if shares.empty:
        return pd.DataFrame()
    table = shares.groupby(["step", "role"], sort=True)["value"].mean().unstack("role", fill_value=0.0)
    return table[table.sum(axis=1) > 0]


def cell_diagnostics(frame: pd.DataFrame, shares: pd.DataFrame | None = None) -> dict:
    """One cell's diagnostics summary, None where missing; docs/report.md (``diagnostics``) defines the fields."""
    row: dict = {
        "dominant_role": None,
        "dominant_share": None,
        "amplification_mean": None,
        "amplification_max": None,
        "amplified_role": None,
    }
    shares = share_table(frame) if shares is None else shares
    if not shares.empty:
        means = shares.mean(axis=0)
        best = means.idxmax()  # columns are sorted: the first maximum is the alphabetically first
        row["dominant_role"] = str(best)
        row["dominant_share"] = float(means[best])
    amp = frame[frame["kind"] == "amplification"]
    if not amp.empty:
        stats = amp.groupby("role", sort=True)["value"].agg(["mean", "max"])
        best = stats["mean"].idxmax()
        row["amplified_role"] = str(best)
        row["amplification_mean"] = float(stats.loc[best, "mean"])
        row["amplification_max"] = float(stats.loc[best, "max"])
        for role, values in stats.iterrows():
            row[f"{role}_{AMP_MEAN}"] = float(values["mean"])
            row[f"{role}_{AMP_MAX}"] = float(values["max"])
    norms = frame[frame["kind"] == "role_norm"]
    if not shares.empty:
        norms = norms[norms["step"].isin(shares.index)]
    if not norms.empty:
        mean_norm = norms.groupby("role", sort=True)["value"].mean()
        smallest = float(mean_norm.min())
        for role, value in mean_norm.items():
            row[f"{role}_{NORM_RATIO}"] = float(value) / smallest if smallest > 0 else None
    return row


def summarize_diagnostics(rows_per_step: pd.DataFrame) -> pd.DataFrame:
    """One row per cell (sorted) with the ``SUMMARY_COLUMNS`` of :func:`cell_diagnostics`; test missing with
    ``pd.isna``."""
    if rows_per_step.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    out = [{"cell": cell, **cell_diagnostics(frame)} for cell, frame in rows_per_step.groupby("cell", sort=True)]
    table = pd.DataFrame(out).reindex(columns=SUMMARY_COLUMNS)
    for column in ("dominant_share", "amplification_mean", "amplification_max"):
        table[column] = table[column].astype(float)
    return table
