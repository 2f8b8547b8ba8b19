"""The cliff rule's rise test against the forms it replaced and the variants tried (docs/report.md).

Runs of each kind of ``calibration_sim.LABELLED`` on the paper's 51 checkpoints (2,000 a kind,
seeded), labelled ``cliff`` under each form of the rise test; the fall conditions are the rule's own
(the best window above the mean of the last w readings by 2 SEs, a terminal fall holding the last two
readings). The rule matrixrl ships is the row ``base, simulated quantile (2.3%)``; the script checks
that its labels equal ``curves.summarize_curves``' run by run before it prints anything. The rows
``base evaluated with K× the trials`` are the route issue 51 leaves open: the same rule, the base's one
evaluation drawn with K times the trials of a checkpoint's (the same true base), its threshold the
quantile simulated for that base's smaller variance.

    python bench/cliff_rule_variants.py [--runs 2000] [--trials 128 512]
"""

from __future__ import annotations

import argparse
import math
from statistics import NormalDist

import numpy as np
from calibration_sim import LABELLED, labelled_runs

from matrixrl.analysis.curves import rise_threshold, rise_window, summarize_curves
from matrixrl.config import Analysis

NOISE = 2.0
STEPS = list(range(0, 510, 10))


def windows(acc: np.ndarray, trials: int, w: int, start: int) -> dict[str, np.ndarray]:
    """The best window of ``w`` readings from reading ``start`` on, the base, the opening and the tail,
    each a mean with its variance (binomial SEs, 0 taken as 1/n as the rule takes them)."""
    var = acc * (1 - acc) / trials
    var = np.where(var > 0, var, 1.0 / trials**2)
    view = np.lib.stride_tricks.sliding_window_view
    means = view(acc[:, start:], w, axis=1).mean(axis=2)
    variances = view(var[:, start:], w, axis=1).sum(axis=2) / (w * w)
    best = means.argmax(axis=1)
    rows = np.arange(len(acc))
    return {
        "best": means[rows, best], "best_var": variances[rows, best], "windows": np.full(len(acc), means.shape[1]),
        "base": acc[:, 0], "base_var": var[:, 0],
        "opening": acc[:, :w].mean(axis=1), "opening_var": var[:, :w].sum(axis=1) / (w * w),
        "tail": acc[:, -w:].mean(axis=1), "tail_var": var[:, -w:].sum(axis=1) / (w * w),
    }  # fmt: skip


def rise_threshold_for(windows: int, w: int, noise_se: float, base_ratio: float) -> float:
    """``curves.rise_threshold`` with the base's variance ``base_ratio`` times a reading's (the same draws:
    equal to it at 1)."""
    rng = np.random.default_rng(20261207)
    best = []
    for _ in range(10):
        readings = rng.standard_normal((10_000, windows + w - 1))
        sums = np.cumsum(np.pad(readings, ((0, 0), (1, 0))), axis=1)
        best.append((sums[:, w:] - sums[:, :-w]).max(axis=1) / w - math.sqrt(base_ratio) * rng.standard_normal(10_000))
    z = np.concatenate(best) / math.sqrt(1 / w + base_ratio)
    return float(np.quantile(z, NormalDist().cdf(noise_se)))


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


def variants(acc: np.ndarray, trials: int, precise_bases: dict[int, np.ndarray]) -> dict[str, np.ndarray]:
    """Each rise test's cliff labels for the runs ``acc``; ``precise_bases``: per K, the same runs' base
    readings drawn with K times the trials."""
    w = rise_window(acc.shape[1] - 1)
    after_base, after_opening = windows(acc, trials, w, 1), windows(acc, trials, w, w)
    m_base, m_opening = int(after_base["windows"][0]), int(after_opening["windows"][0])
    opening_rise = z(after_opening, "opening") >= bonferroni(m_opening)
    higher = np.where(after_opening["base"] > after_opening["opening"], "base", "opening")
    higher_z = np.where(higher == "base", z(after_opening, "base"), z(after_opening, "opening"))
    level_5 = rise_threshold(m_base, w, -NormalDist().inv_cdf(0.05))
    rises = {
        "base, simulated quantile (2.3%)": z(after_base, "base") >= rise_threshold(m_base, w, NOISE),
        "base, simulated quantile (5%)": z(after_base, "base") >= level_5,
        "opening window, Bonferroni (the form before)": opening_rise,
        "opening window, and base by 2 SEs": opening_rise & (z(after_opening, "base") > NOISE),
        "the higher of base and opening, Bonferroni": higher_z >= bonferroni(m_opening),
    }
    for times, base in precise_bases.items():
        base_var = base * (1 - base) / (trials * times)
        base_var = np.where(base_var > 0, base_var, 1.0 / (trials * times) ** 2)
        precise = {**after_base, "base": base, "base_var": base_var}
        threshold = rise_threshold_for(m_base, w, NOISE, 1 / times)
        rises[f"base evaluated with {times}x the trials (2.3%)"] = z(precise, "base") >= threshold
    return {name: rise & falls(acc, after_base if name.startswith("base") else after_opening) for name, rise in rises.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--trials", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--base-times", type=int, nargs="*", default=[2, 4], help="the base evaluated with K times the trials")
    args = parser.parse_args()
    w = rise_window(len(STEPS) - 1)
    assert rise_threshold_for(len(STEPS) - w, w, NOISE, 1.0) == rise_threshold(len(STEPS) - w, w, NOISE)
    kinds = list(LABELLED.values())
    print(f"cliff labels on the paper's {len(STEPS)} checkpoints, {args.runs} runs a kind (seed 0); kinds: {', '.join(kinds)}")
    for trials in args.trials:
        labels = {}
        for kind in kinds:  # the same seed draws the same true bases and peaks, whatever the trials
            precise = {times: labelled_runs(STEPS, trials * times, kind, args.runs, 0)[:, 0] for times in args.base_times}
            labels[kind] = variants(labelled_runs(STEPS, trials, kind, args.runs, 0), trials, precise)
        for kind in kinds:  # the shipped row is the rule itself
            shipped = summarize_curves(STEPS, labelled_runs(STEPS, trials, kind, args.runs, 0), np.full(args.runs, trials), Analysis())
            assert (labels[kind]["base, simulated quantile (2.3%)"] == shipped["cliff"]).all(), kind
        print(f"\n{trials} trials an evaluation: % labelled cliff")
        print(f"{'rise test':46}" + "".join(f"{kind:>10}" for kind in kinds))
        for name in labels[kinds[0]]:
            print(f"{name:46}" + "".join(f"{100 * labels[kind][name].mean():10.1f}" for kind in kinds))
    print(f"\n(w = {rise_window(len(STEPS) - 1)}; the ± SE of a rate p is sqrt(p(1 - p)/{args.runs}), at most {100 * math.sqrt(0.25 / args.runs):.1f} points)")


if __name__ == "__main__":
    main()
