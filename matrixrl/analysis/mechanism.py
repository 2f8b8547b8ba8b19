"""The mechanism test (docs/design.md §5): does the claimed signal rise before a cliff?

The signal, its baseline and the verdict: docs/report.md, the ``mechanism`` table. ``rise_step`` is 1-based,
as stored.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pandas as pd

from matrixrl.analysis.gradients import share_table
from matrixrl.analysis.axes import axes_of
from matrixrl.config import Analysis

VERDICTS = ("precedes", "coincides", "absent", "n/a", "no cliff", "collapse")
FIELDS = ("signal", "signal_role", "baseline", "change", "rose", "rise_step", "lead", "verdict")


@dataclass(frozen=True)
class Signal:
    name: str
    """``amplification`` or ``share``."""
    role: str
    """The role(s) it is measured on (``+``-joined when several roles have several agents)."""
    values: pd.Series
    """Indexed by training step, increasing."""


def signal_of(frame: pd.DataFrame, policy: str, dominant_role: str | None, shares: pd.DataFrame | None = None) -> Signal | None:
    """The cell's signal (see the module docstring) from its diagnostics rows, or None.

    ``shares``: the cell's ``share_table``, if already computed.
    """
    if frame.empty:
        return None
    if policy == "isolated":
        amp = frame[frame["kind"] == "amplification"]
        if amp.empty:
            return None
        values = amp.groupby("step", sort=True)["value"].max()
        return Signal("amplification", "+".join(sorted(amp["role"].unique())), values.astype(float))
    shares = share_table(frame) if shares is None else shares
    if shares.shape[1] < 2 or dominant_role not in shares.columns:
        return None
    return Signal("share", dominant_role, shares[dominant_role].astype(float))


def assess(
    signal: Signal | None, cliff_onset: int | None, eval_steps: list[int], analysis: Analysis, *, collapse: bool = False
) -> dict:
    """The mechanism fields of one cell (``FIELDS``; see the module docstring); ``collapse``: the
    cell's run collapsed (its ``signature``), which only a cell without a cliff can."""
    out = {"signal": None, "signal_role": None, "baseline": None, "change": None, "rose": None,
           "rise_step": None, "lead": None, "verdict": "n/a"}  # fmt: skip
    if signal is None:
        return out
    out["signal"], out["signal_role"] = signal.name, signal.role
    values = signal.values.sort_index()
    k = analysis.mechanism_baseline_steps
    if len(values) <= k:
        return out
    baseline = float(values.iloc[:k].mean())
    out["baseline"] = baseline
    smoothed = values.rolling(analysis.mechanism_smooth_steps, min_periods=1).mean().iloc[k:]
    if cliff_onset is not None:
        smoothed = smoothed[smoothed.index <= cliff_onset]
    if smoothed.empty:
        return out  # the onset falls inside the baseline window: nothing to test
    risen = smoothed[smoothed > baseline * (1 + analysis.mechanism_rise)]
    rise_step = int(risen.index[0]) if not risen.empty else None
    out["change"] = float(smoothed.max()) / baseline - 1 if baseline > 0 else None
    out["rose"] = rise_step is not None
    out["rise_step"] = rise_step
    if cliff_onset is None:
        out["verdict"] = "collapse" if collapse else "no cliff"
        return out
    before = [s for s in eval_steps if s < cliff_onset]
    interval_start = max(before) if before else 0
    if rise_step is None:
        out["verdict"] = "absent"
    else:
        out["lead"] = cliff_onset - rise_step
        out["verdict"] = "precedes" if rise_step <= interval_start else "coincides"
    return out


def mechanism_caption(table: pd.DataFrame) -> str:
    """One line: how often the signal preceded cliffs, and how often it rose without one."""
    rows = list(zip(table["cliff"].tolist(), table["verdict"].tolist(), table["rose"].tolist()))
    counted = Counter(verdict for cliff, verdict, _ in rows if bool(cliff) and verdict != "n/a")
    calm = [bool(rose) for cliff, verdict, rose in rows if not bool(cliff) and verdict == "no cliff"]
    collapses = sum(verdict == "collapse" for _, verdict, _ in rows)
    return (
        f"cliff cells with a signal: {counted['precedes']} precede, {counted['coincides']} coincide, "
        f"{counted['absent']} absent (of {counted.total()}); "
        f"cells without a cliff: the signal rose in {sum(calm)} of {len(calm)}"
        + (f"; {collapses} collapse{'s' if collapses > 1 else ''} (no real peak) in neither" if collapses else "")
    )


MECHANISM_COLUMNS = ["cliff", "cliff_onset", *FIELDS, "kl_mean", "damper_scale_mean"]
"""``kl_mean``, ``damper_scale_mean``: the interventions' signals up to the onset (all steps without a cliff)."""


def mechanism_table(per_cell) -> pd.DataFrame:
    """Cells with a base evaluation: ``cell``, the axes, then ``MECHANISM_COLUMNS``.

    ``per_cell``: the per-cell frame, or its ``analysis.cell.PerCell``."""
    from matrixrl.analysis.axes import PerCell, missing

    per_cell = PerCell.of(per_cell)
    rows = per_cell.where(lambda row: not missing(row["base"]))
    return rows.frame(["cell", *axes_of(per_cell.columns), *MECHANISM_COLUMNS], {"cliff": "bool"})
