"""The Python API (``matrixrl.Study``): the CLI's tables and figures, and the stored rows, from a real store.

The study's result files are written as the jobs write them and read through the
same ingest as ``matrixrl report``; the tables are compared with what the CLI
prints as JSON, value for value.
"""

from __future__ import annotations

import json
import math
import os
import runpy
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pandas as pd
import pytest
from matplotlib.figure import Figure

import matrixrl
from matrixrl import grid as G
from matrixrl.config import load_config
from matrixrl.errors import ConfigError
from matrixrl.layout import eval_result
from matrixrl.report import TABLE_NAMES
from matrixrl.results import write_result

import study_files as S
from conftest import REPO, run_cli

ONLY_ARGS = [arg for option in S.ONLY for arg in ("--only", option)]


@pytest.fixture
def study(experiment: Path) -> Path:
    """The experiments file of the small study, its result files on disk (not yet ingested)."""
    S.two_seed_experiment(experiment)
    S.write_study(experiment)
    return experiment


def plain(value):
    """A frame's value as the JSON has it: NaN/NA is null, numpy scalars are Python ones."""
    if value is None or value is pd.NA:
        return None
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def frame_records(frame) -> list[dict]:
    return [{c: plain(v) for c, v in zip(frame.columns, row)} for row in frame.itertuples(index=False, name=None)]


def cli_json(experiment: Path, *args: str) -> list[dict]:
    result = run_cli("report", "-c", experiment, *args, "--format", "json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize(
    "only, sets",
    [
        ([], []),
        (["workflow=voting", "seed=1"], ["analysis.cliff_delta=0.5"]),
    ],
    ids=["whole", "only+set"],
)
def test_every_table_equals_the_cli_json(study: Path, only: list[str], sets: list[str]) -> None:
    grid = [*ONLY_ARGS, *(a for o in only for a in ("--only", o))]
    options = [*grid, *(a for s in sets for a in ("--set", s))]
    api = matrixrl.Study.load(study, only=[*S.ONLY, *only], set=sets)
    for name in TABLE_NAMES:
        if name in ("memory", "cost"):  # no memory, no recorded costs here (test_memory_report, test_cost have them)
            continue
        frame = api.table(name)
        expected = cli_json(study, "--table", name, *options)
        assert expected, name
        assert list(frame.columns) == list(expected[0]), name
        assert frame_records(frame) == expected, name
    # per-cell tables are indexed by cell id, in the rows' order
    summary = api.table("summary")
    ids = [G.Cell(r["workflow"], r["task"], r["scale"], r["policy"], r["seed"]).id for r in frame_records(summary)]
    assert list(summary.index) == ids and summary.index.name == "cell"


def test_group_by_against_and_captions_as_the_cli(study: Path) -> None:
    api = matrixrl.Study.load(study, only=S.ONLY)
    frame = api.table("summary", group_by=["policy", "seed"])
    assert frame_records(frame) == cli_json(study, *ONLY_ARGS, "--table", "summary", "--group-by", "policy,seed")
    assert frame["policy"].tolist() == ["shared"] * 4 + ["isolated"] * 4
    assert frame.attrs["caption"].startswith("single: one role, so isolated is the same computation as shared")
    against = api.table("compare", against="policy=shared")
    assert frame_records(against) == cli_json(study, *ONLY_ARGS, "--table", "compare", "--against", "policy=shared")
    assert "verdict" in api.table("mechanism").columns and api.table("mechanism").attrs["caption"]


def test_only_and_set_as_mappings_are_the_options(study: Path) -> None:
    as_strings = matrixrl.Study.load(study, only=[*S.ONLY, "seed=0,1", "workflow=voting"], set=["analysis.cliff_delta=0.5"])
    as_mappings = matrixrl.Study.load(
        study, only={"task": "arith", "scale": ["tiny-s"], "seed": [0, 1], "workflow": "voting"}, set={"analysis.cliff_delta": 0.5}
    )
    assert as_mappings.only == ("task=arith", "scale=tiny-s", "seed=0,1", "workflow=voting")
    assert as_mappings.config.analysis.cliff_delta == 0.5
    for name in ("summary", "compare"):
        assert frame_records(as_mappings.table(name)) == frame_records(as_strings.table(name))
    # --only keeps the comparisons' controls: voting - single is there though single is not selected
    assert set(as_mappings.table("summary")["workflow"]) == {"voting"}
    assert "voting - single" in set(as_mappings.table("compare")["comparison"])
    # --set changes the analysis: with a cliff threshold of 0.5 the collapse is no cliff
    assert not as_mappings.table("summary")["cliff"].any()
    assert matrixrl.Study.load(study, only=S.ONLY).table("summary")["cliff"].sum() == 1


def test_bad_options_are_the_cli_errors(study: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        matrixrl.Study.load(study, only=["seed=7"])
    cli = run_cli("report", "-c", study, "--only", "seed=7")
    assert cli.exit_code == 2 and cli.stderr.strip() == f"Error: {raised.value}"
    with pytest.raises(ConfigError, match=r"train\.stepz: unknown key"):
        matrixrl.Study.load(study, set={"train.stepz": 4})
    with pytest.raises(ConfigError, match="unknown table 'nope'"):
        matrixrl.Study.load(study).table("nope")
    with pytest.raises(ConfigError, match=r"^unknown table 'seed'; did you mean seeds\?$"):
        matrixrl.Study.load(study).table("seed")
    with pytest.raises(ConfigError, match="no such file"):
        matrixrl.Study.load(study.parent / "missing.yaml")


def test_nothing_run_yet_is_a_user_error(experiment: Path) -> None:
    study = matrixrl.Study.load(experiment)
    assert len(study.cells()) == 32  # the grid needs no results
    for read in (study.curves, study.training, lambda: study.table("summary"), study.figures):
        with pytest.raises(ConfigError, match="no results yet; run `matrixrl run` first"):
            read()


def test_curves_training_diagnostics_and_role_metrics(study: Path) -> None:
    api = matrixrl.Study.load(study, only=S.ONLY)
    runs = {run.id: run for run in G.runs(api.selected)}
    cells = api.cells()
    assert list(cells.columns) == ["cell", "workflow", "task", "scale", "policy", "seed", "run"]
    assert len(cells) == 8 and len(runs) == 6

    curves = api.curves()
    assert list(curves.columns[:7]) == ["cell", "workflow", "task", "scale", "policy", "seed", "step"]
    assert {"accuracy", "se", "n", "n_correct", "samples"} <= set(curves.columns)
    assert len(curves) == 8 * len(S.STEPS)
    assert curves["cell"].drop_duplicates().tolist() == cells["cell"].tolist()  # grid order, then step
    for row in curves.itertuples(index=False):
        run = runs[dict(zip(cells["cell"], cells["run"]))[row.cell]]
        assert row.accuracy == S.accuracy(run, row.step) and row.policy in row.cell
    # a one-role workflow's isolated cell repeats its shared run
    isolated = curves[curves["cell"] == "single-arith-tiny-s-isolated-s1"]
    shared = curves[curves["cell"] == "single-arith-tiny-s-shared-s1"]
    assert isolated["accuracy"].tolist() == shared["accuracy"].tolist() and set(isolated["policy"]) == {"isolated"}

    training = api.training()
    assert len(training) == 8 * S.TRAIN_STEPS
    voting = training[training["cell"] == "voting-arith-tiny-s-isolated-s1"]
    assert voting["step"].tolist() == list(range(1, S.TRAIN_STEPS + 1))
    assert voting["reward_mean"].tolist() == [S.reward(runs["voting-arith-tiny-s-isolated-s1"], s) for s in voting["step"]]

    norms = api.diagnostics("role_norm")
    assert set(norms["kind"]) == {"role_norm"}
    generator = norms[(norms["cell"] == "voting-arith-tiny-s-shared-s0") & (norms["role"] == "generator")]
    assert generator["value"].tolist() == [S.grad_norm(runs["voting-arith-tiny-s-shared-s0"], "generator", s) for s in range(1, 41)]
    assert set(api.diagnostics()["kind"]) == {"agent_norm", "agent_cosine", "amplification", "role_norm", "role_share"}
    with pytest.raises(ConfigError, match=r"^kind='role_nrom': no such diagnostic; did you mean role_norm\?$"):
        api.diagnostics(["role_share", "role_nrom"])  # a misspelt kind is an error, not an empty frame

    evals = api.role_metrics("eval")
    assert set(evals["source"]) == {"eval"} and {"answer_acc", "pass@1", "pass@2"} == set(evals["metric"])
    assert set(api.role_metrics("train")["metric"]) == {"answer_acc", "any_correct"}
    with pytest.raises(ConfigError, match="source='both'"):
        api.role_metrics("both")

    narrowed = matrixrl.Study.load(study, only=[*S.ONLY, "workflow=voting", "seed=0"])
    assert sorted(narrowed.curves()["cell"].unique()) == ["voting-arith-tiny-s-isolated-s0", "voting-arith-tiny-s-shared-s0"]


def test_results_of_other_settings_are_left_out_as_in_the_report(study: Path) -> None:
    other = matrixrl.Study.load(study, only=S.ONLY, set={"train.lr": 5.0e-4})
    assert other.curves().empty and other.training().empty and other.diagnostics().empty
    with pytest.raises(ConfigError, match="no evaluations stored for the cells of this grid"):
        other.table("summary")


def test_each_call_reads_results_that_arrived_since(experiment: Path) -> None:
    S.two_seed_experiment(experiment)
    S.write_study(experiment, steps=(0, 10))
    api = matrixrl.Study.load(experiment, only=S.ONLY)
    assert api.curves()["step"].max() == 10
    config = load_config(experiment, only=S.ONLY)
    run = G.runs(config)[0]
    digest = G.cell_spec(config, run).eval_digest()
    write_result(Path(config.results_dir) / eval_result(run.id, 20), S.evaluation(run, 20, digest))
    assert api.ingest() == 1
    write_result(Path(config.results_dir) / eval_result(run.id, 30), S.evaluation(run, 30, digest))
    curves = api.curves()  # reads the new file itself
    assert curves[curves["cell"] == run.id]["step"].tolist() == [0, 10, 20, 30]
    assert api.table("summary").loc[run.id, "n_checkpoints"] == 4
    assert api.ingest() == 0


def test_figures_are_the_plot_commands(study: Path, tmp_path: Path) -> None:
    api = matrixrl.Study.load(study, only=S.ONLY)
    cliff = "voting-arith-tiny-s-shared-s0"
    figures = api.figures(cells=[cliff])
    # the file stems `matrixrl plot --cell CLIFF` writes (tests/test_plots.py runs the command)
    assert list(figures) == ["curves-arith", f"diagnostics-{cliff}"]
    assert all(isinstance(f, Figure) for f in figures.values())

    curves = api.figure("curves")  # one task: no need to name it
    assert [ax.get_title() for ax in curves.get_axes()] == ["single · tiny-s", "voting · tiny-s"]
    assert curves._suptitle.get_text() == figures["curves-arith"]._suptitle.get_text()
    diagnostics = api.figure("diagnostics", cell=cliff)
    assert [ax.get_title() for ax in diagnostics.get_axes()] == [
        "gradient L2 norm per role", "gradient-mass share per role", "amplification of parallel agents"]  # fmt: skip
    path = tmp_path / "curves.png"
    curves.savefig(path, dpi=30)
    assert matplotlib.image.imread(path).std() > 0

    with pytest.raises(ConfigError, match=r"^cell nope: not a cell of this grid"):
        api.figure("diagnostics", cell="nope")
    with pytest.raises(ConfigError, match=r"^task pyfunc: not a task of this grid; use one of: arith$"):
        api.figure("curves", task="pyfunc")
    with pytest.raises(ConfigError, match=r"^lines seed: not an axis"):
        api.figures(lines="seed")
    with pytest.raises(ConfigError, match="use one of: curves, diagnostics"):
        api.figure("histogram")


def test_import_matrixrl_stays_light() -> None:
    code = (
        "import sys, matrixrl\n"
        "heavy = [m for m in ('pandas', 'torch', 'matplotlib', 'sqlalchemy', 'transformers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "from matrixrl.study import Study\n"
        "assert matrixrl.Study is Study and 'Study' in dir(matrixrl)\n"
        "try:\n    matrixrl.nope\nexcept AttributeError as e:\n    print(e)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "module 'matrixrl' has no attribute 'nope'"


def test_the_example_script_prints_the_readme_table_and_writes_a_plot(study: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    out = tmp_path / "example"
    monkeypatch.setattr(sys, "argv", ["from_python.py", str(study), "--out", str(out), *(f"--only={o}" for o in S.ONLY)])
    runpy.run_path(str(REPO / "examples" / "from_python.py"), run_name="__main__")
    lines = capsys.readouterr().out.splitlines()
    header = "| workflow | task | scale | base | shared: peak (step) → final | gain, SEs | isolated: peak (step) → final | gain, SEs |"
    assert lines[0] == header
    rows = [line for line in lines if line.startswith(("| single ", "| voting "))]
    assert len(rows) == 2  # one row per workflow, task and scale, seed 0 (the README's table)
    summary = matrixrl.Study.load(study, only=S.ONLY).table("summary")
    shared, isolated = summary.loc["voting-arith-tiny-s-shared-s0"], summary.loc["voting-arith-tiny-s-isolated-s0"]

    def run(row) -> str:
        return f"{row['peak']:.3f} ({row['peak_step']}) → {row['final']:.3f} | {row['gain_z']:+.1f}"

    assert rows[1] == f"| voting | arith | tiny-s | {shared['base']:.3f} | {run(shared)} | {run(isolated)} |"
    # by hand: base 77/256, peak 128/256 at step 10, final 51/256 (shared) and 87/256 (isolated);
    # gain in SEs of the difference, each checkpoint's se 0.02: (51 - 77)/256 / (0.02·√2) = -3.6, (87 - 77)/256 / 0.0283 = +1.4
    assert rows[1] == "| voting | arith | tiny-s | 0.301 | 0.500 (10) → 0.199 | -3.6 | 0.340 (40) → 0.340 | +1.4 |"
    assert rows[0].endswith("| same run as shared (one role) | — |")
    png = out / "curves-arith.png"
    assert lines[-1] == str(png) and matplotlib.image.imread(png).std() > 0


# --- plan and run ---------------------------------------------------------------------------


def test_plan_lists_the_selected_grid_and_the_command_that_runs_it(experiment: Path):
    """Study.plan() is `matrixrl plan`'s data: every job with its status, and a closing line
    that repeats the options the plan was made with (a narrowed --set grid is only run by them)."""
    study = matrixrl.Study.load(experiment, only=["scale=tiny-s", "seed=0"], set={"train.steps": 4, "train.eval_every": 2})
    found = study.plan()
    assert {job["status"] for job in found.jobs} == {"pending"} and len(found.pending) == len(found.jobs)
    assert {job["scale"] for job in found.jobs if job["scale"]} == {"tiny-s"}
    assert found.closing_line() == (
        f"{len(found.jobs)} jobs pending: `matrixrl run -c {experiment} --only scale=tiny-s --only seed=0 "
        "--set train.steps=4 --set train.eval_every=2` runs them."
    )
    result = run_cli("plan", "-c", str(experiment), "--only", "scale=tiny-s", "--set", "grid.train.lr=[1.0e-4, 5.0e-5]")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines()[-1].endswith(
        f"pending: `matrixrl run -c {experiment} --only scale=tiny-s --set 'grid.train.lr=[1.0e-4, 5.0e-5]'` runs them."
    )


@pytest.mark.slow
def test_a_study_runs_its_pending_jobs_and_then_has_none(tmp_path: Path):
    """Study.run() runs what Study.plan() lists, reporting each job and the progress as plan
    counts it; afterwards nothing is pending and a second run has nothing to do."""
    from test_e2e import small_experiment

    study = matrixrl.Study.load(small_experiment(tmp_path))
    pending = len(study.plan().pending)
    seen = []
    outcome = study.run(cores=2, on_event=lambda event, progress: seen.append((event.kind, progress.done, progress.total)))
    assert outcome.ok and not outcome.nothing and outcome.failures == []
    finished = [done for kind, done, _ in seen if kind == "finished"]
    assert finished[-1] == pending and {total for _, _, total in seen} == {pending}
    assert study.plan().pending == []
    again = study.run(cores=2)
    assert again.ok and again.nothing
