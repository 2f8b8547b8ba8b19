"""The mechanism test (docs/design.md §5): does the claimed signal rise before a cliff?

The study claims that under isolated policies (IP) parallel same-role agents add up
their gradients and drive the late collapse, and that under a shared policy (SP)
the role with the most gradient mass captures the policy. Per cell:

**Signal** (one value per training update, from the gradient diagnostics):

- ``isolated``: ``amplification`` — at each update, the largest amplification
  ‖Σ g_i‖ / mean ‖g_i‖ among the roles with several agents. A cell without such a
  role (``single``, ``eval_opt``) has no signal.
- ``shared``: ``share`` — the dominant role's gradient-mass share at each update
  (the dominant role is the one with the highest mean share over the run, as in
  the diagnostics table; 0 at updates where it did not act). Updates without any
  gradient are skipped. A cell with one role (``single``) has no signal: its share
  is 1 at every update.

**Rise.** ``baseline`` is the mean signal over the first ``baseline_steps``
updates that have a value. The signal is smoothed by a trailing mean over
``smooth_steps`` updates (no look-ahead). The signal *rises* at the first update
after the baseline window whose smoothed value exceeds ``baseline × (1 + rise)``;
``rise_step`` is that update's step (1-based, as stored). ``change`` is the largest
smoothed value in the tested span relative to the baseline, minus 1 (so ``rose``
iff ``change > rise``; missing when the baseline is 0). The tested span runs from
the end of the baseline window to ``cliff_onset`` in a cliff cell, and to the last
update in a cell without a cliff.

**Verdict** of a cliff cell, where the cliff happened between the checkpoint
before the onset (step P) and the onset checkpoint (step O):

- ``precedes``: the signal rose at an update ≤ P, before the checkpoint interval
  in which the cliff happened; ``lead`` = O − rise_step, in training steps;
- ``coincides``: it first rose within that interval (P < rise_step ≤ O);
- ``absent``: it did not rise by O;
- ``n/a``: no signal, or the onset falls inside the baseline window.

Cells without a cliff get the same ``baseline``, ``change``, ``rose`` and
``rise_step`` over their whole run and the verdict ``no cliff`` (``n/a`` without
a signal), so one can see whether the signal rises as often where nothing
collapses — that is, whether it discriminates at all. A ``collapse`` (the run fell
far below its base without a real peak, ``analysis.curves``) gets the same figures
and the verdict ``collapse``: it has no cliff for the signal to precede, and it is
no calm run either, so it counts on neither side.
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
