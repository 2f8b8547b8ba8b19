"""The cliff rule's rise test against the forms it replaced and the variants tried (docs/report.md).

Runs of each kind of ``calibration_sim.LABELLED`` on the paper's 51 checkpoints (2,000 a kind,
seeded), labelled ``cliff`` under each form of the rise test; the fall conditions are the rule's own
(the best window above the mean of the last w readings by 2 SEs, a terminal fall holding the last two
readings). The rows ``base read with K× a checkpoint's trials`` draw the same runs but their base
reading, drawn with K times the trials (the same true base), against the threshold for that base's
variance (``curves.rise_threshold``); the rule matrixrl ships is the row of K =
``BASE_SAMPLES_TIMES``, and the script checks that its labels equal ``curves.summarize_curves``' run
by run before it prints anything. The other rows read a base of a checkpoint's trials.

    python bench/cliff_rule_variants.py [--runs 2000] [--trials 128 512]
"""

from __future__ import annotations

import argparse
import math
from statistics import NormalDist

import numpy as np
from calibration_sim import LABELLED, labelled_runs

from matrixrl.analysis.curves import base_ratio, rise_threshold, rise_thresholds, rise_window, summarize_curves
from matrixrl.config import Analysis
from matrixrl.config.schema import BASE_SAMPLES_TIMES

NOISE = 2.0
STEPS = list(range(0, 510, 10))


def windows(acc: np.ndarray, trials: np.ndarray, w: int, start: int) -> dict[str, np.ndarray]:
    """The best window of ``w`` readings from reading ``start`` on, the base, the opening and the tail,
    each a mean with its variance (binomial SEs of each reading's ``trials``, 0 taken as 1/n as the rule
    takes them), and the base's variance over the readings' (``curves.base_ratio``)."""
    var = acc * (1 - acc) / trials
    var = np.where(var > 0, var, 1.0 / trials**2)
    view = np.lib.stride_tricks.sliding_window_view
    means = view(acc[:, start:], w, axis=1).mean(axis=2)
    variances = view(var[:, start:], w, axis=1).sum(axis=2) / (w * w)
    best = means.argmax(axis=1)
    rows = np.arange(len(acc))
    return {
        "best": means[rows, best], "best_var": variances[rows, best], "windows": np.full(len(acc), means.shape[1]),
        "base": acc[:, 0], "base_var": var[:, 0], "ratio": base_ratio(var),
        "opening": acc[:, :w].mean(axis=1), "opening_var": var[:, :w].sum(axis=1) / (w * w),
        "tail": acc[:, -w:].mean(axis=1), "tail_var": var[:, -w:].sum(axis=1) / (w * w),
    }  # fmt: skip


def z(a: dict, reference: str) -> np.ndarray:
    return (a["best"] - a[reference]) / np.sqrt(a["best_var"] + a[f"{reference}_var"])


def bonferroni(windows: int) -> float:
    normal = NormalDist()
    return -normal.inv_cdf(normal.cdf(-NOISE) / windows)


def falls(acc: np.ndarray, after: dict, delta: float = 0.1) -> np.ndarray:
    """The rule's conditions but the rise: a peak after step 0, a fall from the best window beyond 2 SEs,
    and a terminal run at or below peak - delta that holds the last two readings."""
    last = acc.shape[1] - 1
    peak_i = acc.argmax(axis=1)
    peak = acc[np.arange(len(acc)), peak_i]
    above = acc > (peak - delta)[:, None] + 1e-12
    last_above = np.where(above.any(axis=1), last - above[:, ::-1].argmax(axis=1), -1)
    onset = np.maximum(last_above + 1, peak_i + 1)
    held = np.minimum(2, last - peak_i)
    fall_z = (after["best"] - after["tail"]) / np.sqrt(after["best_var"] + after["tail_var"])
    return (peak_i > 0) & (held > 0) & (fall_z > NOISE) & (onset <= last - held + 1)


def variants(acc: np.ndarray, trials: int, precise: dict[int, np.ndarray]) -> dict[str, np.ndarray]:
    """Each rise test's cliff labels for the runs ``acc`` (every reading of ``trials``); ``precise``: per K,
    the same runs with their base read with K times the trials."""
    w = rise_window(acc.shape[1] - 1)
    after_base, after_opening = windows(acc, np.full(acc.shape[1], trials), w, 1), windows(acc, np.full(acc.shape[1], trials), w, w)
    m_base, m_opening = int(after_base["windows"][0]), int(after_opening["windows"][0])
    opening_rise = z(after_opening, "opening") >= bonferroni(m_opening)
    higher = np.where(after_opening["base"] > after_opening["opening"], "base", "opening")
    higher_z = np.where(higher == "base", z(after_opening, "base"), z(after_opening, "opening"))
    level_5 = rise_threshold(m_base, w, -NormalDist().inv_cdf(0.05))
    labels = {
        "base, simulated quantile (2.3%; the rule before)": (z(after_base, "base") >= rise_threshold(m_base, w, NOISE)) & falls(acc, after_base),
        "base, simulated quantile (5%)": (z(after_base, "base") >= level_5) & falls(acc, after_base),
        "opening window, Bonferroni (the form before)": opening_rise & falls(acc, after_opening),
        "opening window, and base by 2 SEs": opening_rise & (z(after_opening, "base") > NOISE) & falls(acc, after_opening),
        "the higher of base and opening, Bonferroni": (higher_z >= bonferroni(m_opening)) & falls(acc, after_opening),
    }
    for times, runs in precise.items():
        each = np.array([trials * times] + [trials] * (acc.shape[1] - 1))
        after = windows(runs, each, w, 1)
        rise = z(after, "base") >= rise_thresholds(m_base, w, NOISE, after["ratio"])
        labels[f"base read with {times}x a checkpoint's trials (2.3%)"] = rise & falls(runs, after)
    return labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--trials", type=int, nargs="+", default=[128, 512])
    args = parser.parse_args()
    kinds = list(LABELLED.values())
    shipped = f"base read with {BASE_SAMPLES_TIMES}x a checkpoint's trials (2.3%)"
    print(f"cliff labels on the paper's {len(STEPS)} checkpoints, {args.runs} runs a kind (seed 0); kinds: {', '.join(kinds)}")
    for trials in args.trials:
        labels = {}
        for kind in kinds:
            precise = {times: labelled_runs(STEPS, trials, kind, args.runs, 0, base_times=times) for times in (2, BASE_SAMPLES_TIMES)}
            labels[kind] = variants(labelled_runs(STEPS, trials, kind, args.runs, 0, base_times=1), trials, precise)
            rule = summarize_curves(STEPS, precise[BASE_SAMPLES_TIMES], np.full(args.runs, trials), Analysis(),
                                    np.full(args.runs, trials * BASE_SAMPLES_TIMES))  # fmt: skip
            assert (labels[kind][shipped] == rule["cliff"]).all(), kind  # the shipped row is the rule itself
        print(f"\n{trials} trials an evaluation: % labelled cliff")
        print(f"{'rise test':50}" + "".join(f"{kind:>10}" for kind in kinds))
        for name in labels[kinds[0]]:
            print(f"{name:50}" + "".join(f"{100 * labels[kind][name].mean():10.1f}" for kind in kinds))
    print(f"\n(w = {rise_window(len(STEPS) - 1)}; the ± SE of a rate p is sqrt(p(1 - p)/{args.runs}), at most {100 * math.sqrt(0.25 / args.runs):.1f} points)")


if __name__ == "__main__":
    main()
