"""Plots: learning curves and a cell's gradient diagnostics, from a store built by ingesting result files.

The figures are checked through the matplotlib objects the plotting functions
return (titles, labels, the plotted numbers), the files as decodable PNGs.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path

import matplotlib.image
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_hex

from matrixrl.config import POLICIES, load_config
from matrixrl.grid import Cell, cells
from matrixrl.layout import eval_result, train_result
from matrixrl.report import plots
from matrixrl.results import DiagnosticRow, EvalResult, StepMetrics, TrainResult, write_result

from conftest import run_cli

# The grid of the study below: 2 workflows x 1 task x 1 scale x 2 policies x 2 seeds.
ONLY = ("--only", "workflow=single,voting", "--only", "scale=tiny-s", "--only", "task=arith")
STEPS = (0, 10, 20, 30, 40)
N_EVAL = 256
# Accuracy curves per (workflow, policy, seed). voting/shared/seed 0 peaks at 0.5 (step 10) and
# collapses from step 30 on: a terminal cliff (drop 0.3 >> 2 binomial SEs at n=256). The others stay flat-ish.
CURVES = {
    ("single", "shared", 0): (0.30, 0.32, 0.34, 0.33, 0.35),
    ("single", "shared", 1): (0.30, 0.28, 0.30, 0.31, 0.29),
    ("single", "isolated", 0): (0.30, 0.32, 0.34, 0.33, 0.35),
    ("single", "isolated", 1): (0.30, 0.28, 0.30, 0.31, 0.29),
    ("voting", "shared", 0): (0.30, 0.50, 0.45, 0.20, 0.20),
    ("voting", "shared", 1): (0.30, 0.34, 0.36, 0.35, 0.37),
    ("voting", "isolated", 0): (0.30, 0.31, 0.32, 0.33, 0.34),
    ("voting", "isolated", 1): (0.30, 0.29, 0.31, 0.30, 0.32),
}
CLIFF_CELL = "voting-arith-tiny-s-shared-s0"
ROLES = {"single": {"generator": 1}, "voting": {"generator": 3, "aggregator": 1}}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def diagnostic_rows(workflow: str, steps: int) -> list[DiagnosticRow]:
    """Per-update rows of the kinds the plots read; step 3 had no gradient at all (every share 0)."""
    rows = []
    for step in range(1, steps + 1):
        no_gradient = step == 3
        norms = {role: 0.0 if no_gradient else 0.1 * step * (2 if role == "generator" else 1) for role in ROLES[workflow]}
        total = sum(norms.values())
        for role, n_agents in ROLES[workflow].items():
            for i in range(n_agents):
                rows.append(DiagnosticRow(step=step, kind="agent_norm", role=role, agent=f"{role}{i}", other=None, value=norms[role] / 2))
            rows.append(DiagnosticRow(step=step, kind="role_norm", role=role, agent=None, other=None, value=norms[role]))
            share = norms[role] / total if total else 0.0
            rows.append(DiagnosticRow(step=step, kind="role_share", role=role, agent=None, other=None, value=share))
            if n_agents > 1 and not no_gradient:
                rows.append(DiagnosticRow(step=step, kind="amplification", role=role, agent=None, other=None, value=2.0))
    return rows


def write_study(results: Path, cell_list: list[Cell], with_diagnostics: bool = True) -> None:
    """Result files for every cell (train.json with diagnostics, one eval file per step)."""
    for cell in cell_list:
        metrics = [
            StepMetrics(step=s, reward_mean=0.5, reward_std=0.1, loss=0.2, entropy=1.0, response_length=2.0,
                        grad_norm=0.3, clip_fraction=0.0, group_size=8, seconds=0.1)
            for s in range(1, STEPS[-1] + 1)
        ]
        diagnostics = diagnostic_rows(cell.workflow, STEPS[-1]) if with_diagnostics else []
        write_result(results / train_result(cell.id),
                     TrainResult(cell=cell.id, axes=cell.axes(), steps=STEPS[-1], metrics=metrics, diagnostics=diagnostics))
        for step, accuracy in zip(STEPS, CURVES[(cell.workflow, cell.policy, cell.seed)]):
            n_correct = round(accuracy * N_EVAL)
            write_result(results / eval_result(cell.id, step),
                         EvalResult(cell=cell.id, step=step, accuracy=n_correct / N_EVAL, n=N_EVAL, n_correct=n_correct, seconds=0.1))


@pytest.fixture
def study(experiment: Path):
    """(config, experiments file) of a small grid whose results are on disk, not yet ingested."""
    # Two seeds, so the plots have bands and the seeds table intervals (the default file has one).
    text = experiment.read_text()
    assert "  seed: [0]\n" in text
    experiment.write_text(text.replace("  seed: [0]\n", "  seed: [0, 1]\n"))
    config = load_config(experiment, only=list(ONLY[1::2]))
    assert {c.seed for c in cells(config)} == {0, 1} and set(config.grid.task) == {"arith"}
    write_study(Path(config.results_dir), cells(config))
    return config, experiment


def accuracy(workflow: str, policy: str, seed: int, step: int) -> float:
    return round(CURVES[(workflow, policy, seed)][STEPS.index(step)] * N_EVAL) / N_EVAL


# --- learning curves ---------------------------------------------------------------------


def test_learning_curves_one_labelled_panel_per_workflow_and_scale(study) -> None:
    config, _ = study
    figures = plots.study_figures(plots.load_study(config))
    assert list(figures) == ["curves-arith"]
    fig = figures["curves-arith"]
    assert fig._suptitle.get_text() == "arith: accuracy vs training step\nline: mean of 2 seed(s), band: min–max"
    axes = fig.get_axes()
    assert [ax.get_title() for ax in axes] == ["single · tiny-s", "voting · tiny-s"]
    assert [ax.get_xlabel() for ax in axes] == ["", "training step"]  # bottom row only (shared x)
    assert all(ax.get_ylabel() == "accuracy" for ax in axes)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["shared (mean)", "shared (seed min–max)", "isolated (mean)", "isolated (seed min–max)",
                      "peak (per seed)", "cliff onset (per seed)"]


def test_learning_curves_plot_seed_means_bands_peaks_and_cliffs_in_policy_colours(study) -> None:
    config, _ = study
    voting = plots.study_figures(plots.load_study(config))["curves-arith"].get_axes()[1]
    colour = {p: to_hex(plots.policy_colour(p)) for p in POLICIES}
    means = [line for line in voting.get_lines() if line.get_marker() in ("None", None, "") and len(line.get_xdata()) > 2]
    assert [to_hex(line.get_color()) for line in means] == [colour["shared"], colour["isolated"]]
    for line, policy in zip(means, ("shared", "isolated")):
        assert list(line.get_xdata()) == list(STEPS)
        expected = [(accuracy("voting", policy, 0, s) + accuracy("voting", policy, 1, s)) / 2 for s in STEPS]
        assert list(line.get_ydata()) == pytest.approx(expected)
    bands = [c for c in voting.collections if isinstance(c, PolyCollection)]
    assert [to_hex(b.get_facecolor()[0][:3]) for b in bands] == [colour["shared"], colour["isolated"]]
    # every seed's peak: a triangle at (peak_step, peak) in its policy's colour
    peaks = {(to_hex(m.get_color()), float(m.get_xdata()[0]), float(m.get_ydata()[0]))
             for m in voting.get_lines() if m.get_marker() == "^"}
    assert (colour["shared"], 10.0, accuracy("voting", "shared", 0, 10)) in peaks
    assert (colour["shared"], 40.0, accuracy("voting", "shared", 1, 40)) in peaks
    assert len(peaks) == 4
    # the one cliff: a dashed vertical line at its onset (step 30), in shared's colour
    dashed = [line for line in voting.get_lines() if line.get_linestyle() == "--"]
    assert [(to_hex(d.get_color()), list(d.get_xdata())) for d in dashed] == [(colour["shared"], [30, 30])]
    single = plots.study_figures(plots.load_study(config))["curves-arith"].get_axes()[0]
    assert not [line for line in single.get_lines() if line.get_linestyle() == "--"]


def test_panel_without_evaluations_says_so(experiment: Path) -> None:
    config = load_config(experiment, only=list(ONLY[1::2]))
    write_study(Path(config.results_dir), [c for c in cells(config) if c.workflow == "single"])
    single, voting = plots.study_figures(plots.load_study(config))["curves-arith"].get_axes()
    assert [t.get_text() for t in voting.texts] == ["no evaluations yet"]
    assert len(single.texts) == 0 and len(single.get_lines()) > 0


def test_every_policy_and_role_has_its_own_fixed_colour() -> None:
    from matrixrl.workflows import WORKFLOWS

    assert set(plots.POLICY_COLOURS) == set(POLICIES)
    assert len(set(plots.POLICY_COLOURS.values())) == len(POLICIES)
    roles = plots.role_colours()
    assert set(roles) == {role for workflow in WORKFLOWS.values() for role in workflow.roles}
    assert len(set(roles.values())) == len(roles)


# --- diagnostics --------------------------------------------------------------------------


def test_diagnostics_figure_of_a_cliff_cell(study) -> None:
    config, _ = study
    fig = plots.study_figures(plots.load_study(config), [CLIFF_CELL])[f"diagnostics-{CLIFF_CELL}"]
    assert CLIFF_CELL in fig._suptitle.get_text()
    norm_ax, share_ax, amp_ax = fig.get_axes()
    assert [ax.get_title() for ax in (norm_ax, share_ax, amp_ax)] == [
        "gradient L2 norm per role", "gradient-mass share per role", "amplification of parallel agents"]
    assert all(ax.get_xlabel() == "training step" and ax.get_ylabel() for ax in (norm_ax, share_ax, amp_ax))
    roles = plots.role_colours()
    thick = {line.get_label(): line for line in norm_ax.get_lines() if line.get_label() in roles}
    assert {r: to_hex(line.get_color()) for r, line in thick.items()} == {r: to_hex(roles[r]) for r in ("aggregator", "generator")}
    raw_norms = [line for line in norm_ax.get_lines() if line.get_alpha() == 0.35]
    generator_raw = next(line for line in raw_norms if to_hex(line.get_color()) == to_hex(roles["generator"]))
    assert list(generator_raw.get_ydata()) == pytest.approx([0.2 * s if s != 3 else 0.0 for s in range(1, 41)])
    # the no-gradient update (step 3) is a gap in the shares, not a dip to 0
    raw_shares = [line for line in share_ax.get_lines() if line.get_alpha() == 0.35]
    assert all(3 not in list(line.get_xdata()) for line in raw_shares)
    assert all(list(line.get_ydata()) == pytest.approx([2 / 3 if to_hex(line.get_color()) == to_hex(roles["generator"]) else 1 / 3] * 39)
               for line in raw_shares)
    # references for 3 generators: aligned 3, orthogonal sqrt(3)
    levels = sorted(line.get_ydata()[0] for line in amp_ax.get_lines() if line.get_linestyle() == ":" and line.get_label() != "peak")
    assert levels == pytest.approx([math.sqrt(3), 3])
    for ax in (norm_ax, share_ax, amp_ax):
        marks = {line.get_label(): list(line.get_xdata()) for line in ax.get_lines() if line.get_label() in ("peak", "cliff onset")}
        assert marks == {"peak": [10, 10], "cliff onset": [30, 30]}


def test_diagnostics_figure_of_a_single_role_cell_has_no_amplification_panel(study) -> None:
    config, _ = study
    cell = "single-arith-tiny-s-isolated-s1"
    fig = plots.study_figures(plots.load_study(config), [cell])[f"diagnostics-{cell}"]
    assert [ax.get_title() for ax in fig.get_axes()] == ["gradient L2 norm per role", "gradient-mass share per role"]
    assert not [line for line in fig.get_axes()[0].get_lines() if line.get_label() == "cliff onset"]


# --- files and the command ---------------------------------------------------------------


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the PNG header, after checking the signature."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_plot_command_writes_decodable_pngs_and_prints_their_paths(study, tmp_path: Path) -> None:
    _, experiment = study
    out = tmp_path / "plots"
    result = run_cli("plot", "-c", experiment, *ONLY, "--out", out, "--cell", CLIFF_CELL)
    assert result.exit_code == 0, result.output
    written = [out / "curves-arith.png", out / f"diagnostics-{CLIFF_CELL}.png"]
    assert result.stdout.splitlines() == [str(p) for p in written]
    assert sorted(out.iterdir()) == sorted(written)  # no temporary files left behind
    # 2 panels of 4.2 x 2.8 in (+1 in for title and legend), 3 diagnostics panels of 4.6 x 3.6 in, at 110 dpi
    assert png_size(written[0]) == (round(4.2 * 110), round((2 * 2.8 + 1) * 110))
    assert png_size(written[1]) == (round(3 * 4.6 * 110), round(3.6 * 110))
    for path in written:
        pixels = matplotlib.image.imread(path)  # decodes the whole image
        assert pixels.shape[:2] == png_size(path)[::-1]
        assert pixels.std() > 0  # something is drawn


def test_plot_defaults_to_a_plots_folder_in_the_results(study) -> None:
    config, experiment = study
    result = run_cli("plot", "-c", experiment, *ONLY)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [str(Path(config.results_dir) / "plots" / "curves-arith.png")]


def test_plot_user_errors(study, tmp_path: Path) -> None:
    from test_cli_errors import assert_user_error

    config, experiment = study
    out = tmp_path / "plots"
    example = cells(config)[0].id
    assert_user_error(
        run_cli("plot", "-c", experiment, *ONLY, "--out", out, "--cell", "voting-arith-tiny-xl-shared-s0"),
        "--cell voting-arith-tiny-xl-shared-s0: not a cell of this grid; did you mean voting-arith-tiny-s-shared-s0?",
    )
    assert_user_error(
        run_cli("plot", "-c", experiment, *ONLY, "--out", out, "--cell", "nope"),
        f"--cell nope: not a cell of this grid; `matrixrl plan` lists the cell ids (e.g. {example})",
    )
    assert_user_error(
        run_cli("plot", "-c", experiment, *ONLY, "--out", out, "--lines", "polcy"),
        "--lines polcy: not an axis the curves can draw one line per value of; did you mean policy?",
    )
    assert_user_error(
        run_cli("plot", "-c", experiment, *ONLY, "--out", out, "--lines", "workflow"),
        "--lines workflow: not an axis the curves can draw one line per value of; use one of: policy "
        "(workflow, task and scale have panels of their own, seeds make the band)",
    )
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    assert_user_error(run_cli("plot", "-c", experiment, *ONLY, "--out", a_file),
                      f"--out {a_file}: is a file; pass a folder for the PNG files")
    assert not out.exists()


def test_plot_cell_without_diagnostics(experiment: Path, tmp_path: Path) -> None:
    from test_cli_errors import assert_user_error

    config = load_config(experiment, only=list(ONLY[1::2]))
    write_study(Path(config.results_dir), cells(config), with_diagnostics=False)
    assert_user_error(run_cli("plot", "-c", experiment, *ONLY, "--out", tmp_path / "plots", "--cell", CLIFF_CELL),
                      f"--cell {CLIFF_CELL}: no gradient diagnostics stored yet; run `matrixrl run` first")
    assert not (tmp_path / "plots").exists()


def test_plot_before_any_run(experiment: Path, tmp_path: Path) -> None:
    from test_cli_errors import assert_user_error

    results = experiment.parent / "results"
    assert_user_error(run_cli("plot", "-c", experiment, "--out", tmp_path / "plots"),
                      f"{results}: no results yet; run `matrixrl run` first")
    assert not results.exists() and not (tmp_path / "plots").exists()
