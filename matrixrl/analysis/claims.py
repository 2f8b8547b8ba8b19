"""The study's findings, each tested on a loaded study (``report --table claims``).

Pure functions of the per-cell records (``analysis.cell_record``). Each claim's rule, its unit and
why the test is the one it is are in docs/report.md ("claims", "One unit per claim"), written
before this code. Claims 1, 3, 4, 5 give an interval of an estimate the finding predicts above
``null``: wholly above is ``supported``, wholly below ``contradicted``, else ``inconclusive``; claim
3 also needs the exact sign-flip test to agree; claim 2 is an ANOVA of the gains (context against
policy, one family under Holm); claims 6-7 an exact stratified test within configurations. A study
that lacks what a test needs makes it ``untestable``. Every row carries its test's ``p`` (read by
:func:`family_holm`) and its ``fragility``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import median

import pandas as pd

from matrixrl.analysis.axes import PerCell, extra_axes, grouped_rows, missing
from matrixrl.analysis.compare import CONTROL
from matrixrl.analysis.curves import SIGNATURES
from matrixrl.analysis.power import (
    MOST_UNITS, context_seeds_needed, known_share_p, peak_units_needed, sign_patterns, sign_threshold, sign_units_needed,
)  # fmt: skip
from matrixrl.analysis.seeds import t_interval

VERDICTS = ("supported", "contradicted", "inconclusive", "untestable")
CLAIMS_COLUMNS = [
    "claim", "finding", "evidence", "n_cells", "n_seeds", "verdict", "fragility", "test", "estimate", "lo", "hi", "null", "p", "why",
]  # fmt: skip
"""The default columns first, in the order they are read; then what was computed, as numbers, and why."""

FINDINGS = {
    1: ("MARL improves over base", "Multi-agent RL usually improves over the base model."),
    2: ("gain: wf×task×scale > policy", "Gains depend jointly on workflow, task and scale, not on policy sharing alone."),
    3: ("isolated: higher peaks", "Isolated policies reach higher peaks."),
    4: ("isolated: more cliffs", "Isolated policies fall off terminal cliffs more often."),
    5: ("shared: failure elsewhere", "Shared policies redistribute failure into other patterns."),
    6: ("isolated: amplify, then cliff",
        "Under isolated policies, parallel same-role agents amplify per-role gradients before a cliff (Voting, Orch-Workers)."),
    7: ("shared: capture, then cliff",
        "Under shared policies, the dominant role's share of the step's gradient mass rises before a decline (capture)."),
}  # fmt: skip
"""Each claim's finding: ``(in a few words, in full)``."""

TESTS = {
    1: "sign test over multi-agent workflow×task×scale: share with mean gain > 0 (Clopper-Pearson)",
    2: "OLS gain ~ workflow*task*scale + policy; nested F-tests (Holm), omega² of context vs policy",
    3: "peak isolated - shared, paired by seed, mean over configurations (Student-t)",
    4: "sign test over configurations whose cliff rates differ: share where isolated's is higher",
    5: "sign test over configurations: share where shared's failures are less often cliffs",
    6: "isolated amplification, within configurations: precedes among cliffs - rose as early without (exact stratified, MH)",
    7: "shared dominant share, within configurations: precedes among cliffs - rose as early without (exact stratified, MH)",
}


def claims_table(per_cell: PerCell | pd.DataFrame, confidence: float = 0.95, claims: Sequence[int] = range(1, 8),
                 brief: bool = False, family: str = "none") -> pd.DataFrame:
    """A row per claim (``CLAIMS_COLUMNS``) tested on the cells of ``per_cell`` (the per-cell
    records; cells without a base evaluation are left out). Empty when no cell has one.
    ``claims``: those claims only; ``brief``: claim 2 without its descriptive η² (the calibration
    tests the claims over thousands of studies); ``family``: ``holm`` for Holm's procedure across
    claims 2-7 (:func:`family_holm`), ``none`` for each claim at its own level."""
    results = claim_results(per_cell, confidence, claims, brief)
    if family == "holm":
        results = family_holm(results, 1 - confidence)
    return _frame(list(results.values()))


def claim_results(per_cell: PerCell | pd.DataFrame, confidence: float = 0.95, claims: Sequence[int] = range(1, 8),
                  brief: bool = False) -> dict[int, dict]:
    """:func:`claims_table`'s rows as dicts, per claim (none without a cell with a base evaluation)."""
    per_cell = PerCell.of(per_cell)
    rows = [row for row in per_cell.rows if not missing(row.get("base"))]
    if not rows:
        return {}
    extra = extra_axes(per_cell.columns)
    tests: list[Callable[[], dict]] = [
        lambda: claim_gain(rows, confidence),
        lambda: claim_context(rows, confidence, brief),
        lambda: claim_peaks(rows, extra, confidence),
        lambda: claim_cliffs(rows, extra, confidence),
        lambda: claim_failures(rows, extra, confidence),
        lambda: claim_mechanism(6, rows, "isolated", "amplification", confidence, extra),
        lambda: claim_mechanism(7, rows, "shared", "share", confidence, extra),
    ]
    return {i: {"claim": i, "finding": FINDINGS[i][0], "test": TESTS[i], **tests[i - 1]()} for i in claims}


def _frame(rows: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=CLAIMS_COLUMNS)
    dtypes = {"claim": "int64", "n_cells": "int64", "n_seeds": "int64", **dict.fromkeys(["estimate", "lo", "hi", "null", "p"], "float64")}
    return frame.astype(dtypes)


# --- intervals and the verdict -------------------------------------------------------------


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact interval of the share ``k / n`` (NaN for n = 0)."""
    from scipy.special import betaincinv  # the beta quantiles, without importing scipy.stats

    if n == 0:
        return math.nan, math.nan
    alpha = 1 - confidence
    lo = 0.0 if k == 0 else float(betaincinv(k, n - k + 1, alpha / 2))
    hi = 1.0 if k == n else float(betaincinv(k + 1, n - k, 1 - alpha / 2))
    return lo, hi


def verdict(lo: float, hi: float, null: float) -> str:
    """``supported`` when the interval lies wholly above ``null``, ``contradicted`` wholly below,
    else ``inconclusive`` (also without an interval)."""
    if math.isnan(lo) or math.isnan(hi):
        return "inconclusive"
    return "supported" if lo > null else "contradicted" if hi < null else "inconclusive"


def _result(estimate, lo, hi, null, cells: Sequence[dict], evidence: str | None, why: str, decided: str | None = None,
            p: float = math.nan, fragility: str | None = None) -> dict:  # fmt: skip
    """A claim's row; ``p``: its test's two-sided p-value (NaN without a test), which Holm's procedure
    across the family reads (:func:`family_holm`); ``fragility``: the fewest units whose flip or removal
    changes the verdict (docs/report.md, "Fragile verdicts")."""
    return {
        "evidence": evidence, "estimate": estimate, "lo": lo, "hi": hi, "null": null, "p": p, "fragility": fragility,
        "n_cells": len(cells), "n_seeds": len({row["seed"] for row in cells}),
        "verdict": decided if decided is not None else verdict(lo, hi, null), "why": why,
    }  # fmt: skip


def _untestable(why: str, cells: Sequence[dict] = ()) -> dict:
    return _result(math.nan, math.nan, math.nan, math.nan, cells, None, why, "untestable")


def _share_text(k: int, m: int, lo: float, hi: float) -> str:
    return f"{k}/{m}: {k / m:.2f} [{lo:.2f}, {hi:.2f}]"


def _diff_text(d: float, lo: float, hi: float, digits: int = 2) -> str:
    return f"{d:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]"


# --- the cells each test reads ------------------------------------------------------------


def _multi_agent(rows: Sequence[dict]) -> list[dict]:
    return [row for row in rows if row["workflow"] != CONTROL]


def _pairs(rows: Sequence[dict], extra: Sequence[str], by_base: bool = False) -> list[list[tuple[dict, dict]]]:
    """Per configuration with both modes as runs of their own, its ``(isolated, shared)`` cells
    paired by seed (the seeds both have); configurations without a pair are left out. ``by_base``:
    per (workflow, task, scale) instead, the configurations of its extra-axis values (a sweep of a
    training setting) one unit, for they share its one base evaluation; pairs within one value."""
    out = []
    keys = ["workflow", "task", "scale"] if by_base else ["workflow", "task", "scale", *extra]
    within = [axis for axis in extra if axis not in keys]
    for _, group in grouped_rows(rows, keys):
        isolated = {(row["seed"], *(repr(row[a]) for a in within)): row for row in group if row["policy"] == "isolated"}
        shared = {(row["seed"], *(repr(row[a]) for a in within)): row for row in group if row["policy"] == "shared"}
        runs = [{row.get("run", row["cell"]) for row in side.values()} for side in (isolated, shared)]
        if not isolated or not shared or runs[0] == runs[1]:
            continue  # one mode only, or a one-role workflow whose isolated cells are its shared runs
        pairs = [(isolated[seed], shared[seed]) for seed in isolated if seed in shared]
        if pairs:
            out.append(pairs)
    return out


def _no_pairs_why(rows: Sequence[dict]) -> str:
    modes = {row["policy"] for row in _multi_agent(rows)}
    if not modes:
        return "no multi-agent cell (a one-role workflow's two modes are one run)"
    if "isolated" not in modes:
        return "no isolated multi-agent cell"
    if "shared" not in modes:
        return "no shared multi-agent cell"
    return "no isolated and shared cells of one configuration and seed"


# --- the claims -----------------------------------------------------------------------------


def claim_gain(rows: Sequence[dict], confidence: float) -> dict:
    """1. Multi-agent RL usually improves over the base model: a sign test over the (workflow, task,
    scale) groups of cells, each of which shares one base evaluation."""
    cells = _multi_agent(rows)
    if not cells:
        return _untestable("no multi-agent cell evaluated")
    # Units: the cells that share one base evaluation (both modes, every seed), so that no two
    # units share its sampling error.
    gains = [sum(row["gain"] for row in group) / len(group) for _, group in grouped_rows(cells, ["workflow", "task", "scale"])]
    k, m = sum(g > 0 for g in gains), sum(g != 0 for g in gains)
    z = [float(row["gain_z"]) for row in cells if math.isfinite(row["gain_z"])]
    peak_z = [float(row["peak_gain_z"]) for row in cells if math.isfinite(row["peak_gain_z"])]
    described = f"mean gain {_mean(z):+.1f} SE, peak {_mean(peak_z):+.1f} SE over {len(cells)} cells"
    if m == 0:
        return _result(math.nan, math.nan, math.nan, 0.5, cells, None, f"no configuration's gain differs from 0; {described}")
    lo, hi = clopper_pearson(k, m, confidence)
    why = f"{k} of {m} workflow-task-scales gain; {described}"
    if verdict(lo, hi, 0.5) == "inconclusive":
        why += _sign_note(k, m, "workflow-task-scales", confidence, " (seeds add none: they share its base)")
    return _result(k / m, lo, hi, 0.5, cells, _share_text(k, m, lo, hi), why, p=sign_p(k, m), fragility=sign_fragility(k, m, confidence))


def _sign_note(k: int, m: int, units: str, confidence: float, aside: str = "") -> str:
    """What would decide an inconclusive sign test, at the share of its units it found going one way."""
    if 2 * k == m:
        return f"; at {k} of {m}, an even split, no number of {units} decides it"
    needed = sign_units_needed(max(k, m - k) / m, confidence)
    count = f"more than {MOST_UNITS}" if needed is None else str(needed)
    return f"; at {k} of {m}, 80% power needs {count} {units}{aside}"


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def claim_context(rows: Sequence[dict], confidence: float, brief: bool = False) -> dict:
    """2. Gains depend jointly on workflow, task and scale, not on policy alone: an ANOVA (``brief``: the
    verdict and figures without the η² and the note in ``why``, as the calibration needs them)."""
    cells = [row for row in _multi_agent(rows) if math.isfinite(row["gain"])]
    if len({row["policy"] for row in cells}) < 2:
        return _untestable("one policy mode: no policy effect to set against the context", cells)
    context = [axis for axis in ("workflow", "task", "scale") if len({row[axis] for row in cells}) > 1]
    if not context:
        return _untestable("one workflow, task and scale: no context to vary", cells)
    frame = pd.DataFrame({axis: [str(row[axis]) for row in cells] for axis in [*context, "policy"]})
    frame["gain"] = [float(row["gain"]) for row in cells]
    frame["base_var"] = [0.0 if missing(row.get("base_se")) else float(row["base_se"]) ** 2 for row in cells]
    terms = "*".join(f"C({axis})" for axis in context)
    anova = context_anova(frame, terms, describe=not brief)
    if anova is None:
        return _result(math.nan, math.nan, math.nan, math.nan, cells, None,
                       "no residual degrees of freedom, or every gain the same: more cells or seeds", "inconclusive")  # fmt: skip
    raw = {"context": anova["omega2_context"], "policy": anova["omega2_policy"]}
    keys = [tuple(row[axis] for axis in context) for row in cells]
    contexts = len(set(keys))
    # ω² is a share of variance: below 0 it estimates none, and is shown and compared as 0.
    omega_c, omega_p = (max(value, 0.0) for value in raw.values())
    decided = context_verdict(anova["p_context"], anova["p_policy"], omega_c, omega_p, 1 - confidence)
    # Its p in the family: the smaller of its two, Holm-adjusted within the claim (twice it).
    family_p = min(1.0, 2 * min(anova["p_context"], anova["p_policy"]))
    fragility = _context_fragility(frame, terms, keys, decided, confidence)
    evidence = f"ω² context {_fixed(omega_c)}, policy {_fixed(omega_p)}"
    test = f"OLS gain ~ {'*'.join(context)} + policy; nested F-tests (Holm), omega² of context vs policy"
    why = f"p context {anova['p_context']:.3g}, policy {anova['p_policy']:.3g}"
    if brief:
        return {**_result(omega_c - omega_p, math.nan, math.nan, math.nan, cells, evidence, why, decided, p=family_p,
                          fragility=fragility), "test": test}  # fmt: skip
    why += (f"; η² main {anova['eta2_main']:.2f}, interactions {anova['eta2_interactions']:.2f}, "
            f"policy {anova['eta2_policy']:.2f}")  # fmt: skip
    below = [f"{name} {value:.3g}" for name, value in raw.items() if value < 0]
    if below:
        why += f"; ω² below 0, shown as 0: {', '.join(below)}"
    if decided == "inconclusive":
        why += _context_note(raw["context"], contexts, len(cells) / contexts, confidence, anova["base_ratio"])
    return {**_result(omega_c - omega_p, math.nan, math.nan, math.nan, cells, evidence, why, decided, p=family_p,
                      fragility=fragility), "test": test}  # fmt: skip


def _context_fragility(frame: pd.DataFrame, terms: str, keys: list, decided: str, confidence: float) -> str:
    """How many contexts, each left out alone, change claim 2's verdict (its units are contexts): ``k of C``."""
    changed = 0
    distinct = list(dict.fromkeys(keys))
    for key in distinct:
        kept = frame[[k != key for k in keys]].reset_index(drop=True)
        anova = context_anova(kept, terms, describe=False) if kept["policy"].nunique() > 1 else None
        if anova is None:
            now = "inconclusive"
        else:
            omega_c, omega_p = max(anova["omega2_context"], 0.0), max(anova["omega2_policy"], 0.0)
            now = context_verdict(anova["p_context"], anova["p_policy"], omega_c, omega_p, 1 - confidence)
        changed += now != decided
    return f"{changed} of {len(distinct)}"


def _context_note(omega2: float, contexts: int, cells_per_context: float, confidence: float, base_ratio: float) -> str:
    """What would decide claim 2, inconclusive, at the context's ω² it found (analysis.power.context_power;
    ``base_ratio``: the bases' variance against a cell's own, as the test estimated them)."""
    if omega2 <= 0:
        return "; no context effect found: more seeds would not decide it"
    times = context_seeds_needed(contexts, cells_per_context, omega2, confidence, base_ratio=base_ratio)
    if times is None:
        return (f"; at ω² {omega2:.2f}, more seeds alone do not reach 80% power (a context's one base evaluation "
                "does not shrink with them): more workflow-task-scales might")  # fmt: skip
    return f"; at ω² {omega2:.2f}, 80% power needs about {times} times the seeds"


def context_verdict(p_context: float, p_policy: float, omega_context: float, omega_policy: float, alpha: float) -> str:
    """Claim 2's verdict from its two tests, one family under Holm (the smaller p below ``alpha`` / 2,
    then the other below ``alpha``): supported where the context's test rejects and its ω² exceeds
    policy's, contradicted the same for policy (docs/report.md, claim 2)."""
    first, second = sorted((p_context, p_policy))
    rejects = first < alpha / 2
    context = rejects and (p_context == first or p_context < alpha)
    policy = rejects and (p_policy == first or p_policy < alpha)
    if context and omega_context > omega_policy:
        return "supported"
    if policy and omega_policy > omega_context:
        return "contradicted"
    return "inconclusive"


def context_anova(frame: pd.DataFrame, terms: str, describe: bool = True) -> dict | None:
    """The two tests of claim 2 on ``frame`` (``gain``, the context's columns, ``policy``,
    ``base_var``: the squared SE of each cell's base evaluation): ``p_context``, ``p_policy``,
    ``omega2_context``, ``omega2_policy`` (as computed, below 0 too), and the η² of the context's
    main effects, its interactions and policy (Type II sums of squares). None without residual
    degrees of freedom or variance, or with a context whose mean has none. docs/report.md
    (claim 2) derives both tests and their ω²."""
    import numpy as np
    from scipy.special import fdtrc

    gain = frame["gain"].to_numpy(dtype=float)
    contexts = [column for column in frame.columns if column not in ("gain", "policy", "base_var")]
    keys = list(zip(*(frame[column].tolist() for column in contexts)))
    code_of = {key: i for i, key in enumerate(sorted(set(keys)))}
    context_codes = np.array([code_of[key] for key in keys])
    policy = np.array(frame["policy"].tolist())
    indicators = np.eye(len(code_of))[context_codes]
    modes = np.stack([(policy == level).astype(float) for level in sorted(set(policy.tolist()))[1:]], axis=1)
    base_var = frame["base_var"].to_numpy(dtype=float)
    total = float(((gain - gain.mean()) ** 2).sum())
    full_fit, full_ssr, full_rank = _least_squares(np.hstack([indicators, modes]), gain)
    df_resid = len(gain) - full_rank
    if df_resid < 1 or total <= 0 or full_ssr <= total * 1e-12:
        return None
    _, context_ssr, context_rank = _least_squares(indicators, gain)
    mse = full_ssr / df_resid
    sizes = np.bincount(context_codes)
    cells_per_context = float(sizes.mean())
    error = mse + cells_per_context * float((np.bincount(context_codes, weights=base_var) / sizes).mean())
    df = full_rank - context_rank
    p_policy = float(fdtrc(df, df_resid, (context_ssr - full_ssr) / df / mse)) if df > 0 else 1.0
    out = {"p_policy": p_policy, "omega2_policy": (context_ssr - full_ssr - df * mse) / (total + error)}
    adjusted = gain - modes @ full_fit[indicators.shape[1]:]  # policy's fitted effect taken out of every gain
    test = _context_test(adjusted, base_var, context_codes, mse)
    if test is None:
        return None
    statistic, df_context, harmonic_variance, known = test
    out["p_context"] = known_share_p(statistic, df_context, df_resid, known)
    # n̄·V_h·W is the context's sum of squares as the test weighs the contexts (see the docstring).
    out["omega2_context"] = df_context * cells_per_context * harmonic_variance * (statistic - 1) / (total + error)
    out["base_ratio"] = float(base_var.mean()) / mse  # a base evaluation's variance against a cell's own, for power
    if describe:
        import statsmodels.formula.api as smf
        from statsmodels.stats.anova import anova_lm

        table = anova_lm(smf.ols(f"gain ~ {terms} + C(policy)", frame).fit(), typ=2)
        effects = [term for term in table.index if term not in ("Residual", "C(policy)")]
        main = [term for term in effects if ":" not in term]
        out["eta2_main"] = float(table.loc[main, "sum_sq"].sum()) / total
        out["eta2_interactions"] = float(table.loc[[t for t in effects if t not in main], "sum_sq"].sum()) / total
        out["eta2_policy"] = float(table.loc["C(policy)", "sum_sq"]) / total
    return out


def _least_squares(x, y) -> tuple:
    """``(coefficients, residual sum of squares, rank)`` of the least-squares fit of ``y`` on ``x``'s columns."""
    import numpy as np

    coefficients, _, rank, _ = np.linalg.lstsq(x, y, rcond=None)
    residual = y - x @ coefficients
    return coefficients, float(residual @ residual), int(rank)


def _context_test(adjusted, base_var, codes, mse: float) -> tuple[float, int, float, float] | None:
    """``(W/(C − 1), C − 1, V_h, k)`` of the context's test (:func:`context_anova`; V_h the harmonic mean
    of the contexts' variances V_c, k the mean share of V_c that is known, s_c²/V_c), None where a
    context's mean has no variance to weigh it by."""
    import numpy as np

    sizes = np.bincount(codes).astype(float)
    mean = np.bincount(codes, weights=adjusted) / sizes
    base = np.bincount(codes, weights=base_var) / sizes
    variances = base + mse / sizes
    if len(mean) < 2 or not (variances > 0).all():
        return None
    weights = 1 / variances
    centre = float((weights * mean).sum() / weights.sum())
    statistic = float((weights * (mean - centre) ** 2).sum()) / (len(mean) - 1)
    return statistic, len(mean) - 1, float(len(mean) / weights.sum()), float((base / variances).mean())


def claim_peaks(rows: Sequence[dict], extra: Sequence[str], confidence: float) -> dict:
    """3. Isolated policies reach higher peaks: the mean paired difference over configurations."""
    pairs = _pairs(rows, extra)
    if not pairs:
        return _untestable(_no_pairs_why(rows))
    cells = [cell for group in pairs for pair in group for cell in pair]
    groups = pairs if len(pairs) > 1 else [[pair] for pair in pairs[0]]
    units = [sum(i["peak"] - s["peak"] for i, s in group) / len(group) for group in groups]
    unit = "configurations" if len(pairs) > 1 else "seeds of one configuration"
    mean = sum(units) / len(units)
    if len(units) < 2:
        return _result(mean, math.nan, math.nan, 0.0, cells, f"{mean:+.3f}", "one pair: no interval; more seeds or configurations")
    variances = [sum(_peak_var(i) + _peak_var(s) for i, s in group) / len(group) ** 2 for group in groups]
    found = peak_verdict(units, variances, confidence)
    why = f"isolated higher in {sum(u > 0 for u in units)} of {len(units)} {unit}"
    if found.floored:
        why += f"; the peaks' evaluation error ({found.se:.4f} SE of the mean) sets the interval, wider than their spread's"
    if found.flips_disagree:
        why += f"; the interval excludes 0 but the sign-flip test does not agree (p {found.flip_p:.3f}): inconclusive"
    spread = math.sqrt(sum((u - mean) ** 2 for u in units) / (len(units) - 1))
    if found.verdict == "inconclusive" and spread > 0:
        effect = abs(mean) / spread
        needed = peak_units_needed(effect, confidence)
        count = "no number of" if needed is None else f"{needed}"
        what = "configurations" if len(pairs) > 1 else "seed pairs"
        why += f"; at this mean, {effect:.2f} of their standard deviation, 80% power needs {count} {what}"
    fragility = peak_fragility(units, variances, found.verdict, confidence)
    return _result(mean, found.lo, found.hi, 0.0, cells, _diff_text(mean, found.lo, found.hi, 3), why,
                   decided=found.verdict, p=found.p, fragility=fragility)  # fmt: skip


@dataclass(frozen=True)
class PeakVerdict:
    """Claim 3's decision on its units: the interval (``lo``, ``hi``) with its SE, whether the evaluation
    error's floor set it, the sign-flip test's p (NaN where the interval holds 0), the verdict and its p
    (the t's, or the larger of the two tests' where the interval excludes 0)."""

    lo: float
    hi: float
    se: float
    floored: bool
    flip_p: float
    verdict: str
    p: float

    @property
    def flips_disagree(self) -> bool:
        return verdict(self.lo, self.hi, 0.0) != "inconclusive" and self.verdict == "inconclusive"


def peak_verdict(units: Sequence[float], variances: Sequence[float], confidence: float) -> PeakVerdict:
    """Claim 3 on ``units`` (each configuration's mean peak difference, with its evaluation variance):
    decided when the Student-t interval of their mean excludes 0 (its SE never below the evaluation
    error's) and the exact sign-flip test agrees at the same level (docs/report.md, claim 3)."""
    from scipy.special import stdtr, stdtrit

    m = len(units)
    mean = sum(units) / m
    spread = math.sqrt(sum((u - mean) ** 2 for u in units) / (m - 1))
    floor = math.sqrt(sum(variances)) / m
    se = max(spread / math.sqrt(m), floor)
    half = float(stdtrit(m - 1, (1 + confidence) / 2)) * se
    lo, hi = mean - half, mean + half
    t_p = float(2 * stdtr(m - 1, -abs(mean) / se)) if se > 0 else math.nan
    decided = verdict(lo, hi, 0.0)
    if decided == "inconclusive":  # the sign-flip test only confirms: its p is not needed
        return PeakVerdict(lo, hi, se, se == floor and se > 0, math.nan, decided, t_p)
    flip_p = sign_flip_p(units)
    if not flip_p < 1 - confidence:
        decided = "inconclusive"
    return PeakVerdict(lo, hi, se, se == floor and se > 0, flip_p, decided, max(t_p, flip_p))


def sign_flip_p(units: Sequence[float]) -> float:
    """The two-sided p of the sign-flip (randomization) test that ``units`` are symmetric about 0: the
    share of sign patterns whose sum is at least as far from 0 (:func:`power.sign_patterns`; with drawn
    patterns the observed one counts too, which keeps the p valid)."""
    import numpy as np

    values = np.asarray(units, dtype=float)
    observed = abs(values.sum()) - 1e-12 * max(1.0, float(np.abs(values).sum()))
    signs = sign_patterns(len(values))
    beyond = int((np.abs(signs @ values) >= observed).sum())
    return beyond / len(signs) if len(values) <= 16 else (1 + beyond) / (1 + len(signs))


def peak_fragility(units: Sequence[float], variances: Sequence[float], decided: str, confidence: float) -> str:
    """The fewest units whose removal changes claim 3's verdict: removed one at a time, each time the one
    that most moves the interval against the verdict (toward a decision for an inconclusive one)."""
    pairs = list(zip(units, variances))
    removed = 0
    while len(pairs) > 2:
        mean = sum(u for u, _ in pairs) / len(pairs)
        # Against a decided verdict, drop the unit furthest on its side; toward one, the furthest against the mean.
        side = 1 if (decided == "supported" or (decided == "inconclusive" and mean < 0)) else -1
        pairs.remove(max(pairs, key=lambda pair: side * pair[0]))
        removed += 1
        if peak_verdict([u for u, _ in pairs], [v for _, v in pairs], confidence).verdict != decided:
            return f"{removed} removal{'s' if removed != 1 else ''}"
    return "no removal"


def _peak_var(row: dict) -> float:
    """The squared SE of a cell's peak evaluation, from its ``peak_gain_z`` and its base's SE (the peak's
    and the base's make the rise's); the base's own where the peak is the base."""
    base_se = 0.0 if missing(row.get("base_se")) else float(row["base_se"])
    rise, z = float(row["peak"]) - float(row["base"]), row.get("peak_gain_z")
    if rise == 0 or missing(z) or not math.isfinite(float(z)) or float(z) == 0:
        return base_se**2
    return max((rise / float(z)) ** 2 - base_se**2, 0.0)


def _flips(n: int) -> str:
    return f"{n} flip{'s' if n != 1 else ''}"


def sign_fragility(k: int, m: int, confidence: float) -> str:
    """The fewest units whose flip changes a sign test's verdict on k of m: a decided one, flips from its
    side to the other until the interval reaches 0.5; an inconclusive one, flips to the nearer side that
    decides ("no flip": none does)."""
    threshold = sign_threshold(m, confidence)
    if threshold is None:
        return "no flip"
    if k >= threshold:
        return _flips(k - threshold + 1)
    if m - k >= threshold:
        return _flips(m - k - threshold + 1)
    return _flips(min(threshold - k, threshold - (m - k)))


def mechanism_fragility(tables: Sequence, decided: str, alpha: float) -> str:
    """The fewest cells whose early-or-not flips change claims 6-7's verdict (each flip toward the other
    side, one at a time, the margins of its table moving with it)."""
    import copy

    current = [copy.copy(t) for t in tables]
    for flips in range(1, sum(t.cliffs + t.calm for t in tables) + 1):
        moved = False
        for t in current:  # one flip against the verdict (toward it for an inconclusive one, to support)
            towards_support = decided != "supported"
            if towards_support and t.preceded < t.cliffs:
                t.preceded += 1
            elif towards_support and t.rose > 0:
                t.rose -= 1
            elif not towards_support and t.preceded > 0:
                t.preceded -= 1
            elif not towards_support and t.rose < t.calm:
                t.rose += 1
            else:
                continue
            moved = True
            break
        if not moved:
            return "no flip"
        p_high, p_low = stratified_exact(current)
        now = "supported" if p_high < alpha / 2 else "contradicted" if p_low < alpha / 2 else "inconclusive"
        if now != decided:
            return _flips(flips)
    return "no flip"


def sign_p(k: int, m: int) -> float:
    """The sign test's two-sided p of k of m units going one way (twice the smaller tail, at most 1)."""
    from matrixrl.analysis.power import binomial_tail

    return min(1.0, 2 * min(binomial_tail(m, k, 0.5), binomial_tail(m, m - k, 0.5)))


FAMILY = (2, 3, 4, 5, 6, 7)
"""The claims that are one family under ``family="holm"``: those that test one study's differences
(claim 1 is the study's premise, tested on its own)."""


def family_holm(results: dict[int, dict], alpha: float) -> dict[int, dict]:
    """``results`` with Holm's procedure across :data:`FAMILY`: the claims with a p, ordered by it, are
    decided while the i-th smallest (of m) is below α/(m − i + 1); from the first that is not, a
    supported or contradicted verdict becomes ``inconclusive``, its ``why`` saying so."""
    tested = sorted((row["p"], claim) for claim, row in results.items() if claim in FAMILY and math.isfinite(row["p"]))
    out = dict(results)
    stopped = False
    for i, (p, claim) in enumerate(tested):
        level = alpha / (len(tested) - i)
        stopped = stopped or p >= level
        row = results[claim]
        if stopped and row["verdict"] in ("supported", "contradicted"):
            out[claim] = {**row, "verdict": "inconclusive",
                          "why": f"{row['why']}; {row['verdict']} alone, not under Holm across claims 2-7 (p {p:.3g}, "
                                 f"its step's level {level:.3g})"}  # fmt: skip
    return out


def claim_cliffs(rows: Sequence[dict], extra: Sequence[str], confidence: float) -> dict:
    """4. Isolated policies fall off terminal cliffs more often: a sign test over configurations (those
    of a sweep that share one base evaluation, one unit: a cliff's real peak reads against it)."""
    pairs = _pairs(rows, extra, by_base=True)
    if not pairs:
        return _untestable(_no_pairs_why(rows))
    cells = [cell for group in pairs for pair in group for cell in pair]
    collapses = sum(cell.get("signature") == "collapse" for cell in cells)  # named: they are not cliffs
    aside = f"; {collapses} collapse{'s' if collapses > 1 else ''}" if collapses else ""
    if not any(bool(cell["cliff"]) for cell in cells):
        return _untestable(f"no terminal cliff in the {len(cells)} paired cells{aside}", cells)
    diffs = [sum(bool(i["cliff"]) - bool(s["cliff"]) for i, s in group) / len(group) for group in pairs]
    rates = [sum(bool(pair[side]["cliff"]) for group in pairs for pair in group) / (len(cells) / 2) for side in (0, 1)]
    described = f"cliff rates {rates[0]:.2f} isolated, {rates[1]:.2f} shared (Δ {_mean(diffs):+.2f}){aside}"
    k, m = sum(d > 0 for d in diffs), sum(d != 0 for d in diffs)
    if m == 0:
        return _result(math.nan, math.nan, math.nan, 0.5, cells, None, f"equal in every configuration; {described}")
    lo, hi = clopper_pearson(k, m, confidence)
    why = f"isolated's higher in {k} of {m}; {described}"
    if verdict(lo, hi, 0.5) == "inconclusive":
        why += _sign_note(k, m, "configurations whose cliff rates differ", confidence)
    return _result(k / m, lo, hi, 0.5, cells, _share_text(k, m, lo, hi), why, p=sign_p(k, m), fragility=sign_fragility(k, m, confidence))


def claim_failures(rows: Sequence[dict], extra: Sequence[str], confidence: float) -> dict:
    """5. Shared policies redistribute failure into other patterns: a sign test over configurations
    (those of a sweep sharing one base, one unit), k of the m whose modes' shares of non-cliff
    failures differ where shared's is higher (docs/report.md, claim 5)."""
    pairs = _pairs(rows, extra, by_base=True)
    if not pairs:
        return _untestable(_no_pairs_why(rows))
    cells = [cell for group in pairs for pair in group for cell in pair]
    counts = {
        mode: [sum(pair[side]["signature"] == s for group in pairs for pair in group) for s in SIGNATURES]
        for side, mode in enumerate(("isolated", "shared"))
    }
    described = "/".join(SIGNATURES) + ": " + ", ".join(f"{mode} " + "/".join(map(str, counts[mode])) for mode in ("shared", "isolated"))
    if not counts["isolated"][0] and not counts["shared"][0]:
        return _untestable(f"no paired cell cliffs; {described}", cells)
    diffs = []
    for group in pairs:
        shares = [_not_cliff_share([pair[side]["signature"] for pair in group]) for side in (1, 0)]  # shared, isolated
        if None not in shares:
            diffs.append(shares[0] - shares[1])
    if not diffs:
        return _untestable(f"no configuration fails under both modes; {described}", cells)
    k, m = sum(d > 0 for d in diffs), sum(d != 0 for d in diffs)
    if m == 0:
        return _result(math.nan, math.nan, math.nan, 0.5, cells, None, f"equal in every configuration; {described}")
    lo, hi = clopper_pearson(k, m, confidence)
    why = described
    if verdict(lo, hi, 0.5) == "inconclusive":
        why += _sign_note(k, m, "configurations failing under both modes in different shares of cliffs", confidence)
    return _result(k / m, lo, hi, 0.5, cells, _share_text(k, m, lo, hi), why, p=sign_p(k, m), fragility=sign_fragility(k, m, confidence))


def _not_cliff_share(signatures: Sequence[str]) -> float | None:
    """Of the seeds that failed (any signature but ``gain``), the share whose failure is not a cliff;
    None when none failed."""
    failed = [signature for signature in signatures if signature != "gain"]
    return sum(signature != "cliff" for signature in failed) / len(failed) if failed else None


def claim_mechanism(claim: int, rows: Sequence[dict], policy: str, signal: str, confidence: float,
                    extra: Sequence[str] = ()) -> dict:  # fmt: skip
    """6 and 7. The signal precedes cliffs more often than it rises as early without one: per
    configuration with a cliff and a calm run, its 2×2 table; the exact stratified test decides and
    the Mantel–Haenszel difference estimates (docs/report.md, claims 6 and 7)."""
    cells = [row for row in rows if row["policy"] == policy and row.get("signal") == signal]
    if not cells:
        return _untestable(f"no {policy} cell with {_a(signal)} signal (gradient diagnostics)")
    cliffs = [row for row in cells if bool(row["cliff"]) and row.get("verdict") in ("precedes", "coincides", "absent")]
    # The control: runs without a cliff that did not collapse either (a collapse's verdict is ``collapse``).
    calm = [row for row in cells if not bool(row["cliff"]) and row.get("verdict") == "no cliff"]
    if not cliffs:
        return _untestable(f"no {policy} cliff with a testable {signal} signal: nothing to precede", calm)
    if not calm:
        return _untestable(f"every {policy} cell with {_a(signal)} signal ends in a cliff: no control", cliffs)
    tables = mechanism_strata([*cliffs, *calm], extra)
    used = [row for table in tables for row in table.rows]
    k1 = sum(table.preceded for table in tables)
    n1 = sum(table.cliffs for table in tables)
    k0 = sum(table.rose for table in tables)
    n0 = sum(table.calm for table in tables)
    if not tables:
        return _result(math.nan, math.nan, math.nan, 0.0, [*cliffs, *calm], None,
                       f"{len(cliffs)} cliffs and {len(calm)} calm runs, never both in one configuration: "
                       "nothing to compare within one (more seeds)", "inconclusive")  # fmt: skip
    estimate = mantel_haenszel_difference(tables)
    p_high, p_low = stratified_exact(tables)
    alpha = 1 - confidence
    decided = "supported" if p_high < alpha / 2 else "contradicted" if p_low < alpha / 2 else "inconclusive"
    why = (f"within {_plural_of(len(tables), 'configuration')}: precedes {k1} of {n1} cliffs; rose as early in {k0} of {n0} "
           f"without one; exact p {min(p_high, p_low):.3g} ({'above' if p_high <= p_low else 'below'})")  # fmt: skip
    left = len(cliffs) + len(calm) - len(used)
    if left:
        why += f"; {left} cells in configurations without both left out"
    evidence = f"MH {estimate:+.2f}, {k1}/{n1} vs {k0}/{n0}"
    return _result(estimate, math.nan, math.nan, 0.0, used, evidence, why, decided, p=min(1.0, 2 * min(p_high, p_low)),
                   fragility=mechanism_fragility(tables, decided, alpha))  # fmt: skip


def _plural_of(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


class _Stratum:
    """One configuration's 2×2 table of claims 6 and 7."""

    def __init__(self, rows: list[dict]) -> None:
        cliffs = [row for row in rows if bool(row["cliff"])]
        calm = [row for row in rows if not bool(row["cliff"])]
        window = median(int(row["pre_onset"]) for row in cliffs)
        self.rows = rows
        self.cliffs, self.calm = len(cliffs), len(calm)
        self.preceded = sum(row["verdict"] == "precedes" for row in cliffs)
        self.rose = sum(not missing(row.get("rise_step")) and int(row["rise_step"]) <= window for row in calm)


def mechanism_strata(rows: Sequence[dict], extra: Sequence[str] = ()) -> list[_Stratum]:
    """The configurations of ``rows`` (cliffs and calm runs of one mode) that hold both, each as its table."""
    tables = []
    for _, group in grouped_rows(rows, ["workflow", "task", "scale", *extra]):
        kinds = {bool(row["cliff"]) for row in group}
        if kinds == {True, False}:
            tables.append(_Stratum(group))
    return tables


def mantel_haenszel_difference(tables: Sequence[_Stratum]) -> float:
    """The Mantel–Haenszel difference of the shares early (cliffs minus calm runs) over the strata."""
    top = sum((t.preceded * t.calm - t.rose * t.cliffs) / (t.cliffs + t.calm) for t in tables)
    bottom = sum(t.cliffs * t.calm / (t.cliffs + t.calm) for t in tables)
    return top / bottom


def stratified_exact(tables: Sequence[_Stratum]) -> tuple[float, float]:
    """``(P(T ≥ t), P(T ≤ t))`` of the exact conditional test: T the preceded cliffs summed over the
    strata, each stratum's hypergeometric given its margins (cliffs, calm, and how many were early)."""
    import numpy as np
    from scipy.stats import hypergeom

    pmf = np.ones(1)
    low = 0
    for t in tables:
        early = t.preceded + t.rose
        support = np.arange(max(0, early - t.calm), min(early, t.cliffs) + 1)
        pmf = np.convolve(pmf, hypergeom.pmf(support, t.cliffs + t.calm, early, t.cliffs))
        low += int(support[0])
    observed = sum(t.preceded for t in tables) - low
    return float(min(1.0, pmf[observed:].sum())), float(min(1.0, pmf[: observed + 1].sum()))


def _a(word: str) -> str:
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


def _fixed(value: float) -> str:
    """``value`` to 2 decimals, without a sign on a zero (-0.001 is 0.00, not -0.00)."""
    return f"{value:.2f}".replace("-0.00", "0.00")
