"""Pure functions that summarize per-cell accuracy curves (docs/design.md §4 defines every term).

For each training run ("cell"): the accuracy at each evaluated checkpoint, step 0 (the base model)
first, each with its standard error (a missing one is the binomial sqrt(a(1-a)/n); an SE of 0 is
taken as 1/n, the resolution of n problems, so every z is finite).

- ``base``, ``peak``/``peak_step`` (earliest on ties), ``final``, ``final_tail`` (mean of the last
  ``final_tail_k``); ``gain`` = final - base, ``peak_gain`` = peak - base, and both in SEs of the
  difference (``gain_z``, ``peak_gain_z``; the latter biased up: the peak is a best of several);
- ``cliff``: a real rise over the base read over windows of :func:`rise_window` readings at
  :func:`rise_threshold` (for the base's variance against the readings'), then a fall of
  ``cliff_delta`` and ``cliff_noise_se`` SEs from it that holds the last :data:`FALL_READINGS`
  checkpoints; ``cliff_onset`` starts that final run below
  the threshold, ``pre_onset`` is the checkpoint before it;
- ``signature``: how the run ended, the first that applies of :data:`SIGNATURES`: ``cliff``;
  ``collapse`` (ends ``cliff_delta`` and ``cliff_noise_se`` SEs below its base without a cliff);
  ``decline`` (final below the run's own peak beyond noise); ``gain``; else ``no gain``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import astuple, dataclass, fields
from functools import lru_cache
from statistics import NormalDist
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from matrixrl.config import Analysis

# Absorbs float rounding in "<= peak - delta" (e.g. 0.7 - 0.1 == 0.5999999999999999).
_TOL = 1e-12

SIGNATURES = ("cliff", "collapse", "decline", "no gain", "gain")
"""Every ``signature`` a run can end with, the failures first (all but ``gain``)."""


@dataclass(frozen=True)
class CurveSummary:
    """Summary of one cell's accuracy curve (see the module docstring)."""

    base: float
    peak: float
    peak_step: int
    final: float
    final_tail: float
    gain: float
    peak_gain: float
    gain_z: float
    peak_gain_z: float
    cliff: bool
    cliff_onset: int | None
    n_checkpoints: int
    drop_z: float
    pre_onset: int | None
    signature: str
    base_se: float


def _as_int(value: object, what: str) -> int:
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    try:
        as_float = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be an integer, got {value!r}") from None
    if not as_float.is_integer():
        raise ValueError(f"{what} must be an integer, got {value!r}")
    return int(as_float)


@lru_cache(maxsize=256)
def rise_threshold(windows: int, w: int, noise_se: float, base_ratio: float = 1.0) -> float:
    """The z over the base reading that the best of ``windows`` windows of ``w`` readings must reach to be a
    real rise: the quantile of the best window's z in runs that stay flat at their base, at the one-sided level
    of ``noise_se`` standard normal SEs (2.3% for 2), so that such runs pass it as often as one reading passes
    ``noise_se``. The windows share the base reading and overlap, so the quantile is taken from 100,000 seeded
    draws of flat noise (the base's variance ``base_ratio`` times a reading's), not from a bound; ``noise_se``
    0 asks for no margin."""
    if noise_se <= 0:
        return 0.0
    if windows < 1:
        return math.inf
    rng = np.random.default_rng(20261207)
    best = []
    for _ in range(10):  # 10 chunks of 10,000 runs: memory stays small on long schedules
        readings = rng.standard_normal((10_000, windows + w - 1))
        sums = np.cumsum(np.pad(readings, ((0, 0), (1, 0))), axis=1)
        best.append((sums[:, w:] - sums[:, :-w]).max(axis=1) / w - math.sqrt(base_ratio) * rng.standard_normal(10_000))
    z = np.concatenate(best) / math.sqrt(base_ratio + 1 / w)
    return float(np.quantile(z, NormalDist().cdf(noise_se)))


def base_ratio(var: np.ndarray) -> np.ndarray:
    """Per row of squared SEs ``var`` (base first): the base's variance over the mean of the readings
    after it, rounded down to a twentieth and at most 2 (down: a higher threshold, never a laxer one)."""
    ratio = var[:, 0] / var[:, 1:].mean(axis=1) if var.shape[1] > 1 else np.ones(len(var))
    return np.clip(np.floor(ratio * 20) / 20, 0.0, 2.0)


def rise_thresholds(windows: int, w: int, noise_se: float, ratios: np.ndarray) -> np.ndarray:
    """:func:`rise_threshold` for each of ``ratios`` (from :func:`base_ratio`)."""
    found = {float(r): rise_threshold(windows, w, noise_se, float(r)) for r in np.unique(ratios)}
    return np.array([found[float(r)] for r in ratios])


FALL_READINGS = 2
"""A terminal fall holds this many last checkpoints (fewer where fewer follow the peak)."""


def rise_window(readings: int) -> int:
    """How many adjacent readings a cliff's rise and fall are averaged over, on a schedule of
    ``readings`` checkpoints after the base: (isqrt(readings) + 1) // 2, at least 1. One reading
    below 9 (the default study's 4), 2 from 9 to 24 (the long study's 15), 4 from 49 to 80 (the
    paper's 50): the window's SE shrinks by its square root while it stays short against the run."""
    return max(1, (math.isqrt(max(readings, 0)) + 1) // 2)


def _rise_and_fall(acc: np.ndarray, var: np.ndarray, w: int, noise_se: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row of ``acc`` (cells × checkpoints, base first) and its squared SEs ``var``: the z of the
    best window of ``w`` readings after the base over the base reading, the z of that window over the
    last ``w`` readings, and the rise's :func:`rise_threshold` for the windows it was picked from and
    the row's :func:`base_ratio` (z = -inf for both where the run is shorter than two windows). The
    one implementation both summaries use."""
    cells, k = acc.shape
    if k < 2 * w:
        return np.full(cells, -np.inf), np.full(cells, -np.inf), np.full(cells, math.inf)
    view = np.lib.stride_tricks.sliding_window_view
    means = view(acc[:, 1:], w, axis=1).sum(axis=2) / w
    variances = view(var[:, 1:], w, axis=1).sum(axis=2) / (w * w)
    best = means.argmax(axis=1)  # the first best window on ties
    rows = np.arange(cells)
    mean, variance = means[rows, best], variances[rows, best]
    tail, tail_var = acc[:, k - w :].sum(axis=1) / w, var[:, k - w :].sum(axis=1) / (w * w)
    rise = (mean - acc[:, 0]) / np.sqrt(variance + var[:, 0])
    threshold = rise_thresholds(means.shape[1], w, noise_se, base_ratio(var))
    return rise, (mean - tail) / np.sqrt(variance + tail_var), threshold


def _z(difference: float, se: float) -> float:
    return difference / se  # se > 0: each checkpoint's is at least 1/n (the module docstring)


def summarize_curve(
    steps: Sequence[int],
    accuracies: Sequence[float],
    n_eval: int | Sequence[int],
    analysis: Analysis,
    se: Sequence[float | None] | None = None,
) -> CurveSummary:
    """Summarize one accuracy curve.

    ``n_eval`` is the number of evaluation problems, either one int for every
    checkpoint or one per checkpoint. ``se``: each checkpoint's standard error; a
    missing one (None or NaN) is taken as binomial from ``n_eval``.
    """
    step_list = [_as_int(s, "steps") for s in steps]
    acc = [float(a) for a in accuracies]
    if not step_list:
        raise ValueError("need at least one checkpoint")
    if len(step_list) != len(acc):
        raise ValueError(f"steps and accuracies differ in length ({len(step_list)} vs {len(acc)})")
    if any(b <= a for a, b in zip(step_list, step_list[1:])):
        raise ValueError(f"steps must be strictly increasing, got {step_list}")
    if step_list[0] != 0:
        raise ValueError(f"first checkpoint must be step 0 (the base model), got step {step_list[0]}")
    bad = [a for a in acc if not 0.0 <= a <= 1.0]  # also catches NaN
    if bad:
        raise ValueError(f"accuracies must be within [0, 1], got {bad[0]!r}")
    if isinstance(n_eval, Sequence) or isinstance(n_eval, np.ndarray):
        ns = [_as_int(n, "n_eval") for n in n_eval]
        if len(ns) != len(acc):
            raise ValueError(f"n_eval has {len(ns)} entries for {len(acc)} checkpoints")
    else:
        ns = [_as_int(n_eval, "n_eval")] * len(acc)
    if any(n < 1 for n in ns):
        raise ValueError(f"n_eval must be >= 1, got {min(ns)}")

    last = len(acc) - 1
    peak_i = int(np.argmax(acc))  # argmax returns the first maximum: earliest on ties
    base, peak, final = acc[0], acc[peak_i], acc[last]
    k = min(analysis.final_tail_k, len(acc))
    final_tail = float(np.mean(acc[-k:]))

    threshold = peak - analysis.cliff_delta
    below = [a <= threshold + _TOL for a in acc]
    run_start = len(acc)
    while run_start > 0 and below[run_start - 1]:
        run_start -= 1
    # With delta == 0 the peak itself is "below"; the onset must still come after it.
    onset_i = max(run_start, peak_i + 1)

    errors = [None] * len(acc) if se is None else list(se)
    if len(errors) != len(acc):
        raise ValueError(f"se has {len(errors)} entries for {len(acc)} checkpoints")

    def error(i: int) -> float:
        given = errors[i]
        if given is None or given != given:  # None or NaN: a result without its own SE
            given = math.sqrt(acc[i] * (1 - acc[i]) / ns[i])
        # An SE of 0 is the resolution of n problems, 1/n (the module docstring): never an infinite z.
        return float(given) if given > 0 else 1.0 / ns[i]

    noise = analysis.cliff_noise_se
    drop = peak - final
    se_drop = math.hypot(error(peak_i), error(last))
    peak_gain_z = _z(peak - base, math.hypot(error(peak_i), error(0)))
    ses = np.array([error(i) for i in range(len(acc))])
    w = rise_window(last)
    rises, falls, thresholds = _rise_and_fall(np.array([acc]), np.array([ses * ses]), w, noise)
    rise_z, fall_z = float(rises[0]), float(falls[0])
    # A peak at the base is no peak: a run that only fell is the optimizer failing, not a cliff.
    real_peak = peak_i > 0 and rise_z >= float(thresholds[0])
    held = min(FALL_READINGS, last - peak_i)  # the last readings the fall must hold
    cliff = real_peak and held > 0 and fall_z > noise and onset_i <= last - held + 1
    drop_z = _z(drop, se_drop)
    gain_z = _z(final - base, math.hypot(error(last), error(0)))
    collapse = not cliff and final <= base - analysis.cliff_delta + _TOL and -gain_z > noise
    if cliff:
        signature = "cliff"
    elif collapse:
        signature = "collapse"
    else:
        signature = "decline" if drop_z > noise else "gain" if gain_z > noise else "no gain"

    return CurveSummary(
        base=base,
        peak=peak,
        peak_step=step_list[peak_i],
        final=final,
        final_tail=final_tail,
        gain=final - base,
        peak_gain=peak - base,
        gain_z=gain_z,
        peak_gain_z=peak_gain_z,
        cliff=bool(cliff),
        cliff_onset=step_list[onset_i] if cliff else None,
        n_checkpoints=len(acc),
        drop_z=drop_z,
        pre_onset=step_list[onset_i - 1] if cliff else None,
        signature=signature,
        base_se=error(0),
    )


def summarize_curves(steps: Sequence[int], accuracy: np.ndarray, n_eval: np.ndarray, analysis: Analysis,
                     base_n_eval: np.ndarray | None = None) -> dict[str, np.ndarray | list]:  # fmt: skip
    """:func:`summarize_curve` over many curves at once (numpy): ``accuracy`` is cells × checkpoints on the
    shared ``steps`` (0 first), ``n_eval`` the trials of each cell's evaluations (``base_n_eval``: of its base
    evaluation, if other), every SE the binomial one (0 taken as 1/n). Returns each :class:`CurveSummary` field
    as an array over the cells (``cliff_onset`` and ``pre_onset`` as lists, None without a cliff; ``signature``
    a list). The calibration's simulations read it; tests/test_calibration.py checks it against
    :func:`summarize_curve` curve by curve."""
    acc = np.asarray(accuracy, dtype=float)
    cells, k = acc.shape
    n = np.asarray(n_eval, dtype=float).reshape(-1, 1) * np.ones((1, k))
    if base_n_eval is not None:
        n[:, 0] = np.asarray(base_n_eval, dtype=float)
    step = np.asarray(steps)
    rows = np.arange(cells)
    last = k - 1
    se = np.sqrt(acc * (1 - acc) / n)
    se = np.where(se > 0, se, 1.0 / n)
    peak_i = acc.argmax(axis=1)
    base, peak, final = acc[:, 0], acc[rows, peak_i], acc[:, last]
    tail = min(analysis.final_tail_k, k)
    below = acc <= (peak - analysis.cliff_delta)[:, None] + _TOL
    above = ~below
    last_above = np.where(above.any(axis=1), last - above[:, ::-1].argmax(axis=1), -1)
    onset_i = np.maximum(last_above + 1, peak_i + 1)
    noise = analysis.cliff_noise_se
    drop = peak - final
    se_drop = np.hypot(se[rows, peak_i], se[:, last])
    peak_gain_z = (peak - base) / np.hypot(se[rows, peak_i], se[:, 0])
    w = rise_window(last)
    rise_z, fall_z, threshold = _rise_and_fall(acc, se * se, w, noise)
    real_peak = (peak_i > 0) & (rise_z >= threshold)
    held = np.minimum(FALL_READINGS, last - peak_i)
    cliff = real_peak & (held > 0) & (fall_z > noise) & (onset_i <= last - held + 1)
    drop_z = drop / se_drop
    gain_z = (final - base) / np.hypot(se[:, last], se[:, 0])
    collapse = ~cliff & (final <= base - analysis.cliff_delta + _TOL) & (-gain_z > noise)
    signature = np.select(
        [cliff, collapse, drop_z > noise, gain_z > noise], ["cliff", "collapse", "decline", "gain"], "no gain"
    ).tolist()
    onset = [int(step[i]) if c else None for i, c in zip(onset_i.tolist(), cliff.tolist())]
    pre = [int(step[i - 1]) if c else None for i, c in zip(onset_i.tolist(), cliff.tolist())]
    return {
        "base": base, "peak": peak, "peak_step": step[peak_i], "final": final,
        "final_tail": acc[:, k - tail:].mean(axis=1), "gain": final - base, "peak_gain": peak - base,
        "gain_z": gain_z, "peak_gain_z": peak_gain_z, "cliff": cliff, "cliff_onset": onset,
        "n_checkpoints": np.full(cells, k), "drop_z": drop_z, "pre_onset": pre, "signature": signature,
        "base_se": se[:, 0],
    }  # fmt: skip


_SUMMARY_COLUMNS = [f.name for f in fields(CurveSummary)]
_DTYPES = {
    "base": "float64",
    "peak": "float64",
    "peak_step": "int64",
    "final": "float64",
    "final_tail": "float64",
    "gain": "float64",
    "peak_gain": "float64",
    "gain_z": "float64",
    "peak_gain_z": "float64",
    "cliff": "bool",
    "cliff_onset": "Int64",
    "n_checkpoints": "int64",
    "drop_z": "float64",
    "pre_onset": "Int64",
    "signature": "object",
    "base_se": "float64",
}


def summarize_cells(evals: pd.DataFrame, analysis: Analysis) -> pd.DataFrame:
    """Summarize every cell of a long ``cell, step, accuracy, n`` (+ optional ``se``) frame.

    Rows may come in any order. Returns one row per cell, sorted by cell, with
    column ``cell`` followed by the :class:`CurveSummary` fields.
    """
    missing = [c for c in ("cell", "step", "accuracy", "n") if c not in evals.columns]
    if missing:
        raise ValueError(f"evals is missing column(s) {missing}")
    if evals["cell"].isna().any():
        raise ValueError("evals has rows with a missing cell")

    records: list[tuple[object, ...]] = []
    cells: list[object] = []
    for cell, group in evals.groupby("cell", sort=True):
        group = group.sort_values("step", kind="stable")
        if not (group["step"] == 0).any():
            raise ValueError(f"cell {cell!r} has no step-0 (base model) row")
        try:
            se = group["se"].tolist() if "se" in group.columns else None
            summary = summarize_curve(
                group["step"].tolist(), group["accuracy"].tolist(), group["n"].tolist(), analysis, se
            )
        except ValueError as exc:
            raise ValueError(f"cell {cell!r}: {exc}") from exc
        cells.append(cell)
        records.append(astuple(summary))

    out = pd.DataFrame.from_records(records, columns=_SUMMARY_COLUMNS)
    out.insert(0, "cell", pd.Series(cells, dtype=evals["cell"].dtype))
    return out.astype(_DTYPES)
