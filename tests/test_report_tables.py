"""The report tables recomputed from constructed stores with known answers.

Each store is filled through the store's own API (``Store.add_results``, the code
path ``ingest`` uses), with curves and gradient diagnostics built by hand so that
every figure below can be worked out on paper.
"""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import pandas as pd
import pytest

from matrixrl.analysis.mechanism import VERDICTS, Signal, assess
from matrixrl.analysis.seeds import t_interval
from matrixrl.config import Analysis, load_config
from matrixrl.grid import Cell
from matrixrl.layout import STORE_FILE, eval_result, train_result
from matrixrl.report import FORMATS, TABLE_NAMES
from matrixrl.report.formats import render
from matrixrl.report.tables import TABLES, build_tables
from matrixrl.results import DiagnosticRow, EvalResult, RoleMetric, StepMetrics, TrainResult, write_result
from matrixrl.store import Store, ingest

from conftest import run_cli

approx = pytest.approx
# Student-t 97.5% quantiles from a printed table (1, 2 and 3 degrees of freedom).
T1, T2, T3 = 12.7062, 4.3027, 3.1824
MECHANISM = [
    "analysis.mechanism_baseline_steps=5",
    "analysis.mechanism_rise=0.25",
    "analysis.mechanism_smooth_steps=3",
    "analysis.cliff_delta=0.1",
    "analysis.cliff_noise_se=2.0",
    "analysis.final_tail_k=3",
    "analysis.confidence=0.95",
]


def config_for(experiment: Path, *, workflow="[single, voting]", policy="[shared, isolated]", seed="[0]", extra=()):
    sets = [f"grid.workflow={workflow}", "grid.task=[arith]", "grid.scale=[tiny-s]", f"grid.policy={policy}", f"grid.seed={seed}", *MECHANISM, *extra]
    return load_config(experiment, sets=sets)


def cell(workflow: str, policy: str, seed: int = 0) -> Cell:
    return Cell(workflow=workflow, task="arith", scale="tiny-s", policy=policy, seed=seed)


def evaluations(c: Cell, curve: list[float], *, every: int = 10, n: int = 1000, roles=None) -> list[EvalResult]:
    """One EvalResult per checkpoint 0, every, 2·every, ...; ``roles``: {role: (metric, [values])}."""
    out = []
    for i, accuracy in enumerate(curve):
        metrics = [RoleMetric(role=r, metric=m, value=v[i]) for r, (m, v) in (roles or {}).items()]
        out.append(EvalResult(cell=c.id, step=i * every, accuracy=accuracy, n=n, n_correct=round(accuracy * n), seconds=0.1, roles=metrics))
    return out


def training(c: Cell, diagnostics: list[DiagnosticRow], steps: int = 50) -> TrainResult:
    metrics = [
        StepMetrics(step=s, reward_mean=0.5, reward_std=0.1, loss=0.2, entropy=1.0, response_length=2.0,
                    grad_norm=0.3, clip_fraction=0.0, group_size=8, seconds=0.1)  # fmt: skip
        for s in range(1, steps + 1)
    ]
    return TrainResult(cell=c.id, axes=c.axes(), steps=steps, metrics=metrics, diagnostics=diagnostics)


def diag(step: int, kind: str, role: str, value: float) -> DiagnosticRow:
    return DiagnosticRow(step=step, kind=kind, role=role, agent=None, other=None, value=value)


def amplification(values: dict[int, float], role: str = "generator") -> list[DiagnosticRow]:
    return [diag(s, "amplification", role, v) for s, v in values.items()]


def shares(per_step: dict[int, dict[str, float]]) -> list[DiagnosticRow]:
    return [diag(s, "role_share", role, v) for s, roles in per_step.items() for role, v in roles.items()]


def store_of(config) -> Path:
    results = Path(config.results_dir)
    results.mkdir(parents=True, exist_ok=True)
    return results / STORE_FILE


def fill(config, results: list) -> Path:
    path = store_of(config)
    with Store(path) as store:
        store.add_results(results)
    return path


def records(frame: pd.DataFrame) -> list[dict]:
    return json.loads(render(frame, "json"))


# --- summary -------------------------------------------------------------------------------

COLLAPSE = [0.3, 0.5, 0.7, 0.5, 0.2, 0.1]  # peak 0.7 @ 20, threshold 0.6, below from 30 on: cliff, onset 30


def test_summary_has_final_tail_and_per_role_accuracies_at_base_peak_and_final(experiment: Path) -> None:
    config = config_for(experiment, policy="[shared]")
    gen = [0.25, 0.45, 0.65, 0.45, 0.15, 0.05]
    agg = [0.3, 0.4, 0.9, 0.3, 0.2, 0.0]
    voting = evaluations(cell("voting", "shared"), COLLAPSE, roles={"aggregator": ("answer_acc", agg), "generator": ("answer_acc", gen)})
    # The aggregator's accuracy is missing at the peak checkpoint (step 20).
    voting[2] = voting[2].model_copy(update={"roles": [r for r in voting[2].roles if r.role != "aggregator"]})
    path = fill(config, [*evaluations(cell("single", "shared"), [0.2, 0.3, 0.4, 0.5, 0.5, 0.5]), *voting])
    table = build_tables(path, config, ["summary"])["summary"]
    assert list(table.columns) == [
        "cell", "workflow", "task", "scale", "policy", "seed", "base", "peak", "peak_step", "final", "final_tail",
        "gain", "gain_z", "peak_gain_z", "cliff", "cliff_onset", "signature", "n_checkpoints",
        "aggregator_answer_acc_base", "aggregator_answer_acc_peak", "aggregator_answer_acc_final",
        "generator_answer_acc_base", "generator_answer_acc_peak", "generator_answer_acc_final",
    ]  # fmt: skip
    single, voting = records(table)
    assert single["cell"] == "single-arith-tiny-s-shared-s0"
    assert (single["base"], single["peak"], single["peak_step"], single["final"]) == (0.2, 0.5, 30, 0.5)
    assert single["final_tail"] == approx(0.5) and single["gain"] == approx(0.3)
    # No stored SEs: binomial ones at n = 1000, sqrt(0.5·0.5/1000 + 0.2·0.8/1000).
    assert single["gain_z"] == approx(0.3 / math.sqrt((0.25 + 0.16) / 1000)) == single["peak_gain_z"]
    assert single["cliff"] is False and single["cliff_onset"] is None and single["n_checkpoints"] == 6
    assert (single["signature"], voting["signature"]) == ("gain", "cliff")
    assert single["generator_answer_acc_base"] is None  # no per-role rows stored for it
    assert (voting["peak"], voting["peak_step"], voting["final"]) == (0.7, 20, 0.1)
    assert voting["final_tail"] == approx((0.5 + 0.2 + 0.1) / 3) and voting["gain"] == approx(-0.2)
    assert voting["cliff"] is True and voting["cliff_onset"] == 30
    assert (voting["generator_answer_acc_base"], voting["generator_answer_acc_peak"], voting["generator_answer_acc_final"]) == (0.25, 0.65, 0.05)
    assert (voting["aggregator_answer_acc_base"], voting["aggregator_answer_acc_peak"], voting["aggregator_answer_acc_final"]) == (0.3, None, 0.0)


def test_a_cell_without_its_base_evaluation_is_left_out_until_it_has_one(experiment: Path) -> None:
    config = config_for(experiment, workflow="[single]", policy="[shared]", seed="[0, 1]")
    late = [e for e in evaluations(cell("single", "shared", 1), [0.2, 0.3]) if e.step != 0]
    path = fill(config, [*evaluations(cell("single", "shared", 0), [0.2, 0.3]), *late])
    assert build_tables(path, config, ["summary"])["summary"]["seed"].tolist() == [0]


def test_an_evaluation_with_no_noise_has_the_se_of_one_problem_and_a_finite_z(experiment: Path) -> None:
    # Greedy decoding of 8 problems, all wrong at the base and all right (seed 0) or all
    # wrong again (seed 1) at the end: each evaluation's SE is 0, which made gain_z
    # infinite, and caching the record (JSON without infinities) crashed the report.
    config = config_for(experiment, workflow="[single]", policy="[shared]", seed="[0, 1]")
    stored = []
    for seed, final in ((0, 1.0), (1, 0.0)):
        for e in evaluations(cell("single", "shared", seed), [0.0, final], n=8):
            stored.append(e.model_copy(update={"se": 0.0}))
    fill(config, stored)
    rose, flat = records(build_tables(store_of(config), config, ["summary"])["summary"])
    # Each SE is taken as 1/n, an evaluation with one of its 8 problems scored otherwise.
    assert rose["gain_z"] == approx(1.0 / math.hypot(1 / 8, 1 / 8)) == rose["peak_gain_z"]
    assert rose["signature"] == "gain" and (flat["gain_z"], flat["signature"]) == (0.0, "no gain")
    grid = ["grid.workflow=[single]", "grid.task=[arith]", "grid.scale=[tiny-s]", "grid.policy=[shared]", "grid.seed=[0, 1]"]
    result = run_cli("report", "-c", experiment, *[a for s in grid for a in ("--set", s)], "--columns", "gain_z", "--format", "csv")
    assert result.exit_code == 0, result.output
    assert [float(line.split(",")[-1]) for line in result.stdout.splitlines()[1:]] == [approx(rose["gain_z"]), 0.0]


def test_a_report_names_the_cells_without_complete_results_when_no_run_is_going(experiment: Path) -> None:
    # After a failed run the summary showed 1 of 2 cells, and nothing said the other was missing.
    config = config_for(experiment, workflow="[single]", policy="[shared]", seed="[0, 1]")
    fill(config, evaluations(cell("single", "shared", 0), [0.2, 0.3]))
    grid = ["grid.workflow=[single]", "grid.task=[arith]", "grid.scale=[tiny-s]", "grid.policy=[shared]", "grid.seed=[0, 1]"]
    result = run_cli("report", "-c", experiment, *[a for s in grid for a in ("--set", s)], "--format", "csv")
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 2  # the header and seed 0
    assert result.stderr == (
        "note: 2 of 2 cells are not finished and no run is going (one failed or was stopped, or none reached them; "
        "`matrixrl run` finishes them); the tables show only what is done: single-arith-tiny-s-shared-s0 (0/5 checkpoints), "
        "single-arith-tiny-s-shared-s1 (0/5 checkpoints)\n"
    )


# --- seeds ---------------------------------------------------------------------------------


def test_t_interval_matches_the_printed_quantiles() -> None:
    mean, lo, hi = t_interval([0.5, 0.6, 0.7])
    half = T2 * 0.1 / math.sqrt(3)  # s = 0.1
    assert mean == approx(0.6) and lo == approx(0.6 - half, rel=1e-4) and hi == approx(0.6 + half, rel=1e-4)
    mean, lo, hi = t_interval([0.2, 0.4])
    half = T1 * math.sqrt(0.02) / math.sqrt(2)  # s = sqrt(((0.1)² + (0.1)²) / 1)
    assert (mean, lo, hi) == (approx(0.3), approx(0.3 - half, rel=1e-4), approx(0.3 + half, rel=1e-4))
    one = t_interval([0.4])
    assert one[0] == 0.4 and math.isnan(one[1]) and math.isnan(one[2])
    assert all(math.isnan(v) for v in t_interval([]))
    assert t_interval([0.3, 0.3, 0.3]) == (approx(0.3), approx(0.3), approx(0.3))


def test_seeds_table_means_intervals_and_cliff_rate(experiment: Path) -> None:
    config = config_for(experiment, workflow="[voting]", seed="[0, 1, 2]")
    # shared: three seeds, one cliff; isolated: one seed (no interval).
    path = fill(config, [
        *evaluations(cell("voting", "shared", 0), [0.3, 0.5, 0.5]),
        *evaluations(cell("voting", "shared", 1), [0.3, 0.6, 0.6]),
        *evaluations(cell("voting", "shared", 2), [0.3, 0.7, 0.1]),
        *evaluations(cell("voting", "isolated", 0), [0.3, 0.4, 0.45]),
    ])  # fmt: skip
    table = build_tables(path, config, ["seeds"])["seeds"]
    assert list(table.columns) == [
        "workflow", "task", "scale", "policy",
        "base_mean", "base_lo", "base_hi", "peak_mean", "peak_lo", "peak_hi",
        "final_mean", "final_lo", "final_hi", "gain_mean", "gain_lo", "gain_hi", "cliff_rate", "collapse_rate", "n_seeds",
    ]  # fmt: skip
    shared, isolated = records(table)
    assert (shared["policy"], shared["n_seeds"], isolated["policy"], isolated["n_seeds"]) == ("shared", 3, "isolated", 1)
    # Peaks 0.5, 0.6, 0.7: mean 0.6, s 0.1.
    half = T2 * 0.1 / math.sqrt(3)
    assert shared["peak_mean"] == approx(0.6)
    assert (shared["peak_lo"], shared["peak_hi"]) == (approx(0.6 - half, rel=1e-4), approx(0.6 + half, rel=1e-4))
    # Finals 0.5, 0.6, 0.1: mean 0.4, s = sqrt((0.01 + 0.04 + 0.09) / 2).
    s = math.sqrt(0.07)
    assert shared["final_mean"] == approx(0.4)
    assert shared["final_hi"] - shared["final_mean"] == approx(T2 * s / math.sqrt(3), rel=1e-4)
    # Gains are finals - 0.3; identical bases give a zero-width interval.
    assert shared["gain_mean"] == approx(0.1) and shared["gain_lo"] == approx(0.1 - T2 * s / math.sqrt(3), rel=1e-4)
    assert (shared["base_mean"], shared["base_lo"], shared["base_hi"]) == (approx(0.3), approx(0.3), approx(0.3))
    assert shared["cliff_rate"] == approx(1 / 3)  # only seed 2 (0.7 → 0.1) collapses
    assert isolated["peak_mean"] == 0.45 and isolated["cliff_rate"] == 0.0
    assert shared["collapse_rate"] == isolated["collapse_rate"] == 0.0
    assert all(isolated[f"{f}_{b}"] is None for f in ("base", "peak", "final", "gain") for b in ("lo", "hi"))


# --- compare -------------------------------------------------------------------------------


def compare_store(experiment: Path, **kwargs):
    config = config_for(experiment, seed="[0, 1, 2]", **kwargs)
    curves = {
        # (workflow, policy, seed): curve over checkpoints 0, 10, 20
        ("single", "shared", 0): [0.3, 0.4, 0.4],
        ("single", "shared", 1): [0.3, 0.5, 0.5],
        # single has one role: its isolated cells are these shared runs (grid.run_of).
        ("voting", "shared", 0): [0.3, 0.6, 0.6],
        ("voting", "shared", 1): [0.3, 0.8, 0.2],  # cliff
        ("voting", "shared", 2): [0.3, 0.9, 0.9],  # no isolated seed 2: unpaired
        ("voting", "isolated", 0): [0.3, 0.7, 0.1],  # cliff
        ("voting", "isolated", 1): [0.3, 0.6, 0.55],
    }
    results = [e for (w, p, s), curve in curves.items() for e in evaluations(cell(w, p, s), curve)]
    return config, fill(config, results)


def test_compare_pairs_seeds_and_compares_with_the_single_control(experiment: Path) -> None:
    config, path = compare_store(experiment)
    table = build_tables(path, config, ["compare"])["compare"]
    assert list(table.columns) == [
        "workflow", "task", "scale", "policy", "comparison", "n_pairs",
        "peak_diff", "peak_lo", "peak_hi", "final_diff", "final_lo", "final_hi",
        "gain_diff", "gain_lo", "gain_hi", "cliff_rate_diff", "cliff_rate_lo", "cliff_rate_hi",
        "collapse_rate_diff", "collapse_rate_lo", "collapse_rate_hi",
    ]  # fmt: skip
    rows = records(table)
    # No single isolated - shared row: both sides are the same runs, so it would be zero by construction.
    assert [(r["workflow"], r["policy"], r["comparison"], r["n_pairs"]) for r in rows] == [
        ("voting", None, "isolated - shared", 2),
        ("voting", "shared", "voting - single", 2),
        ("voting", "isolated", "voting - single", 2),
    ]
    voting_modes, voting_shared, voting_isolated = rows
    # voting isolated - shared, seeds 0 and 1: peak 0.7-0.6, 0.6-0.8 → +0.1, -0.2.
    assert voting_modes["peak_diff"] == approx(-0.05)
    assert voting_modes["peak_hi"] == approx(-0.05 + T1 * 0.15 / 1, rel=1e-4)  # s = 0.15·√2, /√2
    # finals 0.1-0.6, 0.55-0.2 → -0.5, +0.35; gains are the same differences (equal bases).
    assert voting_modes["final_diff"] == approx(-0.075) and voting_modes["gain_diff"] == approx(-0.075)
    assert voting_modes["final_lo"] == approx(-0.075 - T1 * 0.425, rel=1e-4)
    # cliffs: isolated (yes, no) - shared (no, yes) → +1, -1.
    assert voting_modes["cliff_rate_diff"] == approx(0.0)
    assert voting_modes["cliff_rate_hi"] == approx(T1 * 1.0, rel=1e-4)
    # voting - single under shared, seeds 0 and 1: peaks 0.6-0.4, 0.8-0.5 → 0.2, 0.3.
    assert voting_shared["peak_diff"] == approx(0.25)
    assert (voting_shared["peak_lo"], voting_shared["peak_hi"]) == (approx(0.25 - T1 * 0.05, rel=1e-4), approx(0.25 + T1 * 0.05, rel=1e-4))
    assert voting_shared["cliff_rate_diff"] == approx(0.5)
    # voting isolated - single (its isolated cells are the shared runs): finals 0.1-0.4, 0.55-0.5; cliffs yes-no, no-no.
    assert voting_isolated["final_diff"] == approx(-0.125) and voting_isolated["cliff_rate_diff"] == 0.5


def test_collapses_in_the_summary_seeds_and_compare_tables(experiment: Path) -> None:
    """A collapse (a fall from the base with no real peak) is named in the summary, and counted apart
    from cliffs across seeds and in the comparisons."""
    config = config_for(experiment, workflow="[voting]", seed="[0, 1]")
    curves = {
        ("shared", 0): [0.3, 0.25, 0.15],  # 15 points under its base, its peak the base: a collapse
        ("shared", 1): [0.3, 0.5, 0.5],
        ("isolated", 0): [0.3, 0.4, 0.45],
        ("isolated", 1): [0.3, 0.32, 0.1],  # its peak 0.02 over the base (0.98 SEs): no real peak, a collapse
    }
    path = fill(config, [e for (p, s), curve in curves.items() for e in evaluations(cell("voting", p, s), curve)])
    frames = build_tables(path, config, ["summary", "seeds", "compare"])
    summary = {(r["policy"], r["seed"]): (r["signature"], r["cliff"]) for r in records(frames["summary"])}
    assert summary == {("shared", 0): ("collapse", False), ("shared", 1): ("gain", False),
                       ("isolated", 0): ("gain", False), ("isolated", 1): ("collapse", False)}  # fmt: skip
    seeds = {r["policy"]: (r["cliff_rate"], r["collapse_rate"]) for r in records(frames["seeds"])}
    assert seeds == {"shared": (0.0, 0.5), "isolated": (0.0, 0.5)}
    (modes,) = records(frames["compare"])
    # Collapses isolated (no, yes) - shared (yes, no): -1, +1; mean 0, s = √2, half-width t(1)·√2/√2.
    assert (modes["comparison"], modes["cliff_rate_diff"], modes["collapse_rate_diff"]) == ("isolated - shared", 0.0, 0.0)
    assert (modes["collapse_rate_lo"], modes["collapse_rate_hi"]) == (approx(-T1, rel=1e-4), approx(T1, rel=1e-4))


def test_a_one_role_workflow_is_reported_under_both_modes_from_one_run(experiment: Path) -> None:
    config, path = compare_store(experiment)
    summary = build_tables(path, config, ["summary"], only={"workflow": ["single"]})["summary"]
    rows = {(r["policy"], r["seed"]): r for r in records(summary)}
    assert set(rows) == {("shared", 0), ("shared", 1), ("isolated", 0), ("isolated", 1)}
    for seed in (0, 1):
        shared, isolated = rows[("shared", seed)], rows[("isolated", seed)]
        assert isolated["cell"] == f"single-arith-tiny-s-isolated-s{seed}"
        assert {k: v for k, v in isolated.items() if k not in ("cell", "policy")} == {
            k: v for k, v in shared.items() if k not in ("cell", "policy")
        }
    assert summary.attrs["caption"] == (
        "single: one role, so isolated is the same computation as shared; "
        "its isolated rows repeat the shared runs (computed once)"
    )
    voting = build_tables(path, config, ["summary"], only={"workflow": ["voting"]})["summary"]
    assert "caption" not in voting.attrs


def test_only_keeps_rows_but_compare_still_finds_its_controls(experiment: Path) -> None:
    config, path = compare_store(experiment)
    only = {"workflow": ["voting"], "policy": ["shared"]}
    tables = build_tables(path, config, ["compare", "summary"], only=only)
    assert [(r["workflow"], r["policy"], r["comparison"]) for r in records(tables["compare"])] == [
        ("voting", None, "isolated - shared"),
        ("voting", "shared", "voting - single"),
    ]
    assert [(r["workflow"], r["policy"], r["seed"]) for r in records(tables["summary"])] == [("voting", "shared", s) for s in (0, 1, 2)]
    seed_zero = build_tables(path, config, ["compare"], only={"seed": [0]})["compare"]
    assert set(seed_zero["n_pairs"]) == {1}


def test_group_by_sorts_the_group_axes_first_and_keeps_the_grid_order(experiment: Path) -> None:
    config, path = compare_store(experiment)
    summary = build_tables(path, config, ["summary"], group_by="policy,seed")["summary"]
    keys = [(r["policy"], r["seed"], r["workflow"]) for r in records(summary)]
    assert keys == [
        ("shared", 0, "single"), ("shared", 0, "voting"), ("shared", 1, "single"), ("shared", 1, "voting"),
        ("shared", 2, "voting"), ("isolated", 0, "single"), ("isolated", 0, "voting"), ("isolated", 1, "single"),
        ("isolated", 1, "voting"),
    ]  # fmt: skip
    default = build_tables(path, config, ["summary"])["summary"]
    assert [(r["workflow"], r["policy"], r["seed"]) for r in records(default)][:3] == [
        ("single", "shared", 0), ("single", "shared", 1), ("single", "isolated", 0)
    ]


# --- diagnostics ---------------------------------------------------------------------------


def test_diagnostics_per_role_amplification_shares_and_norm_ratios(experiment: Path) -> None:
    config = config_for(experiment, workflow="[voting]", policy="[isolated]")
    c = cell("voting", "isolated")
    rows = [
        # step 1: generator norm 3, aggregator 1; step 2: 5 and 1; step 3: no gradient at all (skipped).
        *shares({1: {"generator": 0.75, "aggregator": 0.25}, 2: {"generator": 5 / 6, "aggregator": 1 / 6}, 3: {"generator": 0.0, "aggregator": 0.0}}),
        diag(1, "role_norm", "generator", 3.0), diag(1, "role_norm", "aggregator", 1.0),
        diag(2, "role_norm", "generator", 5.0), diag(2, "role_norm", "aggregator", 1.0),
        diag(3, "role_norm", "generator", 0.0), diag(3, "role_norm", "aggregator", 0.0),
        *amplification({1: 1.5, 2: 2.5}),
    ]  # fmt: skip
    trained = training(c, rows)
    gaps = [(1, "generator", 0.01, 0.2), (1, "aggregator", 0.03, 0.5), (2, "generator", 0.02, 0.3)]
    trained.roles = [
        RoleMetric(step=step, role=role, metric=metric, value=value)
        for step, role, mean, largest in gaps
        for metric, value in (("logp_gap_mean", mean), ("logp_gap_max", largest))
    ]
    path = fill(config, [trained, *evaluations(c, [0.3, 0.4])])
    (row,) = records(build_tables(path, config, ["diagnostics"])["diagnostics"])
    assert list(row) == [
        "cell", "workflow", "task", "scale", "policy", "seed", "dominant_role", "dominant_share",
        "amplification_mean", "amplification_max", "amplified_role", "logp_gap_mean", "logp_gap_max",
        "generator_amp_mean", "generator_amp_max", "aggregator_norm_ratio", "generator_norm_ratio",
    ]  # fmt: skip
    # The rollout-update log-probability gap: the mean of the per-step means, the largest token's.
    assert row["logp_gap_mean"] == approx(0.02) and row["logp_gap_max"] == 0.5
    assert row["dominant_role"] == "generator" and row["dominant_share"] == approx((0.75 + 5 / 6) / 2)
    assert (row["amplified_role"], row["amplification_mean"], row["amplification_max"]) == ("generator", 2.0, 2.5)
    assert (row["generator_amp_mean"], row["generator_amp_max"]) == (2.0, 2.5)
    assert row["aggregator_norm_ratio"] == 1.0 and row["generator_norm_ratio"] == approx(4.0)  # mean 4 vs mean 1


# --- mechanism -----------------------------------------------------------------------------

CLIFF_AT_40 = [0.3, 0.6, 0.7, 0.72, 0.3, 0.2]  # peak 0.72 @ 30; onset 40; the interval before it starts at 30
CLIFF_AT_30 = [0.3, 0.6, 0.72, 0.3, 0.2, 0.1]  # peak @ 20; onset 30
NO_CLIFF = [0.3, 0.4, 0.5, 0.55, 0.6, 0.6]
# Falls from its base from the first checkpoint on, its peak the base (step 0): a collapse, not a cliff
# (the rule before collapses had a name of their own flagged it a cliff with onset 30).
FELL = [0.3, 0.28, 0.25, 0.2, 0.15, 0.1]
LOW, HIGH = 1.7, 2.6  # amplification before and after the jump; 2.6 > 1.7 · 1.25 = 2.125


def jump(at: int, steps: int = 50, low: float = LOW, high: float = HIGH) -> dict[int, float]:
    return {s: (high if s >= at else low) for s in range(1, steps + 1)}


def mechanism_store(experiment: Path):
    config = config_for(experiment, workflow="[single, voting, eval_opt]", seed="[0, 1]")
    generator_share = {s: (0.8 if s >= 15 else 0.55) for s in range(1, 51)}
    eval_opt_shares = {s: {"generator": g, "evaluator": 1 - g} for s, g in generator_share.items()}
    eval_opt_shares[3] = {"generator": 0.0, "evaluator": 0.0}  # no gradient: skipped, not a share of 0
    cells = {
        # Amplification jumps at 21: smoothed (3 updates) above 2.125 from 22; onset 40, interval from 30.
        cell("voting", "isolated", 0): (CLIFF_AT_40, amplification(jump(21))),
        # Jumps at 34: rises at 35, inside the interval (30, 40] of the cliff.
        cell("voting", "isolated", 1): (CLIFF_AT_40, amplification(jump(34))),
        # Flat shares: never rise.
        cell("voting", "shared", 0): (CLIFF_AT_40, shares({s: {"generator": 0.6, "aggregator": 0.4} for s in range(1, 51)})),
        # No cliff, and the dominant share still rises (0.6 → 0.9 from 30).
        cell("voting", "shared", 1): (NO_CLIFF, shares({s: {"generator": 0.9 if s >= 30 else 0.6, "aggregator": 0.1 if s >= 30 else 0.4} for s in range(1, 51)})),
        # One role, one agent: no signal (its isolated cell is this run, reported under both modes).
        cell("single", "shared", 0): (CLIFF_AT_40, shares({s: {"generator": 1.0} for s in range(1, 51)})),
        # Generator share 0.55 → 0.8 at 15: smoothed above 0.6875 from 16; onset 30, interval from 20.
        cell("eval_opt", "shared", 0): (CLIFF_AT_30, shares(eval_opt_shares)),
        # No role with several agents: no amplification.
        cell("eval_opt", "isolated", 0): (CLIFF_AT_30, shares(eval_opt_shares)),
        # Falls from its base, the share rising at 16 as in seed 0: a collapse, no cliff to precede.
        cell("eval_opt", "shared", 1): (FELL, shares(eval_opt_shares)),
    }
    results = [r for c, (curve, rows) in cells.items() for r in (training(c, rows), *evaluations(c, curve))]
    return config, fill(config, results)


def test_mechanism_verdicts_on_constructed_curves(experiment: Path) -> None:
    config, path = mechanism_store(experiment)
    table = build_tables(path, config, ["mechanism"])["mechanism"]
    assert list(table.columns) == [
        "cell", "workflow", "task", "scale", "policy", "seed", "cliff", "cliff_onset",
        "signal", "signal_role", "baseline", "change", "rose", "rise_step", "lead", "verdict",
        "kl_mean", "damper_scale_mean",
    ]  # fmt: skip
    rows = {(r["workflow"], r["policy"], r["seed"]): r for r in records(table)}
    assert len(rows) == 9

    precedes = rows[("voting", "isolated", 0)]
    assert (precedes["cliff"], precedes["cliff_onset"], precedes["signal"], precedes["signal_role"]) == (True, 40, "amplification", "generator")
    assert precedes["baseline"] == approx(LOW) and precedes["change"] == approx(HIGH / LOW - 1)
    assert (precedes["rose"], precedes["rise_step"], precedes["lead"], precedes["verdict"]) == (True, 22, 18, "precedes")

    coincides = rows[("voting", "isolated", 1)]
    assert (coincides["rise_step"], coincides["lead"], coincides["verdict"]) == (35, 5, "coincides")

    absent = rows[("voting", "shared", 0)]
    assert (absent["signal"], absent["signal_role"], absent["baseline"]) == ("share", "generator", approx(0.6))
    assert (absent["change"], absent["rose"], absent["rise_step"], absent["lead"], absent["verdict"]) == (approx(0.0), False, None, None, "absent")

    calm = rows[("voting", "shared", 1)]
    assert (calm["cliff"], calm["rose"], calm["rise_step"], calm["lead"], calm["verdict"]) == (False, True, 31, None, "no cliff")
    assert calm["change"] == approx(0.9 / 0.6 - 1)

    shared_share = rows[("eval_opt", "shared", 0)]
    assert shared_share["signal_role"] == "generator"
    assert shared_share["baseline"] == approx(0.55)  # the zero-gradient update 3 is not part of it
    assert (shared_share["rise_step"], shared_share["lead"], shared_share["verdict"]) == (16, 14, "precedes")

    for key in (("single", "shared", 0), ("single", "isolated", 0), ("eval_opt", "isolated", 0)):
        assert (rows[key]["signal"], rows[key]["verdict"], rows[key]["rose"]) == (None, "n/a", None), key

    # Its signal rose, over the whole run as a calm run's; but it fell from its base: neither side.
    collapse = rows[("eval_opt", "shared", 1)]
    assert (collapse["cliff"], collapse["cliff_onset"], collapse["rose"], collapse["rise_step"], collapse["lead"], collapse["verdict"]) == (
        False, None, True, 16, None, "collapse"
    )  # fmt: skip

    assert table.attrs["caption"] == (
        "cliff cells with a signal: 2 precede, 1 coincide, 1 absent (of 4); "
        "cells without a cliff: the signal rose in 1 of 1; 1 collapse (no real peak) in neither"
    )


def test_assess_edge_cases() -> None:
    rule = Analysis(mechanism_baseline_steps=5, mechanism_rise=0.25, mechanism_smooth_steps=1)
    flat = Signal("amplification", "generator", pd.Series([2.0] * 10, index=range(1, 11)))
    # The onset falls inside the baseline window: nothing to test.
    assert assess(flat, 4, [0, 4, 8], rule)["verdict"] == "n/a"
    # Too few updates for a baseline.
    short = Signal("amplification", "generator", pd.Series([2.0] * 5, index=range(1, 6)))
    assert assess(short, None, [0, 5], rule)["baseline"] is None
    # A rise exactly at the onset step coincides (lead 0); one exactly at the interval start precedes.
    rising = Signal("amplification", "generator", pd.Series([2.0] * 7 + [3.0] * 3, index=range(1, 11)))
    assert (assess(rising, 8, [0, 4, 8], rule)["verdict"], assess(rising, 8, [0, 4, 8], rule)["lead"]) == ("coincides", 0)
    assert assess(rising, 10, [0, 8, 10], rule)["verdict"] == "precedes"
    # A rise after the onset does not count.
    assert assess(rising, 7, [0, 7], rule)["verdict"] == "absent"
    # A collapse (no cliff, the run fell from its base) is told apart from a calm run.
    assert assess(rising, None, [0, 10], rule, collapse=True) == {**assess(rising, None, [0, 10], rule), "verdict": "collapse"}
    assert assess(rising, None, [0, 10], rule)["verdict"] == "no cliff"


# --- formats -------------------------------------------------------------------------------

FRAME = pd.DataFrame(
    {
        "workflow": ["voting", "single"],
        "seed": pd.Series([0, 1], dtype="int64"),
        "peak": [0.71875, math.nan],
        "cliff": [True, False],
        "cliff_onset": pd.array([40, None], dtype="Int64"),
        "verdict": ["precedes", None],
        "peak_gain": [0.1 + 0.2, -0.5],
    }
)


def test_csv_is_exact_and_full_precision() -> None:
    assert render(FRAME, "csv") == (
        "workflow,seed,peak,cliff,cliff_onset,verdict,peak_gain\n"
        "voting,0,0.71875,True,40,precedes,0.30000000000000004\n"
        "single,1,,False,,,-0.5\n"
    )


def test_markdown_is_exact() -> None:
    assert render(FRAME, "markdown") == (
        "| workflow   | seed   |   peak | cliff   |   cliff_onset | verdict   |   peak_gain |\n"
        "|:-----------|:-------|-------:|:--------|--------------:|:----------|------------:|\n"
        "| voting     | 0      |  0.719 | yes     |            40 | precedes  |       0.300 |\n"
        "| single     | 1      |      — | no      |             — | —         |      -0.500 |\n"
    )


def test_latex_is_exact_and_escaped() -> None:
    assert render(FRAME, "latex") == (
        "\\begin{tabular}{llrlrlr}\n"
        "\\toprule\n"
        "workflow & seed & peak & cliff & cliff\\_onset & verdict & peak\\_gain \\\\\n"
        "\\midrule\n"
        "voting & 0 & 0.719 & yes & 40 & precedes & 0.300 \\\\\n"
        "single & 1 & -- & no & -- & -- & -0.500 \\\\\n"
        "\\bottomrule\n"
        "\\end{tabular}\n"
    )


def test_latex_writes_the_tables_symbols_as_latex() -> None:
    # The claims table's tests say ω², × and η; pdfLaTeX stops at Unicode it has no definition for.
    frame = pd.DataFrame({"test": ["ω² of workflow × task", "η² ± 0.1", "$5 ± 1"]})
    assert render(frame, "latex").splitlines()[4:7] == [
        "$\\omega^{2}$ of workflow $\\times$ task \\\\",
        "$\\eta^{2}$ $\\pm$ 0.1 \\\\",
        "\\$5 $\\pm$ 1 \\\\",
    ]


def test_json_is_exact() -> None:
    assert render(FRAME, "json") == (
        "[\n"
        ' {\n  "workflow": "voting",\n  "seed": 0,\n  "peak": 0.71875,\n  "cliff": true,\n'
        '  "cliff_onset": 40,\n  "verdict": "precedes",\n  "peak_gain": 0.30000000000000004\n },\n'
        ' {\n  "workflow": "single",\n  "seed": 1,\n  "peak": null,\n  "cliff": false,\n'
        '  "cliff_onset": null,\n  "verdict": null,\n  "peak_gain": -0.5\n }\n'
        "]\n"
    )


def test_rich_table_puts_a_rule_between_groups() -> None:
    from rich.console import Console

    console = Console(width=120, record=True)
    console.print(render(FRAME, "table", title="t", group_by=["workflow"], caption="a caption"))
    text = console.export_text()
    rules = [i for i, line in enumerate(text.splitlines()) if set(line.strip()) == {"─"}]
    assert len(rules) == 2 and rules[1] == rules[0] + 2  # under the header, then between the two groups
    assert "a caption" in text and "0.719" in text and "—" in text


# --- incremental ---------------------------------------------------------------------------


def test_only_cells_with_new_results_are_recomputed(experiment: Path) -> None:
    config, path = compare_store(experiment)
    first = build_tables(path, config)
    with Store(path) as store:
        counts = store.computations()
    assert len(counts) == 7 and set(counts.values()) == {1}  # 7 runs (single's isolated cells are its shared runs)

    # Nothing new: no computation, and the store file is not written at all.
    before = path.read_bytes()
    again = build_tables(path, config)
    assert path.read_bytes() == before
    for name in TABLE_NAMES:
        pd.testing.assert_frame_equal(again[name], first[name])

    # One new checkpoint of one cell: exactly that cell is recomputed, and it shows.
    changed = cell("voting", "shared", 2)
    with Store(path) as store:
        store.add_results(evaluations(changed, [0.3, 0.9, 0.9, 0.1]))
    summary = build_tables(path, config)["summary"]
    with Store(path) as store:
        after = store.computations()
    assert after == {**counts, changed.id: 2}
    row = summary[summary["cell"] == changed.id].iloc[0]
    # The new last reading shows; one low reading after 0.9 at step 20 is no terminal cliff (a fall holds the last two).
    assert (row["final"], row["cliff"], row["n_checkpoints"]) == (0.1, False, 4)

    # The interval level only enters the aggregates: no record is recomputed, the intervals narrow.
    wide = build_tables(path, config, ["seeds"])["seeds"]
    level = config.model_copy(update={"analysis": config.analysis.model_copy(update={"confidence": 0.5})})
    narrow = build_tables(path, level, ["seeds"])["seeds"]
    with Store(path) as store:
        assert store.computations() == after
    assert (narrow["peak_hi"] < wide["peak_hi"]).any() and not (narrow["peak_hi"] > wide["peak_hi"]).any()

    # Another threshold changes what every record means: all are recomputed.
    stricter = config.model_copy(update={"analysis": config.analysis.model_copy(update={"cliff_delta": 0.5})})
    build_tables(path, stricter, ["summary"])
    with Store(path) as store:
        assert store.computations() == {cell_id: n + 1 for cell_id, n in after.items()}


def one_ingested_cell(experiment: Path):
    """A one-cell grid whose three result files (train, two evaluations) are in the store."""
    config = config_for(experiment, workflow="[single]", policy="[shared]")
    results = Path(config.results_dir)
    c = cell("single", "shared")
    write_result(results / train_result(c.id), training(c, [], steps=10))
    for e in evaluations(c, [0.2, 0.3]):
        write_result(results / eval_result(c.id, e.step), e)
    assert ingest(results) == 3
    return config, results, c


def test_a_store_from_before_digests_is_read_again_once(experiment: Path) -> None:
    config, results, _ = one_ingested_cell(experiment)
    with sqlite3.connect(results / STORE_FILE) as db:
        db.execute("delete from cell_inputs")
    assert ingest(results) == 3  # every file once more, to record its digest
    assert ingest(results) == 0
    assert build_tables(results / STORE_FILE, config, ["summary"])["summary"]["final"].tolist() == [0.3]


def test_a_store_of_another_schema_version_is_rebuilt_from_the_result_files(experiment: Path) -> None:
    from matrixrl.store import SCHEMA_VERSION

    config, results, c = one_ingested_cell(experiment)
    with sqlite3.connect(results / STORE_FILE) as db:
        # What an older matrixrl left: another layout, and rows no result file backs.
        db.execute("alter table evaluations drop column se")
        db.execute("insert into cells (cell, workflow, task, scale, policy, seed) values ('ghost', 'single', 'arith', 'tiny-s', 'shared', 9)")
        db.execute(f"pragma user_version = {SCHEMA_VERSION - 1}")
    assert ingest(results) == 3  # moved aside, and a new store filled from every file
    assert len(list(results.glob(f"{STORE_FILE}.schema-{SCHEMA_VERSION - 1}-*"))) == 1
    with sqlite3.connect(results / STORE_FILE) as db:
        assert db.execute("pragma user_version").fetchone()[0] == SCHEMA_VERSION
        assert db.execute("select cell from cells").fetchall() == [(c.id,)]
        assert db.execute("select step, se from evaluations order by step").fetchall() == [(0, None), (10, None)]
    assert ingest(results) == 0
    assert build_tables(results / STORE_FILE, config, ["summary"])["summary"]["final"].tolist() == [0.3]


# --- the CLI -------------------------------------------------------------------------------


def test_every_table_in_every_format_through_the_cli(experiment: Path) -> None:
    config, _ = mechanism_store(experiment)
    sets = [arg for s in ["grid.workflow=[single, voting, eval_opt]", "grid.task=[arith]", "grid.scale=[tiny-s]", "grid.seed=[0, 1]", *MECHANISM] for arg in ("--set", s)]
    for name in TABLE_NAMES:
        for fmt in FORMATS:
            result = run_cli("report", "-c", experiment, *sets, "--table", name, "--format", fmt)
            if name == "memory":  # no memory in this study: one line says so (tests/test_memory_report.py has one)
                assert result.exit_code != 0 and "no memory evaluations stored" in result.stderr, (fmt, result.output)
                continue
            if name == "cost":  # results written by hand record no cost (tests/test_cost.py has real ones)
                assert result.exit_code != 0 and "no job costs stored" in result.stderr, (fmt, result.output)
                continue
            assert result.exit_code == 0, (name, fmt, result.output)
            assert result.stdout.strip(), (name, fmt)
    rows = json.loads(run_cli("report", "-c", experiment, *sets, "--table", "mechanism", "--format", "json").stdout)
    assert "cell" not in rows[0] and {r["verdict"] for r in rows} == set(VERDICTS)
    # LaTeX shows the table's default columns (a mean with its interval in one), --wide every column.
    latex = run_cli("report", "-c", experiment, *sets, "--table", "seeds", "--format", "latex").stdout
    assert latex.startswith("\\begin{tabular}{llllrrrrrr}\n")
    assert "n\\_seeds & base\\_mean & peak\\_mean & final$\\pm$ci & gain$\\pm$ci & cliff\\_rate" in latex
    latex = run_cli("report", "-c", experiment, *sets, "--table", "seeds", "--format", "latex", "--wide").stdout
    assert latex.startswith("\\begin{tabular}{llllrrrrrrrrrrrrrrr}\n") and "base\\_lo" in latex
    grouped = run_cli("report", "-c", experiment, *sets, "--table", "summary", "--group-by", "policy", "--only", "seed=0", "--format", "csv")
    lines = grouped.stdout.splitlines()
    assert [line.split(",")[3] for line in lines[1:]] == ["shared"] * 3 + ["isolated"] * 3
    assert all(line.split(",")[4] == "0" for line in lines[1:])


def _error(result) -> str:
    assert result.exit_code == 2, result.output
    assert result.stdout == "" and "Traceback" not in result.output
    return result.stderr.strip()


def test_a_group_by_the_table_aggregates_over_names_the_axis_in_the_plural() -> None:
    from matrixrl.errors import ConfigError
    from matrixrl.report.tables import check_group_by

    for axis, plural in (("policy", "policies"), ("seed", "seeds"), ("workflow", "workflows")):
        with pytest.raises(ConfigError) as info:
            check_group_by("cost", axis)
        assert str(info.value) == (
            f"--group-by {axis}: the cost table has no {axis} column (it aggregates over {plural}); use one of: scale"
        )


def test_cli_user_errors_for_group_by_and_empty_comparisons(experiment: Path) -> None:
    config, _ = mechanism_store(experiment)
    sets = ["--set", "grid.workflow=[single, voting, eval_opt]", "--set", "grid.task=[arith]", "--set", "grid.seed=[0, 1]", "--set", "grid.scale=[tiny-s]"]
    assert _error(run_cli("report", "-c", experiment, *sets, "--group-by", "colour")) == (
        "Error: --group-by 'colour': unknown axis 'colour'; use one of: workflow, task, scale, policy, seed"
    )
    assert _error(run_cli("report", "-c", experiment, *sets, "--group-by", "polcy")) == (
        "Error: --group-by 'polcy': unknown axis 'polcy'; did you mean policy?"
    )
    assert _error(run_cli("report", "-c", experiment, *sets, "--table", "seeds", "--group-by", "policy,seed")) == (
        "Error: --group-by seed: the seeds table has no seed column (it aggregates over seeds); "
        "use one of: workflow, task, scale, policy"
    )
    assert _error(run_cli("report", "-c", experiment, *sets, "--group-by", "seed,seed")) == (
        "Error: --group-by 'seed,seed': seed given more than once; list each axis once"
    )
    results = Path(config.results_dir)
    # single has results, but its isolated cells are its shared runs: no pair to compare.
    single = ["--only", "workflow=single"]
    assert _error(run_cli("report", "-c", experiment, *sets, "--table", "compare", *single)) == (
        f"Error: {results}: nothing to compare for the cells of this grid; compare needs cells of both policy modes, "
        "or of single and another workflow, with the same task, scale and seed"
    )


def test_registry_and_cli_offer_the_same_tables_and_formats() -> None:
    """The CLI's choices come from the light lists in matrixrl.report: those must be what the
    registry builds and what render writes."""
    from matrixrl.cli import OutputFormat, TableName
    from matrixrl.report.formats import render

    assert tuple(TABLES) == TABLE_NAMES == tuple(t.value for t in TableName)
    assert FORMATS == tuple(f.value for f in OutputFormat)
    frame = pd.DataFrame({"workflow": ["single"], "peak": [0.25]})
    for format in FORMATS:
        assert render(frame, format)  # every offered format renders


def test_a_new_evaluation_reuses_its_cells_training_part(experiment: Path, monkeypatch) -> None:
    """After a new evaluation only the cell's evaluations are read again: what its record takes
    from its training (diagnostics summary, mechanism signal) comes from the store, and every
    table is what a report computed from nothing gives."""
    import matrixrl.report.records as records_module

    config, path = mechanism_store(experiment)
    build_tables(path, config)
    changed = cell("voting", "isolated", 0)  # its amplification rises at 22
    with Store(path) as store:
        store.add_results(evaluations(changed, NO_CLIFF))  # every checkpoint evaluated again: no cliff now
    computed = []
    real = records_module.training_part
    monkeypatch.setattr(records_module, "training_part", lambda *args: computed.append(args[0]) or real(*args))
    incremental = build_tables(path, config)
    assert computed == []
    row = incremental["mechanism"].set_index("cell").loc[changed.id]
    assert (row["cliff"], row["verdict"], row["rose"], row["rise_step"]) == (False, "no cliff", True, 22)

    with sqlite3.connect(path) as db:  # nothing cached: every record from the stored rows
        db.execute("delete from cell_summaries")
        db.execute("delete from cell_trainings")
    fresh = build_tables(path, config)
    assert len(computed) == 8  # every run
    for name in TABLE_NAMES:
        pd.testing.assert_frame_equal(incremental[name], fresh[name])
        assert incremental[name].attrs == fresh[name].attrs
