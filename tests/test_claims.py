"""`report --table claims`: each finding of the study tested on constructed stores whose
verdicts are worked out by hand, under the rules of docs/report.md ("claims").

Every store is filled through the store's own API with curves (and, for claims 6 and 7,
gradient diagnostics) chosen so that each figure below follows on paper: evaluations of
1000 problems without stored SEs, so a checkpoint's SE is the binomial sqrt(a(1-a)/1000).
Each claim is seen supported, contradicted, inconclusive and untestable at least once.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from test_report_tables import FELL, MECHANISM, NO_CLIFF, CLIFF_AT_40, amplification, evaluations, fill, jump, shares, training

from conftest import run_cli
from matrixrl.analysis.claims import CLAIMS_COLUMNS, FINDINGS, VERDICTS, claims_table, clopper_pearson
from matrixrl.analysis.power import sign_power, t_power, peak_units_needed
from matrixrl.config import load_config
from matrixrl.grid import Cell
from matrixrl.report import TABLES
from matrixrl.report.tables import build_tables

approx = pytest.approx
T5 = 2.5706  # Student-t 97.5% quantile, 5 degrees of freedom
MULTI = ("voting", "eval_opt", "orch_workers")
TASKS = ("arith", "pyfunc")


def config_for(experiment: Path, workflow: str, task: str = "[arith, pyfunc]", policy: str = "[shared, isolated]", seed: str = "[0]", extra=()):
    sets = [f"grid.workflow={workflow}", f"grid.task={task}", "grid.scale=[tiny-s]", f"grid.policy={policy}", f"grid.seed={seed}", *MECHANISM, *extra]
    return load_config(experiment, sets=sets)


def cell(workflow: str, policy: str, task: str = "arith", seed: int = 0) -> Cell:
    return Cell(workflow=workflow, task=task, scale="tiny-s", policy=policy, seed=seed)


def claims_of(config, results: list) -> dict[int, dict]:
    """The claims table of a store holding ``results``, as ``--format json`` has it, by claim."""
    path = fill(config, results)
    frame = build_tables(path, config, ["claims"])["claims"]
    assert list(frame.columns) == CLAIMS_COLUMNS
    rows = json.loads(frame.to_json(orient="records"))
    assert [r["claim"] for r in rows] == list(range(1, 8))
    assert all(r["verdict"] in VERDICTS and r["why"] for r in rows)
    return {r["claim"]: r for r in rows}


def verdicts(claims: dict[int, dict]) -> dict[int, str]:
    return {n: r["verdict"] for n, r in claims.items()}


# --- the intervals -------------------------------------------------------------------------


def test_clopper_pearson_by_hand() -> None:
    # k = n: the lower bound solves p^n = 0.025, so n all one way excludes 0.5 from n = 6 on.
    for n in (4, 5, 6, 12):
        assert clopper_pearson(n, n) == (approx(0.025 ** (1 / n)), 1.0)
    assert clopper_pearson(5, 5)[0] < 0.5 < clopper_pearson(6, 6)[0]
    assert clopper_pearson(0, 6) == (0.0, approx(1 - 0.025 ** (1 / 6)))
    # 1 of 2: the beta quantiles have closed forms, sqrt(0.025)·... : lo = 1 - sqrt(0.975), hi = sqrt(0.975).
    assert clopper_pearson(1, 2) == (approx(1 - math.sqrt(0.975)), approx(math.sqrt(0.975)))
    assert all(math.isnan(v) for v in clopper_pearson(0, 0))


# --- claims 1, 3, 4, 5: the study's story, its mirror, and a study that says little -------

# Isolated peaks high and collapses (a cliff at 30, still above base); shared creeps up 0.03 (1.4 SEs:
# no gain beyond noise) and stays there. Isolated's peak differs by configuration.
ISOLATED_PEAKS = {("voting", "arith"): 0.70, ("voting", "pyfunc"): 0.68, ("eval_opt", "arith"): 0.72,
                  ("eval_opt", "pyfunc"): 0.70, ("orch_workers", "arith"): 0.66, ("orch_workers", "pyfunc"): 0.74}  # fmt: skip
CLIFF = lambda peak: [0.3, 0.6, peak, 0.35]  # noqa: E731  peak @ 20, onset 30: gain +0.05
CREEP = [0.3, 0.34, 0.36, 0.33]  # peak 0.36, drop 0.03 (1.4 SEs), gain 0.03 (1.4 SEs): "no gain"


def story(experiment: Path, collapsing: str) -> dict[int, dict]:
    """The 12 multi-agent configurations (3 workflows × 2 tasks × 2 modes, one seed): the mode
    ``collapsing`` peaks high and falls off a cliff, the other creeps up within noise."""
    config = config_for(experiment, "[voting, eval_opt, orch_workers]")
    other = "shared" if collapsing == "isolated" else "isolated"
    results = []
    for (workflow, task), peak in ISOLATED_PEAKS.items():
        results += evaluations(cell(workflow, collapsing, task), CLIFF(peak))
        results += evaluations(cell(workflow, other, task), CREEP)
    return claims_of(config, results)


def test_the_studys_story_supports_claims_1_3_4_and_5(experiment: Path) -> None:
    claims = story(experiment, "isolated")
    assert verdicts(claims) == {1: "supported", 2: "inconclusive", 3: "supported", 4: "supported", 5: "supported",
                                6: "untestable", 7: "untestable"}  # fmt: skip
    # 1: all 6 workflow-task-scales (each one base evaluation) end above base: 6/6, [0.025^(1/6), 1].
    one = claims[1]
    assert (one["estimate"], one["lo"], one["hi"], one["null"]) == (1.0, approx(0.025 ** (1 / 6)), 1.0, 0.5)
    assert (one["n_cells"], one["n_seeds"], one["evidence"]) == (12, 1, "6/6: 1.00 [0.54, 1.00]")
    # gain_z: isolated 0.05 / sqrt((.35·.65 + .3·.7)/1000), shared 0.03 / sqrt((.33·.67 + .3·.7)/1000).
    z = (0.05 / math.sqrt((0.35 * 0.65 + 0.21) / 1000) + 0.03 / math.sqrt((0.33 * 0.67 + 0.21) / 1000)) / 2
    assert one["why"].startswith(f"6 of 6 workflow-task-scales gain; mean gain {z:+.1f} SE")
    # 2: every gain is 0.05 or 0.03 by policy alone: the model fits exactly, nothing to test against.
    assert claims[2]["why"].startswith("no residual degrees of freedom")
    # 3: peak differences 0.34, 0.32, 0.36, 0.34, 0.30, 0.38: mean 0.34, s = sqrt(0.0008), t(5).
    three = claims[3]
    half = T5 * math.sqrt(0.0008) / math.sqrt(6)
    assert (three["estimate"], three["lo"], three["hi"]) == (approx(0.34), approx(0.34 - half, rel=1e-4), approx(0.34 + half, rel=1e-4))
    assert three["why"] == "isolated higher in 6 of 6 configurations" and three["n_cells"] == 12
    # 4: isolated cliffs in all 6 configurations, shared in none: 6 of 6, [0.025^(1/6), 1].
    four = claims[4]
    assert (four["estimate"], four["lo"]) == (1.0, approx(0.025 ** (1 / 6)))
    assert four["why"] == "isolated's higher in 6 of 6; cliff rates 1.00 isolated, 0.00 shared (Δ +1.00)"
    # 5: in each configuration shared's failure is "no gain" (not a cliff: share 1), isolated's a cliff
    # (share 0): shared's share is higher in 6 of 6 configurations, [0.025^(1/6), 1], as claim 4's.
    five = claims[5]
    assert (five["estimate"], five["lo"], five["hi"], five["null"]) == (1.0, approx(0.025 ** (1 / 6)), 1.0, 0.5)
    assert five["why"] == "cliff/collapse/decline/no gain/gain: shared 0/0/0/6/0, isolated 6/0/0/0/0"
    assert five["evidence"] == "6/6: 1.00 [0.54, 1.00]"
    assert claims[6]["why"] == "no isolated cell with an amplification signal (gradient diagnostics)"


def test_the_mirror_story_contradicts_claims_3_4_and_5(experiment: Path) -> None:
    claims = story(experiment, "shared")
    assert verdicts(claims) == {1: "supported", 2: "inconclusive", 3: "contradicted", 4: "contradicted", 5: "contradicted",
                                6: "untestable", 7: "untestable"}  # fmt: skip
    assert claims[3]["estimate"] == approx(-0.34) and claims[3]["hi"] < 0
    assert (claims[4]["estimate"], claims[4]["hi"]) == (0.0, approx(1 - 0.025 ** (1 / 6)))
    assert claims[4]["evidence"] == "0/6: 0.00 [0.00, 0.46]"
    assert (claims[5]["estimate"], claims[5]["hi"]) == (0.0, approx(1 - 0.025 ** (1 / 6)))
    assert claims[5]["why"] == "cliff/collapse/decline/no gain/gain: shared 6/0/0/0/0, isolated 0/0/0/6/0"


def test_a_study_that_says_little_is_inconclusive(experiment: Path) -> None:
    """Half the configurations gain; isolated's peaks are higher in some, lower in others; 3
    configurations differ in cliffs, all the isolated way (3 of 3 is not enough for the exact
    interval); each mode fails as cliffs and otherwise, in proportions 6 failures cannot tell apart."""
    config = config_for(experiment, "[voting, eval_opt, orch_workers]")
    collapse, flat = [0.3, 0.6, 0.7, 0.35], [0.3, 0.31, 0.29]  # a cliff; a loss of 0.01 (no gain)
    decline = [0.3, 0.28, 0.24]  # a loss of 0.06: 3 SEs below its peak (the base), short of a cliff's 0.1
    curves = {
        # (workflow, task): (isolated, shared)
        ("voting", "arith"): (collapse, decline),
        ("voting", "pyfunc"): ([0.3, 0.5, 0.65, 0.35], [0.3, 0.5, 0.8, 0.4]),  # both cliffs (isolated's peak lower)
        ("eval_opt", "arith"): (collapse, decline),
        ("eval_opt", "pyfunc"): (flat, flat),
        ("orch_workers", "arith"): ([0.3, 0.6, 0.72, 0.35], [0.3, 0.9, 0.85, 0.82]),  # cliff vs decline (0.9 → 0.82)
        ("orch_workers", "pyfunc"): (flat, flat),
    }
    results = []
    for (workflow, task), (isolated, shared) in curves.items():
        results += [*evaluations(cell(workflow, "isolated", task), isolated), *evaluations(cell(workflow, "shared", task), shared)]
    claims = claims_of(config, results)
    assert [verdicts(claims)[n] for n in (1, 3, 4, 5)] == ["inconclusive"] * 4
    # 1: mean gains of the modes: voting arith (+0.05 - 0.06) / 2 < 0, voting pyfunc > 0, eval_opt arith < 0,
    # eval_opt pyfunc -0.01, orch_workers arith > 0, orch_workers pyfunc -0.01: 2 of 6 gain.
    assert (claims[1]["estimate"], claims[1]["evidence"]) == (approx(1 / 3), "2/6: 0.33 [0.04, 0.78]")
    # 3: peaks 0.7-0.3, 0.65-0.8, 0.7-0.3, 0.31-0.31, 0.72-0.9, 0.31-0.31.
    diffs = [0.4, -0.15, 0.4, 0.0, -0.18, 0.0]
    mean, s = np.mean(diffs), np.std(diffs, ddof=1)
    assert claims[3]["estimate"] == approx(mean) and claims[3]["lo"] == approx(mean - T5 * s / math.sqrt(6), rel=1e-4)
    # An inconclusive verdict says what would decide it at the effect it found: mean/s of the units.
    needed = peak_units_needed(mean / s, 0.95)
    assert needed > 6 and t_power(needed, mean / s, 0.95) >= 0.8 > t_power(needed - 1, mean / s, 0.95)
    assert claims[3]["why"] == (
        f"isolated higher in 2 of 6 configurations; at this mean, {mean / s:.2f} of their standard deviation, "
        f"80% power needs {needed} configurations"
    )
    # 4: isolated cliffs in 4, shared in 1 (voting pyfunc, with isolated's): 3 configurations differ; at 3 of 3,
    # the 6 a unanimous sign test needs (P(Bin(6, 1) ≥ 6) = 1).
    assert (claims[4]["estimate"], claims[4]["lo"]) == (1.0, approx(0.025 ** (1 / 3)))
    assert claims[4]["why"] == (
        "isolated's higher in 3 of 3; cliff rates 0.67 isolated, 0.17 shared (Δ +0.50); "
        "at 3 of 3, 80% power needs 6 configurations whose cliff rates differ"
    )
    # 5: every configuration fails under both modes. Not cliffs, shared against isolated: voting arith,
    # eval_opt arith and orch_workers arith 1 against 0, voting pyfunc 0 against 0, the flat pairs 1 against 1:
    # 3 configurations differ, all shared's way, and 3 of 3 is not enough.
    assert claims[5]["why"] == (
        "cliff/collapse/decline/no gain/gain: shared 1/0/3/2/0, isolated 4/0/0/2/0; "
        "at 3 of 3, 80% power needs 6 configurations failing under both modes in different shares of cliffs"
    )
    # 1: 2 of 6 gain, so 4 of 6 lose: a contradiction at that share (2/3) needs, by the binomial tail,
    # the fewest m whose threshold k (P(Bin(m, ½) ≥ k) < 0.025) P(Bin(m, 2/3) ≥ k) reaches 0.8.
    m = next(m for m in range(6, 500) if sign_power(m, 2 / 3, 0.95) >= 0.8)
    assert claims[1]["why"].endswith(f"; at 2 of 6, 80% power needs {m} workflow-task-scales (seeds add none: they share its base)")
    assert (claims[5]["estimate"], claims[5]["lo"], claims[5]["hi"]) == (1.0, approx(0.025 ** (1 / 3)), 1.0)
    assert claims[5]["evidence"] == "3/3: 1.00 [0.29, 1.00]"


def test_losses_contradict_claim_1_and_a_one_configuration_study_uses_its_seeds(experiment: Path) -> None:
    config = config_for(experiment, "[voting, eval_opt, orch_workers]")
    losses = [e for workflow, task, policy in itertools.product(MULTI, TASKS, ("shared", "isolated"))
              for e in evaluations(cell(workflow, policy, task), [0.3, 0.28, 0.25])]  # fmt: skip
    claims = claims_of(config, losses)
    assert (claims[1]["verdict"], claims[1]["estimate"], claims[1]["hi"]) == ("contradicted", 0.0, approx(1 - 0.025 ** (1 / 6)))
    assert (claims[4]["verdict"], claims[5]["verdict"]) == ("untestable", "untestable")
    assert claims[4]["why"] == "no terminal cliff in the 12 paired cells"
    assert claims[5]["why"] == "no paired cell cliffs; cliff/collapse/decline/no gain/gain: shared 0/0/6/0/0, isolated 0/0/6/0/0"

    # One configuration, three seeds: its seeds' pairs are the units. Peaks isolated - shared: 0.1, 0.12, 0.08.
    config = config_for(experiment, "[voting]", task="[arith]", seed="[0, 1, 2]")
    results = []
    for seed, (isolated, shared) in enumerate([(0.5, 0.4), (0.52, 0.4), (0.48, 0.4)]):
        results += [*evaluations(cell("voting", "isolated", seed=seed), [0.3, isolated]),
                    *evaluations(cell("voting", "shared", seed=seed), [0.3, shared])]  # fmt: skip
    claims = claims_of(config, results)
    three = claims[3]
    # Their spread, s = 0.02, is less than the peaks' own evaluation error allows (1000 problems each:
    # the binomial SEs of the three pairs' peaks), which sets the interval: t(2) × that SE of the mean.
    evaluation = math.sqrt(sum(p * (1 - p) / 1000 + 0.4 * 0.6 / 1000 for p in (0.5, 0.52, 0.48))) / 3
    assert evaluation > 0.02 / math.sqrt(3)
    half = 4.302653 * evaluation
    assert (three["estimate"], three["lo"]) == (approx(0.1), approx(0.1 - half, rel=1e-5)) and three["lo"] > 0
    # The interval excludes 0, but three units cannot decide: the sign-flip test's smallest p is 2/8.
    assert three["verdict"] == "inconclusive"
    assert three["why"] == (
        f"isolated higher in 3 of 3 seeds of one configuration; the peaks' evaluation error ({evaluation:.4f} SE of "
        "the mean) sets the interval, wider than their spread's; the interval excludes 0 but the sign-flip test does "
        "not agree (p 0.250): inconclusive; at this mean, 5.00 of their standard deviation, 80% power needs 6 seed pairs"
    )
    assert three["n_seeds"] == 3
    assert claims[2]["why"] == "one workflow, task and scale: no context to vary"
    # With one seed of that one configuration: one pair, no interval.
    one = claims_of(config_for(experiment, "[voting]", task="[arith]"), results[:4])
    assert (one[3]["verdict"], one[3]["evidence"], one[3]["why"]) == ("inconclusive", "+0.100", "one pair: no interval; more seeds or configurations")


def test_grids_that_lack_what_a_claim_needs_say_why(experiment: Path) -> None:
    # Only the control workflow: no multi-agent cell, and its two modes are one run.
    single = config_for(experiment, "[single]", task="[arith]")
    claims = claims_of(single, evaluations(cell("single", "shared"), [0.3, 0.4]))
    assert set(verdicts(claims).values()) == {"untestable"}
    assert claims[1]["why"] == "no multi-agent cell evaluated"
    assert claims[3]["why"] == claims[4]["why"] == "no multi-agent cell (a one-role workflow's two modes are one run)"
    # Shared cells only: no pairs, no policy effect to test, no isolated signal.
    shared = config_for(experiment, "[voting, orch_workers]", policy="[shared]")
    results = [e for w, t in itertools.product(("voting", "orch_workers"), TASKS) for e in evaluations(cell(w, "shared", t), [0.3, 0.4])]
    claims = claims_of(shared, results)
    assert claims[1]["verdict"] == "inconclusive"  # 4 of 4: the exact interval needs 6
    assert claims[2]["why"] == "one policy mode: no policy effect to set against the context"
    assert claims[3]["why"] == "no isolated multi-agent cell"
    assert [claims[n]["verdict"] for n in (2, 3, 4, 5, 6, 7)] == ["untestable"] * 6


# --- claim 2: the ANOVA ----------------------------------------------------------------------


def known_share_by_hand(statistic: float, dfn: int, dfd: int, known: float) -> float:
    """P((χ²_dfn/dfn)/(k + (1 − k)·χ²_dfd/dfd) > statistic), integrated with scipy.stats' densities."""
    from scipy import integrate
    from scipy.stats import chi2

    tail = lambda x: chi2.sf(dfn * statistic * (known + (1 - known) * x / dfd), dfn) * chi2.pdf(x, dfd)  # noqa: E731
    return integrate.quad(tail, 0, np.inf, limit=200)[0]


def anova_by_hand(isolated: list[float], shared: list[float]) -> dict[str, float]:
    """Claim 2's figures for gains on voting/orch_workers × arith/pyfunc (in that order), one seed,
    by least squares on dummy columns (numpy, not statsmodels); the context's p the plug-in's by hand,
    taken through power.known_share_valid (tests/test_design.py checks that it holds its level)."""
    from matrixrl.analysis.power import known_share_valid
    from scipy.stats import f

    rows = [(w, t, p, g) for p, gains in ((1, isolated), (0, shared)) for (w, t), g in zip(itertools.product((0, 1), (0, 1)), gains)]
    r = np.array(rows, dtype=float)
    y = r[:, 3]

    def ssr(context: bool, policy: bool) -> float:
        columns = [np.ones(len(y)), *([r[:, 0], r[:, 1], r[:, 0] * r[:, 1]] if context else []), *([r[:, 2]] if policy else [])]
        x = np.column_stack(columns)
        e = y - x @ np.linalg.lstsq(x, y, rcond=None)[0]
        return float(e @ e)

    full, total = ssr(True, True), float(((y - y.mean()) ** 2).sum())
    mse = full / 3  # 8 cells - 5 parameters
    ss_context, ss_policy = ssr(False, True) - full, ssr(True, False) - full
    # The two cells of a context share its base evaluation (0.3 of 1000 problems): its variance
    # 0.3·0.7/1000, twice (a context mean square holds it once per cell), joins the context's error,
    # and a cell's whole variance (both ω²'s denominator). The error's degrees of freedom: the residual's.
    error = mse + 2 * 0.3 * 0.7 / 1000
    # The context's test: its statistic over a denominator whose base share (2·s²/error) is known and only
    # the residual's estimated (3 degrees of freedom), not an F's.
    known = 2 * 0.3 * 0.7 / 1000 / error
    return {
        "p_context": known_share_valid(known_share_by_hand(ss_context / 3 / error, 3, 3, known), 3, 3), "p_policy": f.sf(ss_policy / mse, 1, 3),
        "omega2_context": (ss_context - 3 * error) / (total + error), "omega2_policy": (ss_policy - mse) / (total + error),
    }  # fmt: skip


@pytest.mark.parametrize(
    "isolated, shared, expected",
    [
        # The context sets the gain (0.05 to 0.35), policy adds ±0.01 crosswise: no policy main effect.
        ([0.06, 0.14, 0.24, 0.36], [0.04, 0.16, 0.26, 0.34], "supported"),
        # Isolated gains 0.2, shared 0, ±0.01 crosswise: every context's mean is the same.
        ([0.21, 0.19, 0.19, 0.21], [-0.01, 0.01, 0.01, -0.01], "contradicted"),
        # Noise of a few points: neither explains anything.
        ([0.05, 0.02, 0.04, 0.01], [0.03, 0.04, 0.01, 0.02], "inconclusive"),
    ],
    ids=["context", "policy", "noise"],
)
def test_claim_2_the_anova_against_a_computation_by_hand(experiment: Path, isolated, shared, expected) -> None:
    config = config_for(experiment, "[voting, orch_workers]")
    results = []
    for policy, gains in (("isolated", isolated), ("shared", shared)):
        for (workflow, task), gain in zip(itertools.product(("voting", "orch_workers"), TASKS), gains):
            results += evaluations(cell(workflow, policy, task), [0.3, 0.3 + gain])
    two = claims_of(config, results)[2]
    hand = anova_by_hand(isolated, shared)
    # A share of variance below 0 is shown, and compared, as 0; its value as computed is in `why`.
    omega_c, omega_p = max(hand["omega2_context"], 0.0), max(hand["omega2_policy"], 0.0)
    assert two["verdict"] == expected
    assert two["estimate"] == approx(omega_c - omega_p, abs=1e-9)
    assert two["evidence"] == f"ω² context {omega_c:.2f}, policy {omega_p:.2f}"
    assert two["why"].startswith(f"p context {hand['p_context']:.3g}, policy {hand['p_policy']:.3g}; ")
    below = [f"{name} {hand[f'omega2_{name}']:.3g}" for name in ("context", "policy") if hand[f"omega2_{name}"] < 0]
    assert (f"; ω² below 0, shown as 0: {', '.join(below)}" in two["why"]) == bool(below)
    assert (two["n_cells"], two["lo"], two["hi"]) == (8, None, None)
    error = 0.0008 / 3 + 0.00042  # MSE + 2 cells · 0.3·0.7/1000
    if expected == "supported":
        assert hand["p_context"] < 0.05 and hand["omega2_context"] == approx((0.1 - 3 * error) / (0.1008 + error))
        # Policy's ±0.01 crosswise is no main effect: its ω² below 0, shown as 0.
        assert hand["omega2_policy"] < 0 and two["evidence"].endswith("policy 0.00")
        assert two["why"].endswith(f"η² main 0.99, interactions 0.00, policy 0.00; ω² below 0, shown as 0: policy {hand['omega2_policy']:.3g}")
    elif expected == "contradicted":
        assert hand["p_policy"] < 0.05 and hand["omega2_policy"] == approx((0.08 - 0.0008 / 3) / (0.0808 + error))
        # Every context's mean is the same: the context's ω² is far below 0 (its error holds the bases').
        assert hand["omega2_context"] < -0.01 and two["evidence"].startswith("ω² context 0.00,")
    else:  # docs/report.md quotes this case's evidence and why
        assert hand["p_context"] > 0.05 and hand["p_policy"] > 0.05
        assert two["evidence"] == "ω² context 0.00, policy 0.00"
        # Inconclusive, it says what would decide it: with no context effect found, no number of seeds.
        assert two["why"].endswith("; ω² below 0, shown as 0: context -0.648, policy -0.104; no context effect found: more seeds would not decide it")


def test_claim_2s_two_tests_are_one_family_under_holm() -> None:
    """Either test decides claim 2, so the smaller p must pass alpha/2 and the other then alpha."""
    from matrixrl.analysis.claims import context_verdict

    assert context_verdict(0.03, 0.2, 0.3, 0.0, 0.05) == "inconclusive"  # each test alone at 5% said supported
    assert context_verdict(0.02, 0.2, 0.3, 0.0, 0.05) == "supported"
    assert context_verdict(0.04, 0.02, 0.3, 0.1, 0.05) == "supported"  # both reject; the context explains more
    assert context_verdict(0.04, 0.02, 0.1, 0.3, 0.05) == "contradicted"
    assert context_verdict(0.2, 0.03, 0.0, 0.3, 0.05) == "inconclusive"
    assert context_verdict(0.001, 0.9, 0.0, 0.0, 0.05) == "inconclusive"  # significant, but no ω² to show


def test_claim_2s_context_test_weighs_each_context_by_its_own_base(experiment: Path) -> None:
    """Arith is evaluated on 4000 problems, pyfunc on 100: each context's mean gain is weighed by its
    own base's variance plus the residual variance over its cells, by hand (numpy). The arith contexts,
    0.10 apart, differ far beyond their precise bases; one mean base variance would drown that in
    pyfunc's noise (the rule before the calibration, docs/report.md)."""
    from scipy.stats import f

    # Per mode and seed, voting/arith, voting/pyfunc, orch_workers/arith, orch_workers/pyfunc:
    # context means 0.05, 0.10, 0.15, 0.10.
    gains = {
        ("isolated", 0): [0.055, 0.11, 0.145, 0.09], ("isolated", 1): [0.05, 0.10, 0.15, 0.11],
        ("shared", 0): [0.045, 0.09, 0.155, 0.11], ("shared", 1): [0.05, 0.10, 0.15, 0.09],
    }  # fmt: skip
    problems = {"arith": 4000, "pyfunc": 100}
    config = config_for(experiment, "[voting, orch_workers]", seed="[0, 1]")
    contexts = list(itertools.product(("voting", "orch_workers"), TASKS))
    results = []
    for (policy, seed), row in gains.items():
        for (workflow, task), gain in zip(contexts, row):
            results += evaluations(cell(workflow, policy, task, seed), [0.3, round(0.3 + gain, 4)], n=problems[task])
    two = claims_of(config, results)[2]
    # Least squares on dummy columns: the 4 contexts (a full 2×2) + isolated; 16 cells, 5 parameters.
    y = np.array([g for row in gains.values() for g in row])
    which = np.array([c for _ in gains for c in range(4)])
    is_isolated = np.array([policy == "isolated" for policy, _ in gains for _ in range(4)], dtype=float)
    x = np.column_stack([np.eye(4)[which], is_isolated])
    coef = np.linalg.lstsq(x, y, rcond=None)[0]
    mse = float(((y - x @ coef) ** 2).sum()) / 11
    base = np.array([0.3 * 0.7 / problems[task] for _, task in contexts])
    means = np.array([(y - coef[4] * is_isolated)[which == c].mean() for c in range(4)])
    v = base + mse / 4
    w = 1 / v
    centre = (w * means).sum() / w.sum()
    statistic = (w * (means - centre) ** 2).sum() / 3
    # The bases' share of each v is known, the residual's estimated on its 11 degrees of freedom.
    # The plug-in p taken through power.known_share_valid (valid whatever the residual variance).
    from matrixrl.analysis.power import known_share_valid

    p_context = known_share_valid(known_share_by_hand(statistic, 3, 11, float((base / v).mean())), 3, 11)
    assert two["why"].startswith(f"p context {p_context:.3g}, ")
    error = mse + 4 * base.mean()
    total = float(((y - y.mean()) ** 2).sum())
    # The context's sum of squares as the test weighs it: 4 cells × the harmonic mean of the v × W.
    omega = 3 * 4 * (4 / w.sum()) * (statistic - 1) / (total + error)
    # One arithmetic mean variance in its place (the rule before) showed 12.32 here, as a share of variance.
    assert 3 * error * (statistic - 1) / (total + error) > 12
    assert p_context < 0.025 and (two["verdict"], two["evidence"]) == ("supported", f"ω² context {omega:.2f}, policy 0.00")
    # The former test: one mean base variance s̄², the context's error MSE + 4·s̄², Satterthwaite's df.
    pooled = (((means - means.mean()) ** 2).sum() * 4 / 3) / error
    assert f.sf(pooled, 3, 11 * (error / mse) ** 2) > 0.05


# --- claims 6 and 7: the mechanism, against its control --------------------------------------

FLAT = {s: 1.7 for s in range(1, 51)}


def share_rows(role: str, others: tuple[str, ...], rises_at: int | None) -> list:
    """The dominant ``role``'s share: 0.55 (0.8 from ``rises_at``), the rest split among ``others``."""
    per_step = {}
    for s in range(1, 51):
        g = 0.8 if rises_at is not None and s >= rises_at else 0.55
        per_step[s] = {role: g, **{other: (1 - g) / len(others) for other in others}}
    return shares(per_step)


ROLES = {"voting": ("generator", ("aggregator",)), "orch_workers": ("worker", ("orchestrator", "synthesizer"))}


def mechanism_results(experiment: Path, cells: dict, config=None):
    """(config, results) of ``cells``: ``{(workflow, policy, seed): (curve, signal rises at: a step or None)}``;
    the signal is amplification (its role jumping 1.7 → 2.6) under isolated and the dominant share under shared."""
    config = config or config_for(experiment, "[voting, orch_workers]", task="[arith]", seed="[0, 1, 2, 3]")
    results = []
    for (workflow, policy, seed), (curve, at) in cells.items():
        role, others = ROLES[workflow]
        c = cell(workflow, policy, seed=seed)
        if policy == "isolated":
            rows = amplification(jump(at) if at is not None else FLAT, role)
        else:
            rows = share_rows(role, others, at)
        results += [training(c, rows), *evaluations(c, curve)]
    return config, results


def mechanism_study(experiment: Path, cells: dict) -> dict[int, dict]:
    return claims_of(*mechanism_results(experiment, cells))


def four(workflow: str, policy: str, curve, at) -> dict:
    return {(workflow, policy, seed): (curve, at) for seed in range(4)}


def split(workflow: str, policy: str, cliff_at, calm_at) -> dict:
    """Six seeds of one configuration: 0-2 cliff (signal at ``cliff_at``), 3-5 stay calm (signal at ``calm_at``)."""
    return {(workflow, policy, seed): (CLIFF_AT_40, cliff_at) if seed < 3 else (NO_CLIFF, calm_at) for seed in range(6)}


def six_seeds(experiment: Path, cells: dict) -> dict[int, dict]:
    config = config_for(experiment, "[voting, orch_workers]", task="[arith]", seed="[0, 1, 2, 3, 4, 5]")
    return claims_of(config, mechanism_results(experiment, cells, config)[1])


def test_the_signal_precedes_cliffs_within_configurations_or_the_other_way(experiment: Path) -> None:
    """In each configuration three seeds collapse at 40 (W = 30) and three do not. Under isolated the
    cliffs' amplification jumps at 21 (precedes) and the calm runs' never; under shared the cliffs'
    share stays flat and the calm runs' rises at 16. Each stratum's table is 3/3 against 0/3, P = 1/20;
    two strata, 1/400."""
    claims = six_seeds(experiment, {
        **split("voting", "isolated", 21, None), **split("orch_workers", "isolated", 21, None),
        **split("voting", "shared", None, 15), **split("orch_workers", "shared", None, 15),
    })  # fmt: skip
    six, seven = claims[6], claims[7]
    assert (six["verdict"], six["estimate"], six["n_cells"], six["evidence"]) == ("supported", 1.0, 12, "MH +1.00, 6/6 vs 0/6")
    assert six["why"] == "within 2 configurations: precedes 6 of 6 cliffs; rose as early in 0 of 6 without one; exact p 0.0025 (above)"
    assert (seven["verdict"], seven["estimate"]) == ("contradicted", -1.0)
    assert seven["why"] == "within 2 configurations: precedes 0 of 6 cliffs; rose as early in 6 of 6 without one; exact p 0.0025 (below)"


def test_configurations_that_differ_in_cliffs_and_signals_decide_nothing(experiment: Path) -> None:
    """Voting's runs all collapse and their signal rises first; orch_workers' never collapse and their
    signal never rises: pooled, 4 of 4 against 0 of 4 (the former rule's "supported"); within a
    configuration there is nothing to compare."""
    claims = mechanism_study(experiment, {
        **four("voting", "isolated", CLIFF_AT_40, 21), **four("orch_workers", "isolated", NO_CLIFF, None),
        **four("voting", "shared", CLIFF_AT_40, 15), **four("orch_workers", "shared", NO_CLIFF, None),
    })  # fmt: skip
    for claim in (6, 7):
        assert (claims[claim]["verdict"], claims[claim]["n_cells"]) == ("inconclusive", 8)
        assert claims[claim]["why"] == (
            "4 cliffs and 4 calm runs, never both in one configuration: nothing to compare within one (more seeds)"
        )


def test_the_skeptics_control_and_its_matched_window(experiment: Path) -> None:
    # The signal rises in every run, collapsing or not, by step 30: it tells nothing apart.
    everywhere = six_seeds(experiment, {
        **split("voting", "isolated", 21, 21), **split("orch_workers", "isolated", 21, 21),
        **split("voting", "shared", 15, 15), **split("orch_workers", "shared", 15, 15),
    })  # fmt: skip
    assert (everywhere[6]["verdict"], everywhere[6]["estimate"], everywhere[7]["verdict"]) == ("inconclusive", 0.0, "inconclusive")
    assert everywhere[6]["why"] == "within 2 configurations: precedes 6 of 6 cliffs; rose as early in 6 of 6 without one; exact p 1 (above)"
    # The calm runs' signal rises too, but only at 42, after the window in which it preceded the
    # cliffs: the mechanism table's `rose` says yes for them; the matched window does not count it.
    late = six_seeds(experiment, {
        **split("voting", "isolated", 21, 41), **split("orch_workers", "isolated", 21, 41),
        **split("voting", "shared", 15, 41), **split("orch_workers", "shared", 15, 41),
    })  # fmt: skip
    assert (late[6]["verdict"], late[7]["verdict"]) == ("supported", "supported")
    assert late[6]["why"] == "within 2 configurations: precedes 6 of 6 cliffs; rose as early in 0 of 6 without one; exact p 0.0025 (above)"
    # One configuration split, the other all calm: 3/3 against 0/3 in one stratum is P = 0.05, no verdict.
    one = six_seeds(experiment, {
        **split("voting", "isolated", 21, None),
        **{("orch_workers", "isolated", s): (NO_CLIFF, None) for s in range(6)},
        **{(w, "shared", s): (NO_CLIFF, None) for w in ("voting", "orch_workers") for s in range(6)},
    })  # fmt: skip
    assert (one[6]["verdict"], one[6]["estimate"], one[6]["n_cells"]) == ("inconclusive", 1.0, 6)
    assert one[6]["why"] == (
        "within 1 configuration: precedes 3 of 3 cliffs; rose as early in 0 of 3 without one; exact p 0.05 (above); "
        "6 cells in configurations without both left out"
    )
    # No shared cliff: nothing for the share to precede.
    assert one[7]["verdict"] == "untestable"
    assert one[7]["why"] == "no shared cliff with a testable share signal: nothing to precede"


def test_every_cell_collapsing_leaves_no_control(experiment: Path) -> None:
    claims = mechanism_study(experiment, {
        **four("voting", "isolated", CLIFF_AT_40, 21), **four("orch_workers", "isolated", CLIFF_AT_40, 21),
        **four("voting", "shared", NO_CLIFF, None), **four("orch_workers", "shared", NO_CLIFF, None),
    })  # fmt: skip
    assert claims[6]["verdict"] == "untestable"
    assert claims[6]["why"] == "every isolated cell with an amplification signal ends in a cliff: no control"


# --- a collapse is not a cliff ---------------------------------------------------------------

def test_a_collapse_is_a_failure_for_claim_5_and_never_a_cliff_for_claims_4_6_7_or_the_mechanism(experiment: Path) -> None:
    """Voting collapses after a real peak (a cliff) in every run, its signal rising first in both modes;
    orch_workers learns in three seeds and in the fourth falls from its base, its signal rising too."""
    config, results = mechanism_results(experiment, {
        **four("voting", "isolated", CLIFF_AT_40, 21), **four("voting", "shared", CLIFF_AT_40, 15),
        **{("orch_workers", mode, s): (NO_CLIFF, None) for mode in ("isolated", "shared") for s in range(3)},
        ("orch_workers", "isolated", 3): (FELL, 21), ("orch_workers", "shared", 3): (FELL, 15),
    })  # fmt: skip
    path = fill(config, results)
    frames = build_tables(path, config, ["claims", "summary", "mechanism"])
    fell = {(r["policy"], r["seed"]): r for r in json.loads(frames["summary"].to_json(orient="records")) if r["workflow"] == "orch_workers"}
    assert [(fell[(mode, 3)]["signature"], fell[(mode, 3)]["cliff"]) for mode in ("isolated", "shared")] == [("collapse", False)] * 2
    assert {fell[(mode, s)]["signature"] for mode in ("isolated", "shared") for s in range(3)} == {"gain"}
    # The mechanism table: a collapse's signal rose, but it has no cliff to precede and is no calm run.
    mechanism = {(r["workflow"], r["policy"], r["seed"]): r for r in json.loads(frames["mechanism"].to_json(orient="records"))}
    collapsed = mechanism[("orch_workers", "isolated", 3)]
    assert (collapsed["cliff"], collapsed["rose"], collapsed["rise_step"], collapsed["verdict"]) == (False, True, 22, "collapse")
    assert mechanism[("orch_workers", "shared", 3)]["verdict"] == "collapse"
    assert frames["mechanism"].attrs["caption"] == (
        "cliff cells with a signal: 8 precede, 0 coincide, 0 absent (of 8); "
        "cells without a cliff: the signal rose in 0 of 6; 2 collapses (no real peak) in neither"
    )
    claims = {r["claim"]: r for r in json.loads(frames["claims"].to_json(orient="records"))}
    # 4: voting cliffs in every seed of both modes, orch_workers in none (its collapses are named apart):
    # no configuration differs, and cliff rates are 4 of 8 cells a mode, not 5.
    assert claims[4]["why"] == "equal in every configuration; cliff rates 0.50 isolated, 0.50 shared (Δ +0.00); 2 collapses"
    # 6 and 7: 4 cliffs (voting's) and 3 calm runs (orch_workers'); the collapse, whose signal rose by
    # step 30, is on neither side. No configuration holds both, so nothing is compared within one.
    for claim in (6, 7):
        assert (claims[claim]["verdict"], claims[claim]["n_cells"]) == ("inconclusive", 7)
        assert claims[claim]["why"] == (
            "4 cliffs and 3 calm runs, never both in one configuration: nothing to compare within one (more seeds)"
        )
    # 5: the collapse is a failure, and not a cliff: in orch_workers each mode's one failure is a collapse
    # (share not cliffs 1 and 1), in voting each mode's four are cliffs (0 and 0): alike in both.
    assert (claims[5]["verdict"], claims[5]["estimate"]) == ("inconclusive", None)
    assert claims[5]["why"] == "equal in every configuration; cliff/collapse/decline/no gain/gain: shared 4/1/0/0/3, isolated 4/1/0/0/3"


def test_one_configuration_with_six_seeds_is_one_unit_for_claims_4_and_5(experiment: Path) -> None:
    """Isolated's six seeds fall off a cliff, shared's six collapse from their base: counted by cells, claim 5
    would read +1.00 [+0.35, +1.00] ("supported") where claim 4 reads 1 of 1. Both count configurations."""
    config = config_for(experiment, "[voting]", task="[arith]", seed="[0, 1, 2, 3, 4, 5]")
    results = [e for seed in range(6) for e in (*evaluations(cell("voting", "isolated", seed=seed), CLIFF(0.7)),
                                                 *evaluations(cell("voting", "shared", seed=seed), [0.3, 0.28, 0.24, 0.2]))]  # fmt: skip
    claims = claims_of(config, results)
    one = (1.0, approx(0.025), 1.0, "1/1: 1.00 [0.03, 1.00]", "inconclusive", 12, 6)
    for n in (4, 5):
        row = claims[n]
        assert (row["estimate"], row["lo"], row["hi"], row["evidence"], row["verdict"], row["n_cells"], row["n_seeds"]) == one, n
    assert claims[4]["why"] == (
        "isolated's higher in 1 of 1; cliff rates 1.00 isolated, 0.00 shared (Δ +1.00); 6 collapses; "
        "at 1 of 1, 80% power needs 6 configurations whose cliff rates differ"
    )
    assert claims[5]["why"] == (
        "cliff/collapse/decline/no gain/gain: shared 0/6/0/0/0, isolated 6/0/0/0/0; "
        "at 1 of 1, 80% power needs 6 configurations failing under both modes in different shares of cliffs"
    )
    # Claim 3's peak difference is between two trainings' own checkpoints (the shared base cancels), so
    # one configuration's seed pairs are its units: isolated's 0.7 against shared's base (0.3), six times,
    # every one the same: no spread, but never a narrower interval than the peaks' evaluation error allows
    # (each pair's two peaks of 1000 problems, binomial: 0.21/1000 each), t(5) × that SE of the mean.
    three = claims[3]
    evaluation = math.sqrt(6 * 0.42 / 1000) / 6
    half = 2.570582 * evaluation
    assert (three["verdict"], three["estimate"], three["lo"], three["hi"]) == ("supported", approx(0.4), approx(0.4 - half, rel=1e-5),
                                                                              approx(0.4 + half, rel=1e-5))  # fmt: skip
    assert three["evidence"] == "+0.400 [+0.378, +0.422]"
    assert three["why"] == (
        "isolated higher in 6 of 6 seeds of one configuration; the peaks' evaluation error (0.0084 SE of the mean) "
        "sets the interval, wider than their spread's"
    )


# --- the table in the report ---------------------------------------------------------------


def test_the_claims_table_in_every_format_and_first_on_the_page(experiment: Path, tmp_path: Path) -> None:
    config = config_for(experiment, "[voting, eval_opt, orch_workers]")
    results = []
    for (workflow, task), peak in ISOLATED_PEAKS.items():
        results += [*evaluations(cell(workflow, "isolated", task), CLIFF(peak)), *evaluations(cell(workflow, "shared", task), CREEP)]
    fill(config, results)
    sets = [a for s in ["grid.workflow=[voting, eval_opt, orch_workers]", "grid.task=[arith, pyfunc]", "grid.scale=[tiny-s]",
                        "grid.seed=[0]", *MECHANISM] for a in ("--set", s)]  # fmt: skip
    rows = json.loads(run_cli("report", "-c", experiment, *sets, "--table", "claims", "--format", "json").stdout)
    assert [r["verdict"] for r in rows] == ["supported", "inconclusive", "supported", "supported", "supported", "untestable", "untestable"]
    assert [r["finding"] for r in rows] == [FINDINGS[n][0] for n in range(1, 8)]
    printed = run_cli("report", "-c", experiment, *sets, "--table", "claims")
    assert printed.exit_code == 0, printed.output
    assert printed.stdout.splitlines()[1].split() == ["claim", "finding", "evidence", "cells", "verdict", "fragility"]
    assert "Each verdict by its rule, fixed in advance (docs/report.md, claims)" in printed.stdout
    # The footer: the family's rate with nothing there, measured for the grid shapes of docs/report.md only.
    assert (
        "Claims 2-7 tested each at its own level; how often one of them is decided with nothing there is not measured "
        "for this grid's shape (bench/claims_calibration.py)."
    ) in " ".join(printed.stdout.split())
    # Under Holm across claims 2-7 (those with a p: 3, 4, 5; claim 2 has no residual degrees of freedom) each p is
    # held to its step's level: all three are 6 of 6 (claim 3's sign-flip test, claims 4-5's sign tests: p 0.031),
    # and none passes the first step's 0.05/3.
    held = json.loads(run_cli("report", "-c", experiment, *sets, "--set", "analysis.family=holm", "--table", "claims",
                              "--format", "json").stdout)  # fmt: skip
    assert [r["verdict"] for r in held] == ["supported", "inconclusive", "inconclusive", "inconclusive", "inconclusive", "untestable", "untestable"]
    assert held[3]["why"].endswith("; supported alone, not under Holm across claims 2-7 (p 0.0313, its step's level 0.025)")
    # --family holm on the report command is the same setting; another value is one line naming the option.
    flag = json.loads(run_cli("report", "-c", experiment, *sets, "--family", "holm", "--table", "claims", "--format", "json").stdout)
    assert flag == held
    wrong = run_cli("report", "-c", experiment, *sets, "--family", "bonferroni", "--table", "claims")
    assert wrong.exit_code == 2 and wrong.stdout == ""
    assert wrong.stderr.strip().splitlines() == [
        "Error: --family bonferroni: expected none (each claim at its own level) or holm (Holm's procedure across claims 2-7)"
    ]
    # Fragile: one unit flipped undoes claims 1, 4 and 5 (6 of 6 is the fewest that decides); one removed undoes
    # claim 3 (five units: the sign-flip test's smallest p is 1/16).
    assert [r["fragility"] for r in rows] == ["1 flip", None, "1 removal", "1 flip", "1 flip", None, None]
    error = run_cli("report", "-c", experiment, *sets, "--table", "claims", "--group-by", "workflow")
    assert error.exit_code == 2 and "the claims table has no axis columns (a row is about the whole study)" in error.stderr

    page = tmp_path / "report.html"
    assert run_cli("report", "-c", experiment, *sets, "--html", page).exit_code == 0
    text = page.read_text()
    assert text.index('<section id="table-claims">') < text.index('<section id="matrix">') < text.index('<section id="table-summary">')
    nav = text[text.index("<nav>") : text.index("</nav>")]
    assert nav.index("#table-claims") < nav.index("#matrix")
    assert '<td data-value="&quot;supported&quot;" class="pos">supported</td>' in text


def test_the_registry_entry() -> None:
    table = TABLES["claims"]
    assert table.axes == () and table.first and table.page and not table.per_cell
    assert claims_table(__import__("pandas").DataFrame(columns=["cell", "workflow", "seed", "base"])).empty


def test_an_extra_axis_makes_configurations_of_its_own(experiment: Path, tmp_path: Path) -> None:
    """train.lr [1e-4, 5e-5]: voting's isolated and shared cells pair within each lr, two configurations;
    --group-by train.lr sorts the tables that have that column and leaves the claims alone."""
    from matrixrl import grid as G

    lr = "grid.train.lr=[1.0e-4, 5.0e-5]"
    config = config_for(experiment, "[voting]", task="[arith]", extra=[lr])
    peaks = {("isolated", 1e-4): 0.5, ("shared", 1e-4): 0.4, ("isolated", 5e-5): 0.52, ("shared", 5e-5): 0.4}
    results = [e for c in G.cells(config) for e in evaluations(c, [0.3, peaks[(c.policy, c.sweep_values()["train.lr"])]])]
    three = claims_of(config, results)[3]
    # Differences 0.1 and 0.12, s = 0.02/√2; the peaks' binomial evaluation error (1000 problems) is wider and
    # sets the interval: t(1) × its SE of the mean.
    evaluation = math.sqrt(0.5 * 0.5 / 1000 + 0.52 * 0.48 / 1000 + 2 * 0.4 * 0.6 / 1000) / 2
    half = 12.7062 * evaluation
    assert (three["verdict"], three["estimate"], three["hi"]) == ("inconclusive", approx(0.11), approx(0.11 + half, rel=1e-4))
    # At a mean of 0.11/s = 7.78 standard deviations, 2 units fall short (t(1) = 12.7) and 3 suffice.
    assert three["why"] == (
        f"isolated higher in 2 of 2 configurations; the peaks' evaluation error ({evaluation:.4f} SE of the mean) sets the "
        "interval, wider than their spread's; at this mean, 7.78 of their standard deviation, 80% power needs 6 configurations"
    )
    assert t_power(2, 0.11 / (0.02 / math.sqrt(2)), 0.95) < 0.8 <= t_power(3, 0.11 / (0.02 / math.sqrt(2)), 0.95)
    sets = [a for s in ["grid.workflow=[voting]", "grid.task=[arith]", "grid.scale=[tiny-s]", "grid.seed=[0]", lr, *MECHANISM] for a in ("--set", s)]
    page = tmp_path / "report.html"
    result = run_cli("report", "-c", experiment, *sets, "--group-by", "train.lr", "--html", page)
    assert result.exit_code == 0, result.output
    assert '<section id="table-claims">' in page.read_text()


def test_a_sweeps_configurations_share_one_base_and_are_one_unit_for_claims_4_and_5(experiment: Path) -> None:
    """train.lr [1e-4, 5e-5] over voting and orch_workers: four configurations, two base evaluations
    (every lr of a workflow-task-scale shares one). Isolated falls off a cliff at both rates, shared
    learns: claim 4 counts the two workflow-task-scales, not the four configurations."""
    from matrixrl import grid as G

    config = config_for(experiment, "[voting, orch_workers]", task="[arith]", extra=["grid.train.lr=[1.0e-4, 5.0e-5]"])
    results = [e for c in G.cells(config) for e in evaluations(c, CLIFF(0.7) if c.policy == "isolated" else [0.3, 0.4, 0.45, 0.5])]
    claims = claims_of(config, results)
    assert claims[4]["evidence"] == "2/2: 1.00 [0.16, 1.00]"
    assert claims[4]["why"].startswith("isolated's higher in 2 of 2; cliff rates 1.00 isolated, 0.00 shared")
    assert claims[3]["why"].startswith("isolated higher in 4 of 4 configurations")  # peaks read between trainings: four


# --- a real run ------------------------------------------------------------------------------


@pytest.mark.slow  # 8 tiny runs through Snakemake: about 2 minutes on 2 cores
def test_a_real_small_run_gets_a_verdict_or_a_reason_for_every_claim(tmp_path: Path) -> None:
    """voting and orch_workers × arith × both modes × two seeds, 4 steps each: every claim is tested
    or says why not (4 updates are too few for the mechanism's baseline, so 6 and 7 cannot be)."""
    from test_e2e import matrixrl, small_experiment

    config = small_experiment(
        tmp_path, **{"grid.workflow": ["voting", "orch_workers"], "grid.policy": ["shared", "isolated"], "grid.seed": [0, 1]}
    )
    matrixrl("run", "-c", str(config), "--cores", "2")
    rows = json.loads(matrixrl("report", "-c", str(config), "--table", "claims", "--format", "json").stdout)
    assert [r["claim"] for r in rows] == list(range(1, 8))
    for row in rows:
        assert row["verdict"] in VERDICTS and row["why"], row
        if row["verdict"] == "untestable":
            assert row["evidence"] is None and row["estimate"] is None
        else:
            assert row["evidence"] and row["n_cells"] > 0
    by_claim = {r["claim"]: r for r in rows}
    assert by_claim[1]["n_cells"] == 8 and by_claim[1]["n_seeds"] == 2  # every cell is multi-agent
    assert by_claim[2]["verdict"] != "untestable"  # two workflows, two modes: the ANOVA runs
    assert by_claim[3]["n_cells"] == 8 and by_claim[3]["verdict"] != "untestable"  # 4 pairs in 2 configurations
    for claim in (6, 7):
        assert by_claim[claim]["verdict"] == "untestable" and "cliff with a testable" in by_claim[claim]["why"]
    printed = matrixrl("report", "-c", str(config), "--table", "claims").stdout
    assert "claims: the findings tested" in printed and "verdict" in printed
