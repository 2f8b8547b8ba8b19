"""What a grid can decide before it runs: `matrixrl plan`'s design lines and ``Study.design()``.

The closed forms (matrixrl.analysis.power) are checked against scipy.stats' distributions
and the claims' own intervals.
Then every line plan prints for the default grid, examples/long-study.yaml and
examples/paper.yaml is asserted as text (docs/report.md quotes them).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.special import bdtrc, fdtri, ncfdtr, nctdtr, stdtrit
from scipy.stats import chi2, ncx2

import matrixrl
from conftest import REPO, run_cli
from matrixrl.analysis import power
from matrixrl.analysis.claims import clopper_pearson
from matrixrl.analysis.design import HEADER

approx = pytest.approx


# --- the closed forms against scipy and the claims' intervals ---------------------------------


def test_the_sign_test_threshold_is_the_clopper_pearson_intervals() -> None:
    for units in range(1, 61):
        decisive = [k for k in range(units + 1) if clopper_pearson(k, units)[0] > 0.5]
        assert power.sign_threshold(units, 0.95) == (decisive[0] if decisive else None), units
    assert power.fewest_unanimous(0.95) == 6 and power.fewest_unanimous(0.99) == 8  # 0.5^6 < 0.025 < 0.5^5
    for n, k, p in [(12, 10, 0.87), (54, 20, 0.3), (1000, 530, 0.55), (7, 0, 0.2)]:
        assert power.binomial_tail(n, k, p) == approx(float(bdtrc(k - 1, n, p)) if k else 1.0, rel=1e-9)
    # 80% power over 12 units: the share at which P(Bin(12, share) ≥ 10) is 0.8.
    share = power.sign_share_needed(12, 0.95)
    assert float(bdtrc(9, 12, share)) == approx(0.8, abs=1e-6)
    assert power.sign_share_needed(5, 0.95) is None


def test_the_t_and_f_powers_are_scipys_noncentral_distributions() -> None:
    for units in (2, 3, 6, 12, 41):
        dof = units - 1
        for effect in (0.3, 0.9, 2.0):
            expected = 1 - nctdtr(dof, effect * math.sqrt(units), stdtrit(dof, 0.975))
            assert power.t_power(units, effect, 0.95) == approx(float(expected), abs=1e-9)
    # With no known share, claim 2's statistic is an F: its tail and critical value are the F's.
    for dfn, dfd in ((11, 99), (17, 153), (3, 9)):
        critical = power.known_share_critical(dfn, dfd, 0.0, 0.025)
        assert critical == approx(float(fdtri(dfn, dfd, 0.975)), rel=1e-6)
        for noncentrality in (0.0, 5.0, 20.0):
            assert power.known_share_sf(critical, dfn, dfd, 0.0, noncentrality) == approx(
                1 - float(ncfdtr(dfn, dfd, noncentrality, critical)), abs=1e-7)  # fmt: skip
    # Claim 2: noncentrality 2·n̄·C·ω²/((1 + n̄)(1 − ω²)), a denominator whose bases' share k = n̄/(n̄ + 1) is
    # known, χ'²_{C−1}(λ) against f·(C − 1)·(k + (1 − k)·χ²_df/df), and that statistic's own critical value
    # at Holm's α/2 (integrated here with scipy.stats' densities, solved with its root finder).
    from scipy.optimize import brentq

    def tail(f: float, contexts: int, n: float, dof: int, noncentrality: float) -> float:
        return quad(lambda x: chi2.pdf(x, dof) * ncx2.sf(f * (contexts - 1) * (n + x / dof) / (n + 1), contexts - 1,
                                                           noncentrality), 0, np.inf)[0]  # fmt: skip

    for contexts, n, dof, omega2 in ((12, 2, 11, 0.5), (12, 2, 11, 0.71), (18, 6, 89, 0.46), (6, 4, 17, 0.3)):
        level = power.known_share_level(contexts - 1, dof, 0.025)  # the plug-in level whose valid p is α/2
        assert level < 0.025
        critical = brentq(lambda f: tail(f, contexts, n, dof, 1e-12) - level, 0.01, 50)
        noncentrality = 2 * n * contexts * omega2 / ((1 + n) * (1 - omega2))
        assert power.context_power(contexts, n, dof, omega2, 0.95) == approx(tail(critical, contexts, n, dof, noncentrality), abs=1e-5)
        # The F's critical value, as the test had it, is higher: the known share made it run under its level.
        assert critical < fdtri(contexts - 1, dof, 0.975)


def test_rate_needed_is_the_sign_tests_power_over_configurations() -> None:
    """Claim 4 with one seed and shared never cliffing: a configuration counts when isolated cliffs,
    and the test is decisive once 6 count; 80% power where P(Bin(12, q) ≥ 6) = 0.8."""
    q = power.rate_needed(12, lambda rate: rate, 0.95)
    assert float(bdtrc(5, 12, q)) == approx(0.8, abs=1e-6)
    assert power.rate_needed(5, lambda rate: rate, 0.95) is None


# --- plan's lines -------------------------------------------------------------------------------

DEFAULT = [
    "claim 1: 12 workflow-task-scales, one unit each (seeds and modes share its base): supported if 10 or more "
    "of 12 gain, contradicted if 2 or fewer; 80% power if each gains with probability 0.87 or more",
    "claim 2: 24 cells in 12 contexts, 11 residual degrees of freedom: 80% power if the context explains ω² 0.62 "
    "or more of the gains' variance (evaluation noise alone; Holm); its policy test (within contexts), 80% power "
    "at a mean gain difference between the modes of 3.2 points at 512 trials (evaluation noise alone, accuracy "
    "0.5; Holm)",
    "claim 3: 12 configurations with both modes × 1 seed (Student-t and sign-flip over 12 configurations): 80% power at a mean "
    "peak difference of 0.89 of their standard deviation or more (2.8 points at 512 trials with evaluation noise "
    "alone, accuracy 0.5; more where trainings differ)",
    "claim 4: needs at least 6 configurations whose cliff rates differ; this grid has 12 configurations with "
    "both modes, 1 seed each: it can be supported only if isolated cliffs more often in 6 or more (all that "
    "differ; with one the other way, 8 of 9); 80% power if isolated's runs cliff 58% of the time or more and "
    "shared's never, 73% if shared's cliff 10%",
    "claim 5: needs at least 6 configurations failing under both modes, in different shares of cliffs; this grid "
    "has 12 configurations with both modes, 1 seed each: 80% power if each mode's runs fail 76% of the time or "
    "more, isolated's by cliffs and shared's otherwise; if 75% of isolated's failures are cliffs and 25% of shared's, "
    "50% power even if every run fails",
    "claim 6: 8 isolated cells with an amplification signal (voting, orch_workers), 8 configurations × 1 seed, "
    "compared within each: with one seed no configuration holds a cliff and a calm run: no verdict possible "
    "(more seeds)",
    "claim 7: 12 shared cells with a share signal, 12 configurations × 1 seed, compared within each: with one "
    "seed no configuration holds a cliff and a calm run: no verdict possible (more seeds)",
]
LONG_STUDY = [
    "claim 1: 6 workflow-task-scales, one unit each (seeds and modes share its base): supported only if all 6 "
    "gain, contradicted only if none does; 80% power if each gains with probability 0.96 or more",
    "claim 2: 24 cells in 6 contexts, 17 residual degrees of freedom: 80% power if the context explains ω² 0.53 "
    "or more of the gains' variance (evaluation noise alone; Holm); its policy test (within contexts), 80% power "
    "at a mean gain difference between the modes of 2.1 points at 1024 trials (evaluation noise alone, accuracy "
    "0.5; Holm)",
    "claim 3: 6 configurations with both modes × 2 seeds (Student-t and sign-flip over 6 configurations): 80% power at a mean "
    "peak difference of 1.81 of their standard deviation or more (2.8 points at 1024 trials with evaluation "
    "noise alone, accuracy 0.5; more where trainings differ)",
    "claim 4: needs at least 6 configurations whose cliff rates differ; this grid has 6 configurations with both "
    "modes, 2 seeds each: it can be supported only if isolated cliffs more often in 6 or more (all that differ; "
    "with one the other way, 8 of 9); 80% power if isolated's runs cliff 81% of the time or more and shared's "
    "never, 93% if shared's cliff 10%",
    "claim 5: needs at least 6 configurations failing under both modes, in different shares of cliffs; this grid "
    "has 6 configurations with both modes, 2 seeds each: 80% power if each mode's runs fail 86% of the time or "
    "more, isolated's by cliffs and shared's otherwise; if 75% of isolated's failures are cliffs and 25% of shared's, "
    "16% power even if every run fails",
    "claim 6: 8 isolated cells with an amplification signal (voting, orch_workers), 4 configurations × 2 seeds, "
    "compared within each (exact stratified test): no verdict possible in 1000 simulated studies even if the "
    "signal precedes every cliff and no calm run's rises (more configurations)",
    "claim 7: 12 shared cells with a share signal, 6 configurations × 2 seeds, compared within each (exact "
    "stratified test): 0% power if the signal precedes 90% of cliffs, half the runs cliffing and calm runs' "
    "signals rising as early in 20% (1% if it precedes every cliff and no calm run's rises; 1000 simulated "
    "studies)",
]
PAPER = [
    "claim 1: 18 workflow-task-scales, one unit each (seeds and modes share its base): supported if 14 or more "
    "of 18 gain, contradicted if 4 or fewer; 80% power if each gains with probability 0.82 or more",
    "claim 2: 36 cells in 18 contexts, 17 residual degrees of freedom: 80% power if the context explains ω² 0.53 "
    "or more of the gains' variance (evaluation noise alone; Holm); its tasks' evaluations differ (128 and 1000 "
    "trials), which this takes alike: approximate (docs/report.md); its policy test (within contexts), 80% "
    "power at a mean gain difference between the modes of 4.9 points at 128 trials and 1.8 points at 1000 trials "
    "(evaluation noise alone, accuracy 0.5; Holm)",
    "claim 3: 18 configurations with both modes × 1 seed (Student-t and sign-flip over 18 configurations): 80% power at a mean "
    "peak difference of 0.70 of their standard deviation or more (4.4 points at 128 trials and 1.6 points at "
    "1000 trials with evaluation noise alone, accuracy 0.5; more where trainings differ)",
    "claim 4: needs at least 6 configurations whose cliff rates differ; this grid has 18 configurations with "
    "both modes, 1 seed each: it can be supported only if isolated cliffs more often in 6 or more (all that "
    "differ; with one the other way, 8 of 9); 80% power if isolated's runs cliff 40% of the time or more and "
    "shared's never, 58% if shared's cliff 10%",
    "claim 5: needs at least 6 configurations failing under both modes, in different shares of cliffs; this grid "
    "has 18 configurations with both modes, 1 seed each: 80% power if each mode's runs fail 64% of the time or "
    "more, isolated's by cliffs and shared's otherwise; if 75% of isolated's failures are cliffs and 25% of shared's, "
    "77% power even if every run fails",
    "claim 6: 12 isolated cells with an amplification signal (voting, orch_workers), 12 configurations × 1 seed, "
    "compared within each: with one seed no configuration holds a cliff and a calm run: no verdict possible "
    "(more seeds)",
    "claim 7: 18 shared cells with a share signal, 18 configurations × 1 seed, compared within each: with one "
    "seed no configuration holds a cliff and a calm run: no verdict possible (more seeds)",
]


@pytest.mark.parametrize(
    "path, lines",
    [("experiments.yaml", DEFAULT), ("examples/long-study.yaml", LONG_STUDY), ("examples/paper.yaml", PAPER)],
    ids=["default", "long-study", "paper"],
)
def test_plan_says_what_each_grid_can_decide(path: str, lines: list[str], tmp_path) -> None:
    study = matrixrl.Study.load(REPO / path, set={"results_dir": str(tmp_path / "results")})
    design = study.design()
    assert [claim.line for claim in design] == lines
    assert [claim.claim for claim in design] == list(range(1, 8))
    # Possible unless the line says no verdict is: claims 6-7 compare runs within configurations, which one seed cannot.
    assert [claim.possible for claim in design] == ["no verdict possible" not in line for line in lines]
    assert study.plan().design == design
    # plan prints them after the grid's tables, before the disk and what to run next.
    shown = run_cli("plan", "-c", REPO / path, "--set", f"results_dir={tmp_path / 'results'}")
    assert shown.exit_code == 0, shown.output
    printed = shown.stdout.splitlines()
    at = printed.index(HEADER)
    assert printed[at + 1 : at + 8] == lines
    assert printed[at + 8] == FAMILY_NONE  # which power holds under Holm (test_plan_says_which_power_holds_under_holm)
    assert printed[at + 9].startswith("disk at peak: ")


def test_a_grid_too_small_for_a_claim_says_no_verdict_is_possible(experiment) -> None:
    """One configuration with six seeds (the calibration's second shape): claims 1, 4, 5 count one unit,
    claim 2 has no context to vary; claim 3 its six pairs; claims 6 and 7 one stratum of six seeds, which
    never decides (its most extreme table, 3 of 3 against 0 of 3, has P = 1/20)."""
    one = {"grid.workflow": ["voting"], "grid.task": ["arith"], "grid.scale": ["tiny-s"], "grid.seed": [0, 1, 2, 3, 4, 5]}
    design = matrixrl.Study.load(experiment, set=one).design()
    assert [(claim.units, claim.possible) for claim in design] == [
        (1, False), (12, False), (6, True), (1, False), (1, False), (6, False), (6, False)
    ]  # fmt: skip
    assert design[0].line == (
        "claim 1: 1 workflow-task-scale, one unit each (seeds and modes share its base); a sign test needs at least 6: "
        "no verdict possible"
    )
    assert design[1].line == "claim 2: one workflow, task and scale: untestable"
    assert design[2].line == (
        "claim 3: 1 configuration with both modes × 6 seeds (Student-t and sign-flip over 6 seed pairs of one configuration): "
        "80% power at a mean peak difference of 1.81 of their standard deviation or more (5.7 points at 512 trials with "
        "evaluation noise alone, accuracy 0.5; more where trainings differ)"
    )
    assert design[3].line == (
        "claim 4: needs at least 6 configurations whose cliff rates differ; this grid has 1 configuration with both "
        "modes, 6 seeds each: no verdict possible"
    )
    # One stratum of six: 3 of 3 cliffs preceded against 0 of 3 calm runs is P = 1/20, never below 2.5%.
    assert design[5].line == (
        "claim 6: 6 isolated cells with an amplification signal (voting), 1 configuration × 6 seeds, compared within each "
        "(exact stratified test): no verdict possible in 1000 simulated studies even if the signal precedes every cliff "
        "and no calm run's rises (more configurations)"
    )
    # One policy mode: claims 2-7 have nothing to compare.
    shared = matrixrl.Study.load(experiment, set={"grid.policy": ["shared"]}).design()
    assert [claim.line for claim in shared[1:5]] == [
        "claim 2: one policy mode: untestable", *(f"claim {n}: no configuration with both modes: untestable" for n in (3, 4, 5))
    ] and shared[5].line == "claim 6: no isolated cell with an amplification signal: untestable"


def test_plans_json_stays_the_list_of_jobs(experiment) -> None:
    """`plan --format json` is a bare list of jobs, which scripts read (`jq '.[]'`); the design lines are
    in the table output and in Study.design(), not in it."""
    result = run_cli("plan", "-c", experiment, "--format", "json")
    jobs = json.loads(result.stdout)
    assert isinstance(jobs, list) and jobs and all("rule" in job and "status" in job for job in jobs)


def test_docs_quote_these_lines() -> None:
    """docs/report.md ("What a grid can decide") quotes plan's lines for the three grids as printed."""
    text = (REPO / "docs" / "report.md").read_text()
    for line in [HEADER, *DEFAULT, *LONG_STUDY[:5], *PAPER]:
        assert f"\n{line}\n" in text, line


def test_claim_2s_context_p_holds_its_level_whatever_the_residual_variance() -> None:
    """The context test's statistic over a denominator whose share k is known, the share computed from the
    estimated residual (12 contexts, 11 residual df, true k 0.2, 3,000 seeded draws): the plug-in p-value
    (known_share_sf at the computed share) falls under 2.5% in about 3.6% of draws; known_share_p, never
    below it, in at most 2.5% (3 Monte-Carlo SEs allowed)."""
    rng = np.random.default_rng(4)
    dfn, dfd, k, draws = 11, 11.0, 0.2, 3000
    u2 = rng.chisquare(dfd, draws) / dfd
    statistic = rng.chisquare(dfn, draws) / dfn / (k + (1 - k) * u2)
    computed = k / (k + (1 - k) * u2)
    plug_in = np.array([power.known_share_sf(t, dfn, dfd, c) for t, c in zip(statistic, computed)])
    valid = np.array([power.known_share_p(t, dfn, dfd, c) for t, c in zip(statistic, computed)])
    se = math.sqrt(0.025 * 0.975 / draws)
    assert (valid >= plug_in).all()
    assert (plug_in < 0.025).mean() > 0.025 + 2 * se
    assert (valid < 0.025).mean() <= 0.025 + 3 * se


def test_the_quadrature_nodes_are_numpys() -> None:
    """power's Gauss–Legendre nodes (Newton on the recurrence, no eigenproblem) are numpy's leggauss's."""
    for points in (5, 64, 400):
        nodes, weights = power._gauss_legendre(points)
        expected_nodes, expected_weights = np.polynomial.legendre.leggauss(points)
        assert np.abs(nodes - expected_nodes).max() < 1e-14
        assert np.abs(weights / expected_weights - 1).max() < 1e-8


def test_plan_keeps_the_design_lines_and_reads_them_back(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lines are kept under $XDG_CACHE_HOME/matrixrl/design by a digest of the grid's counts and the
    analysis code: a replan reads the same lines back (without scipy); another grid gets its own; a
    damaged file is recomputed."""
    from matrixrl.analysis.design import grid_design
    from matrixrl.config import load_config

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    config = load_config(REPO / "experiments.yaml")
    first = grid_design(config)
    (kept,) = (tmp_path / "cache" / "matrixrl" / "design").glob("*.json")
    assert [line["line"] for line in json.loads(kept.read_text())] == [claim.line for claim in first]
    assert grid_design(config) == first
    two_seeds = load_config(REPO / "experiments.yaml", sets=["grid.seed=[0, 1]"])
    assert grid_design(two_seeds) != first
    assert len(list(kept.parent.glob("*.json"))) == 2
    kept.write_text("{not json")
    assert grid_design(config) == first


FAMILY_NONE = ("Each power is its claim's at its own level (analysis.family: none); under Holm across claims 2-7 "
               "(--family holm) it is the most a claim has: the first decided needs p under 0.83% (5%/6).")  # fmt: skip
FAMILY_HOLM = ("Under Holm across claims 2-7 (analysis.family: holm) each of these powers is the most a claim has: "
               "the first claim decided needs p under 0.83% (5%/6), the last under 5%.")  # fmt: skip


def test_plan_says_which_power_holds_under_holm(tmp_path) -> None:
    """Under the claims' lines, plan says at which level they hold: each claim's own, and under Holm
    across claims 2-7 the most a claim has (docs/report.md quotes the default grid's)."""
    from conftest import run_cli

    for sets, line in (([], FAMILY_NONE), (["--set", "analysis.family=holm"], FAMILY_HOLM)):
        result = run_cli("plan", "-c", str(REPO / "experiments.yaml"), "--set", f"results_dir={tmp_path / 'r'}", *sets)
        assert result.exit_code == 0, result.output
        lines = result.stdout.splitlines()
        at = next(i for i, text in enumerate(lines) if text.startswith("claim 7: "))
        assert lines[at + 1] == line
    assert f"\n{FAMILY_NONE}\n" in (REPO / "docs" / "report.md").read_text()
