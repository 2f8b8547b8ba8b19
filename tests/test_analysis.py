"""Known-answer tests for matrixrl.analysis.curves on hand-constructed curves."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest

from matrixrl.analysis.curves import CurveSummary, rise_threshold, summarize_cells, summarize_curve
from matrixrl.config import Analysis

RULE = Analysis()  # cliff_delta=0.10, cliff_noise_se=2.0, final_tail_k=3
approx = pytest.approx


def test_rising_curve_has_gain_and_no_cliff() -> None:
    s = summarize_curve([0, 100, 200, 300], [0.2, 0.3, 0.4, 0.5], 500, RULE)
    assert s.base == 0.2 and s.peak == 0.5 and s.final == 0.5
    assert s.peak_step == 300
    assert s.gain == approx(0.3) and s.peak_gain == approx(0.3)
    assert s.final_tail == approx(0.4)  # mean(0.3, 0.4, 0.5)
    assert s.cliff is False and s.cliff_onset is None
    assert s.n_checkpoints == 4


def test_peak_then_collapse_is_a_cliff_with_exact_onset() -> None:
    # peak 0.7 @ 20; threshold 0.6; 0.5, 0.2, 0.1 stay below -> onset 30.
    # se = sqrt(.7*.3/1000 + .1*.9/1000) = 0.0173; drop 0.6 >> 2 se.
    s = summarize_curve([0, 10, 20, 30, 40, 50], [0.3, 0.6, 0.7, 0.5, 0.2, 0.1], 1000, RULE)
    assert s.peak == 0.7 and s.peak_step == 20
    assert s.final == 0.1 and s.gain == approx(-0.2) and s.peak_gain == approx(0.4)
    assert s.final_tail == approx((0.5 + 0.2 + 0.1) / 3)
    assert s.cliff is True and s.cliff_onset == 30


def test_failure_signature_drop_z_and_the_checkpoint_before_the_onset() -> None:
    """Each way a run can end, with SEs given: 0.02 at every checkpoint, so a difference has SE 0.02·√2."""
    se = [0.02] * 4
    noise = 0.02 * math.sqrt(2)
    cliff = summarize_curve([0, 10, 20, 30], [0.3, 0.7, 0.5, 0.4], 1000, RULE, se)
    assert (cliff.signature, cliff.cliff_onset, cliff.pre_onset) == ("cliff", 20, 10)
    assert cliff.drop_z == approx(0.3 / noise)
    # 0.08 below its peak (under cliff_delta), 0.08 / 0.0283 = 2.8 SEs: a decline, though above base.
    decline = summarize_curve([0, 10, 20, 30], [0.3, 0.5, 0.45, 0.42], 1000, RULE, se)
    assert (decline.signature, decline.cliff, decline.pre_onset) == ("decline", False, None)
    assert decline.drop_z == approx(0.08 / noise) and decline.gain_z == approx(0.12 / noise)
    # Up 0.05 (1.8 SEs) and level: no gain beyond noise; up 0.06 (2.1 SEs): a gain.
    assert summarize_curve([0, 10], [0.3, 0.35], 1000, RULE, se[:2]).signature == "no gain"
    assert summarize_curve([0, 10], [0.3, 0.36], 1000, RULE, se[:2]).signature == "gain"
    # A loss from the start, short of a cliff: the peak is the base, the final below it beyond noise.
    loss = summarize_curve([0, 10], [0.3, 0.22], 1000, RULE, se[:2])
    assert (loss.signature, loss.drop_z) == ("decline", approx(0.08 / noise))
    assert summarize_curve([0, 10], [0.3, 0.27], 1000, RULE, se[:2]).signature == "no gain"


def test_a_cliff_follows_a_real_peak_and_a_fall_from_the_base_without_one_is_a_collapse() -> None:
    """SE 0.02 at every checkpoint: a difference has SE 0.0283, so 2 SEs (the rule's) are 0.057."""
    se = [0.02] * 3
    noise = 0.02 * math.sqrt(2)
    # Rose 3 SEs (0.085), then fell 10 points from that peak: a cliff.
    cliff = summarize_curve([0, 10, 20], [0.3, 0.385, 0.285], 1000, RULE, se)
    assert cliff.peak_gain_z == approx(0.085 / noise) and cliff.peak_gain_z > 3
    assert (cliff.cliff, cliff.cliff_onset, cliff.signature) == (True, 20, "cliff")
    # Fell 10 points from its base, the base its peak: the old rule's cliff (10 points below the peak,
    # 3.5 SEs), now a collapse: no onset, and no cliff.
    fell = summarize_curve([0, 10, 20], [0.3, 0.25, 0.2], 1000, RULE, se)
    assert (fell.peak_step, fell.peak_gain_z, fell.gain_z) == (0, 0.0, approx(-0.1 / noise))
    assert (fell.cliff, fell.cliff_onset, fell.pre_onset, fell.signature) == (False, None, None, "collapse")
    # A peak after step 0 within noise (1.4 SEs) is no real peak: the same fall is a collapse.
    assert summarize_curve([0, 10, 20], [0.3, 0.34, 0.2], 1000, RULE, se).signature == "collapse"
    # The real peak's edge: picked from 2 readings, a peak must reach 2.25 SEs over the base (the quantile
    # of the better of two noise readings at 2 SEs' one-sided level, 2.3%). A rise of 2.2 SEs then a fall
    # to 6 points under the base (11 from the peak; too little for a collapse) is a decline; a rise of
    # 2.35 SEs and the same fall, a cliff.
    assert rise_threshold(2, 1, 2.0) == approx(2.2498, abs=0.01)
    short = summarize_curve([0, 10, 20], [0.3, 0.3 + 2.2 * noise, 0.24], 1000, RULE, se)
    assert (short.cliff, short.signature, short.drop_z > 2) == (False, "decline", True)
    real = summarize_curve([0, 10, 20], [0.3, 0.3 + 2.35 * noise, 0.24], 1000, RULE, se)
    assert (real.cliff, real.cliff_onset, real.signature) == (True, 20, "cliff")
    # A collapse needs the cliff's drop from the base: 8 points (under cliff_delta) is a decline, and
    # 10 points within noise (n = 50, binomial SEs: 1.2 SEs) is no gain.
    assert summarize_curve([0, 10, 20], [0.3, 0.25, 0.22], 1000, RULE, se).signature == "decline"
    assert summarize_curve([0, 10], [0.3, 0.2], 50, RULE).signature == "no gain"
    # With no noise margin at all (cliff_noise_se 0) a peak at step 0 is still no peak.
    bare = Analysis(cliff_delta=0.1, cliff_noise_se=0.0)
    assert summarize_curve([0, 10], [0.3, 0.2], 1000, bare).signature == "collapse"
    assert summarize_curve([0, 10, 20], [0.3, 0.31, 0.2], 1000, bare).signature == "cliff"


def test_rise_threshold_is_the_quantile_of_the_best_of_flat_noise() -> None:
    """For single readings the threshold has a closed form, P(max of M readings - base > c SEs) =
    E_u[1 - Phi(u + c sqrt 2)^M]: the simulated quantile matches it (to its Monte-Carlo error)."""
    from scipy import integrate, optimize, stats

    for m, r in ((1, 1.0), (2, 1.0), (4, 1.0), (9, 1.0), (4, 0.25), (47, 0.25), (4, 0.0)):
        # The base's variance r times a reading's: max of M readings - base > c sqrt(1 + r) SDs of a reading.
        def level(c: float, m: int = m, r: float = r) -> float:
            inner = lambda u: stats.norm.pdf(u) * (1 - stats.norm.cdf(math.sqrt(r) * u + c * math.sqrt(1 + r)) ** m)  # noqa: E731
            return integrate.quad(inner, -10, 10)[0] - stats.norm.cdf(-2)

        assert rise_threshold(m, 1, 2.0, r) == approx(optimize.brentq(level, 0, 6), abs=0.015)
    assert rise_threshold(47, 4, 0.0) == 0.0 and rise_threshold(0, 4, 2.0) == math.inf
    # More windows to pick from, a higher bar; longer windows, less noise to pick.
    assert rise_threshold(4, 1, 2.0) < rise_threshold(47, 1, 2.0)
    assert rise_threshold(47, 4, 2.0) < rise_threshold(47, 1, 2.0)
    # A more precise base leaves the best window's own noise to pick: a higher bar in SEs of the difference.
    assert rise_threshold(47, 4, 2.0, 1.0) < rise_threshold(47, 4, 2.0, 0.25) < rise_threshold(47, 4, 2.0, 0.0)


def test_the_base_ratio_is_rounded_down_to_a_twentieth_and_at_most_two() -> None:
    """Rounded down: the threshold rises as the ratio falls, so the rounding never lowers the bar."""
    from matrixrl.analysis.curves import base_ratio

    var = np.array([[1.0, 1.0, 1.0], [0.26, 1.0, 1.0], [0.0, 1.0, 1.0], [9.0, 1.0, 1.0], [0.5, 1.0, 3.0]])
    assert base_ratio(var).tolist() == [1.0, 0.25, 0.0, 2.0, 0.25]


def test_a_base_read_four_times_as_precisely_finds_a_rise_one_reading_of_it_does_not() -> None:
    """The paper's schedule, every checkpoint's SE 0.044 (128 trials at 0.5): four readings 0.13 over the
    base are 2.64 SEs over a base of the same SE (under the 2.78 bar), and 4.2 SEs over a base read with
    four times the samples (SE 0.022, over its bar of 3.08): with the fall that follows, a decline from a
    peak the rule cannot tell from noise, then a cliff."""
    steps = list(range(0, 510, 10))
    acc = [0.5] * 20 + [0.63] * 4 + [0.5] * 17 + [0.38] * 10
    plain = summarize_curve(steps, acc, 1000, RULE, [0.044] * 51)
    precise = summarize_curve(steps, acc, 1000, RULE, [0.022] + [0.044] * 50)
    assert (plain.cliff, plain.signature) == (False, "decline")
    assert (precise.cliff, precise.cliff_onset, precise.signature) == (True, 240, "cliff")


def test_a_peak_picked_from_many_readings_must_rise_further() -> None:
    """On the paper's schedule (50 readings after the base) the rise is read over windows of 4 adjacent
    readings against the base reading, at the threshold for the best of the 47 windows (2.78 SEs): one
    high reading is no rise however high, and a dip after the base is no reference (docs/design.md §4)."""
    from matrixrl.analysis.curves import rise_window

    assert [rise_window(m) for m in (0, 1, 4, 8, 9, 15, 24, 25, 48, 49, 50)] == [1, 1, 1, 1, 2, 2, 2, 3, 3, 4, 4]
    assert rise_threshold(47, 4, 2.0) == approx(2.78, abs=0.02)
    steps = list(range(0, 510, 10))
    se = [0.02] * 51
    over_base = 0.02 * math.sqrt(1 + 1 / 4)  # SE of a mean of 4 readings minus the base reading
    fallen = [0.5] * 41 + [0.38] * 10  # flat, then the last ten 12 points down
    # One reading 5 SEs of a single difference high at step 200 (a cliff by a rule of single readings):
    # no rise, so the fall from the base is a collapse.
    spike = list(fallen)
    spike[20] = 0.5 + 5 * 0.02 * math.sqrt(2)
    summary = summarize_curve(steps, spike, 1000, RULE, se)
    assert (summary.peak_step, summary.cliff, summary.signature) == (200, False, "collapse")
    # Four adjacent readings (steps 170-200) 3 SEs over the base: a cliff, its onset the first of the last ten.
    risen = [*fallen[:17], *[0.5 + 3.0 * over_base] * 4, *fallen[21:]]
    summary = summarize_curve(steps, risen, 1000, RULE, se)
    assert (summary.cliff, summary.cliff_onset, summary.pre_onset, summary.peak_step) == (True, 410, 400, 170)
    # The same four only 2.6 SEs up (under 2.78): no real rise.
    short = [*fallen[:17], *[0.5 + 2.6 * over_base] * 4, *fallen[21:]]
    assert summarize_curve(steps, short, 1000, RULE, se).cliff is False
    # A dip right after the base, back to it, then the fall: never above the base, so no rise (the
    # windowed rule of issue 51 measured against the opening, which the dip lowered, and called it a cliff).
    dipped = [0.5, *[0.3] * 5, *fallen[6:]]
    assert summarize_curve(steps, dipped, 1000, RULE, se).signature == "collapse"
    # Five readings (the default study's): single readings against the base, the threshold that of four (2.48 SEs).
    noise = 0.02 * math.sqrt(2)
    assert summarize_curve([0, 1, 2, 3, 4], [0.3, 0.3 + 2.4 * noise, 0.3, 0.2, 0.2], 1000, RULE, se[:5]).cliff is False
    assert summarize_curve([0, 1, 2, 3, 4], [0.3, 0.3 + 2.6 * noise, 0.3, 0.2, 0.2], 1000, RULE, se[:5]).cliff is True


def test_one_low_last_reading_is_no_terminal_fall() -> None:
    """A fall that did not recover holds the last two readings where two follow the peak."""
    steps = [0, 10, 20, 30, 40]
    # Peak 0.7 at 10, recovers to 0.68, then one low last reading: no cliff (a decline).
    one = summarize_curve(steps, [0.3, 0.7, 0.5, 0.68, 0.4], 1000, RULE)
    assert (one.cliff, one.cliff_onset, one.signature) == (False, None, "decline")
    # The last two low: a cliff from step 30.
    two = summarize_curve(steps, [0.3, 0.7, 0.68, 0.45, 0.4], 1000, RULE)
    assert (two.cliff, two.cliff_onset, two.pre_onset) == (True, 30, 20)
    # Only one reading after the peak: that one is the fall.
    assert summarize_curve(steps, [0.3, 0.4, 0.5, 0.7, 0.4], 1000, RULE).cliff_onset == 40


def test_drop_then_recovery_above_threshold_is_not_a_cliff() -> None:
    s = summarize_curve([0, 1, 2, 3], [0.3, 0.7, 0.4, 0.65], 1000, RULE)
    assert s.peak_step == 1
    assert s.cliff is False and s.cliff_onset is None


def test_drop_of_exactly_delta_counts() -> None:
    # 0.7 - 0.1 == 0.5999999999999999 in floats; the tolerance keeps 0.6 "<= peak - delta".
    s = summarize_curve([0, 5, 10], [0.3, 0.7, 0.6], 10_000, RULE)
    assert s.cliff is True and s.cliff_onset == 10
    just_above = summarize_curve([0, 5, 10], [0.3, 0.7, 0.6 + 1e-6], 10_000, RULE)
    assert just_above.cliff is False and just_above.cliff_onset is None


def test_drop_within_noise_depends_on_n() -> None:
    steps, acc = [0, 10, 20], [0.2, 0.5, 0.35]
    # n=10: se = sqrt(.25/10 + .2275/10) = 0.2185, 2 se = 0.437 > drop 0.15.
    small = summarize_curve(steps, acc, 10, RULE)
    assert small.cliff is False and small.cliff_onset is None
    # n=1000: se = 0.0219, 2 se = 0.0437 < 0.15.
    large = summarize_curve(steps, acc, 1000, RULE)
    assert large.cliff is True and large.cliff_onset == 20


def test_per_checkpoint_n_uses_peak_and_final_rows() -> None:
    steps, acc = [0, 10, 20], [0.3, 0.7, 0.55]
    assert summarize_curve(steps, acc, 1000, RULE).cliff is True
    # Peak measured on only 10 problems: se = sqrt(.21/10 + .2475/1000) = 0.146, 2 se > 0.15.
    assert summarize_curve(steps, acc, [1000, 10, 1000], RULE).cliff is False


def test_onset_is_start_of_final_run_not_first_dip() -> None:
    # peak 0.8 @ 50, threshold 0.7: dips at 100, recovers at 150/200, collapses from 250.
    steps = [0, 50, 100, 150, 200, 250, 300]
    acc = [0.3, 0.8, 0.5, 0.75, 0.78, 0.4, 0.3]
    s = summarize_curve(steps, acc, 1000, RULE)
    assert s.peak_step == 50
    assert s.cliff is True and s.cliff_onset == 250


def test_peak_at_last_checkpoint() -> None:
    s = summarize_curve([0, 1, 2], [0.2, 0.4, 0.6], 100, RULE)
    assert s.peak_step == 2 and s.peak == s.final == 0.6
    assert s.gain == s.peak_gain == approx(0.4)
    assert s.cliff is False and s.cliff_onset is None


def test_peak_ties_take_earliest_step() -> None:
    s = summarize_curve([0, 10, 20, 30, 40], [0.2, 0.6, 0.5, 0.6, 0.55], 100, RULE)
    assert s.peak == 0.6 and s.peak_step == 10


def test_zero_delta_onset_still_comes_after_peak() -> None:
    # With delta=0 every point is "<= peak", the peak included; the onset must follow it.
    rule = Analysis(cliff_delta=0.0, cliff_noise_se=0.0)
    s = summarize_curve([0, 10, 20], [0.3, 0.7, 0.69], 100, rule)
    assert s.cliff is True and s.cliff_onset == 20


def test_final_tail_with_k_larger_than_curve() -> None:
    s = summarize_curve([0, 1, 2], [0.2, 0.5, 0.8], 100, Analysis(final_tail_k=10))
    assert s.final_tail == approx(0.5)


def test_single_checkpoint() -> None:
    s = summarize_curve([0], [0.4], 100, RULE)
    assert (s.base, s.peak, s.final, s.final_tail) == (0.4, 0.4, 0.4, 0.4)
    assert s.peak_step == 0 and s.gain == 0 and s.cliff is False and s.n_checkpoints == 1


@pytest.mark.parametrize(
    ("steps", "acc", "n", "message"),
    [
        ([10, 20], [0.1, 0.2], 100, "step 0"),
        ([0, 20, 10], [0.1, 0.2, 0.3], 100, "strictly increasing"),
        ([0, 10, 10], [0.1, 0.2, 0.3], 100, "strictly increasing"),
        ([0, 10], [0.1, 1.2], 100, r"within \[0, 1\]"),
        ([0, 10], [0.1, float("nan")], 100, r"within \[0, 1\]"),
        ([0, 10], [0.1], 100, "length"),
        ([], [], 100, "at least one checkpoint"),
        ([0, 10], [0.1, 0.2], 0, ">= 1"),
        ([0, 10], [0.1, 0.2], [100], "entries"),
    ],
)
def test_validation_errors(steps, acc, n, message) -> None:
    with pytest.raises(ValueError, match=message):
        summarize_curve(steps, acc, n, RULE)


def test_rule_validation() -> None:
    # The rule's settings are checked where they are defined, in ``analysis:``.
    with pytest.raises(ValueError, match="final_tail_k"):
        Analysis(final_tail_k=0)
    with pytest.raises(ValueError, match="cliff_delta"):
        Analysis(cliff_delta=-0.1)


def _long(cell: str, steps: list[int], acc: list[float], n: int) -> pd.DataFrame:
    return pd.DataFrame({"cell": cell, "step": steps, "accuracy": acc, "n": n})


def test_summarize_cells_shuffled_multi_cell() -> None:
    evals = pd.concat(
        [
            _long("b", [0, 10, 20, 30, 40, 50], [0.3, 0.6, 0.7, 0.5, 0.2, 0.1], 1000),
            _long("c", [0, 1, 2, 3], [0.3, 0.7, 0.4, 0.65], 1000),
            _long("a", [0, 100, 200, 300], [0.2, 0.3, 0.4, 0.5], 500),
        ],
        ignore_index=True,
    ).sample(frac=1.0, random_state=0)
    out = summarize_cells(evals, RULE)

    assert list(out.columns) == ["cell"] + [f.name for f in dataclasses.fields(CurveSummary)]
    assert out["cell"].tolist() == ["a", "b", "c"]
    assert list(out.index) == [0, 1, 2]
    assert str(out["cliff_onset"].dtype) == "Int64"
    assert out["peak_step"].dtype == "int64" and out["n_checkpoints"].dtype == "int64"
    assert out["cliff"].dtype == bool
    assert out["cliff"].tolist() == [False, True, False]
    assert out["cliff_onset"].isna().tolist() == [True, False, True]
    assert out.loc[1, "cliff_onset"] == 30
    assert out["peak_step"].tolist() == [300, 20, 1]
    assert out["n_checkpoints"].tolist() == [4, 6, 4]
    assert out["final_tail"].tolist() == approx([0.4, (0.5 + 0.2 + 0.1) / 3, (0.7 + 0.4 + 0.65) / 3])


def test_summarize_cells_uses_per_row_n() -> None:
    evals = pd.DataFrame(
        {"cell": "x", "step": [20, 0, 10], "accuracy": [0.55, 0.3, 0.7], "n": [1000, 1000, 10]}
    )
    assert summarize_cells(evals, RULE)["cliff"].tolist() == [False]


def test_summarize_cells_missing_step0_names_cell() -> None:
    evals = pd.concat([_long("ok", [0, 1], [0.1, 0.2], 10), _long("bad-cell", [1, 2], [0.1, 0.2], 10)])
    with pytest.raises(ValueError, match="bad-cell"):
        summarize_cells(evals, RULE)


def test_summarize_cells_duplicate_step_names_cell() -> None:
    evals = _long("dup", [0, 5, 5], [0.1, 0.2, 0.3], 10)
    with pytest.raises(ValueError, match="dup.*strictly increasing"):
        summarize_cells(evals, RULE)


def test_summarize_cells_missing_column() -> None:
    with pytest.raises(ValueError, match="'n'"):
        summarize_cells(pd.DataFrame({"cell": ["a"], "step": [0], "accuracy": [0.5]}), RULE)


def test_t_interval_mean_and_deviation_are_numpys_to_the_last_bit() -> None:
    """t_interval computes mean and sample deviation without numpy's Python layers: the same numbers."""
    from matrixrl.analysis.seeds import _t_quantile, t_interval

    rng = np.random.default_rng(7)
    for n in [*range(1, 20), 64, 129, 1000]:
        for _ in range(20):
            x = rng.normal(rng.uniform(-1, 1), rng.uniform(0.01, 2), n) * 10.0 ** rng.integers(-3, 3)
            mean, lo, hi = t_interval(list(x))
            assert mean == float(x.mean())
            if n > 1:
                half = _t_quantile(0.95, n - 1) * float(x.std(ddof=1)) / math.sqrt(n)
                assert (lo, hi) == (float(x.mean()) - half, float(x.mean()) + half)
