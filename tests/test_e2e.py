"""End to end: real `matrixrl run` through Snakemake into a real SQLite store.

These are the slow tests (`pytest -m "not slow"` skips them); CI runs them all.
One tiny grid is run once per module; each test that grows, reruns or damages it does so
on its own copy of the finished run.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import copy_of

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SMALL = {
    "scales.tiny-s.warmstart.steps": 30,
    "train.steps": 4,
    "train.eval_every": 2,
    "train.problems_per_step": 8,
    "train.group_size": 4,
    "tasks.arith.n_eval": 64,
}


def small_experiment(folder: Path, **overrides) -> Path:
    """The default experiments.yaml shrunk to one cell that runs in seconds."""
    raw = yaml.safe_load((REPO / "experiments.yaml").read_text())
    raw["grid"].update(workflow=["single"], task=["arith"], scale=["tiny-s"], policy=["shared"], seed=[0])
    raw["tasks"] = {"arith": raw["tasks"]["arith"]}  # the warm-start teaches the grid's one task
    for key, value in {**SMALL, **overrides}.items():
        node = raw
        *parents, leaf = key.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "experiments.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def matrixrl(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "matrixrl", *args], capture_output=True, text=True, timeout=900
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"matrixrl {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def stored(results: Path, query: str) -> list[tuple]:
    with sqlite3.connect(results / "matrixrl.sqlite") as db:
        return db.execute(query).fetchall()


def accuracies(results: Path, cell: str) -> list[tuple[int, float]]:
    return stored(results, f"select step, accuracy from evaluations where cell = '{cell}' order by step")


def plan(config: Path, *extra: str) -> list[dict]:
    return json.loads(matrixrl("plan", "-c", str(config), "--format", "json", *extra).stdout)


def jobs_started(proc: subprocess.CompletedProcess) -> list[str]:
    return [line.split("▶ ", 1)[1] for line in proc.stderr.splitlines() if "▶ " in line]


def trainers(cell: str, results: Path) -> list[int]:
    """Pids of the training processes of ``cell`` in ``results`` (forked jobs carry the cell in
    their title and work in the results folder): never another test's, running meanwhile."""
    found = subprocess.run(["pgrep", "-f", f"matrixrl.jobs train {cell}"], capture_output=True, text=True)
    pids = []
    for pid in map(int, found.stdout.split()):
        try:
            if Path(os.readlink(f"/proc/{pid}/cwd")).is_relative_to(results.resolve()):
                pids.append(pid)
        except OSError:  # ended meanwhile
            continue
    return pids


@contextlib.contextmanager
def background_run(config: Path):
    """`matrixrl run -c CONFIG --cores 1` in its own session; whatever is left of it is killed on exit."""
    runner = subprocess.Popen(
        [sys.executable, "-m", "matrixrl", "run", "-c", str(config), "--cores", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        yield runner
    finally:
        try:
            os.killpg(runner.pid, signal.SIGKILL)
        except ProcessLookupError:  # the run and its children already ended
            pass
        runner.wait()


def plan_and_run(folder: Path) -> tuple[Path, Path, list[dict], subprocess.CompletedProcess]:
    """The small grid in ``folder``: its plan before a run, then that run (conftest's ``small_run``)."""
    config = small_experiment(folder)
    before = plan(config)
    proc = matrixrl("run", "-c", str(config), "--cores", "2")
    return config, folder / "results", before, proc


@pytest.fixture
def ran(small_run):
    """The session's run of the small grid (conftest.py), for tests that only read it."""
    return small_run


@pytest.fixture
def copy(small_run, tmp_path):
    """A private copy of the finished run: what a test changes, the others never see."""
    return copy_of(small_run[0], tmp_path / "grid")


CELL0 = "single-arith-tiny-s-shared-s0"
CELL1 = "single-arith-tiny-s-shared-s1"


def test_run_fills_the_store_with_every_checkpoint(ran):
    config, results, before, proc = ran
    assert {j["status"] for j in before} == {"pending"}
    assert [(j["rule"], j["step"]) for j in before if j["cell"] == CELL0] == [
        ("train", None),
        ("copy_base_eval", 0),  # step 0 is the base model's evaluation (evaluate_base), shared
        ("evaluate", 2),
        ("evaluate", 4),
        ("retain", None),
    ]
    started = jobs_started(proc)
    assert "prepare_base scale=tiny-s" in started
    assert [job for job in started if job.startswith("evaluate_base")] == ["evaluate_base scale=tiny-s, name=single-arith-"
        + json.loads((results / "cells" / CELL0 / "eval" / "step_0.json").read_text())["base_eval"][:10]]
    assert f"train cell={CELL0}" in started
    assert [s for s, _ in accuracies(results, CELL0)] == [0, 2, 4]
    assert [s for (s,) in stored(results, f"select step from train_steps where cell = '{CELL0}' order by step")] == [1, 2, 3, 4]
    assert all(0.0 <= a <= 1.0 for _, a in accuracies(results, CELL0))
    assert {j["status"] for j in plan(config)} == {"done"}


def checkpoint_steps(results: Path, cell: str) -> list[int]:
    folder = results / "cells" / cell / "checkpoints"
    return sorted(int(p.name.removeprefix("step_")) for p in folder.iterdir())


def key_steps(config: Path) -> set[int]:
    """What train.keep_checkpoints: key keeps of the one cell of ``config``, worked out from the
    report: the final step (the resume point), the peak, and a cliff's onset with its evaluated neighbours."""
    (row,) = json.loads(matrixrl("report", "-c", str(config), "--format", "json").stdout)
    steps = [s for s, _ in accuracies(config.parent / "results", CELL0)]
    kept = {steps[-1], row["peak_step"]}
    if row["cliff"]:
        at = steps.index(row["cliff_onset"])
        kept |= set(steps[at - 1 : at + 2])
    return kept


def test_a_finished_run_keeps_only_the_key_checkpoints_and_their_evaluations_stay(ran):
    config, results, _, _ = ran
    kept = key_steps(config)
    record = json.loads((results / "cells" / CELL0 / "retained.json").read_text())
    assert record["keep_checkpoints"] == "key"
    assert checkpoint_steps(results, CELL0) == sorted(kept) == [k["step"] for k in record["kept"]]
    assert record["deleted"] == record["pruned"] == sorted({0, 2, 4} - kept) != []
    # The deleted checkpoints' evaluations stay, in their files and in the store: every job is done.
    assert [s for s, _ in accuracies(results, CELL0)] == [0, 2, 4]
    assert all((results / "cells" / CELL0 / "eval" / f"step_{s}.json").exists() for s in (0, 2, 4))
    shown = matrixrl("plan", "-c", str(config)).stdout.splitlines()
    assert shown[-1] == "Nothing to run."
    # plan's disk estimate of a pruned grid is what is left on disk.
    left = sum(f.stat().st_size for f in (results / "cells" / CELL0 / "checkpoints").rglob("*") if f.is_file())
    from matrixrl.retention import format_bytes

    assert shown[-2].startswith(f"disk at peak: ~{format_bytes(left)} of checkpoints (train.keep_checkpoints: key; all: ~")


def test_second_run_with_nothing_changed_runs_no_job(copy):
    config, results = copy
    before = {p: p.stat().st_mtime_ns for p in (results / "cells").rglob("*.json")}
    proc = matrixrl("run", "-c", str(config), "--cores", "2")
    assert jobs_started(proc) == []
    assert "Nothing to run" in proc.stdout
    assert before == {p: p.stat().st_mtime_ns for p in (results / "cells").rglob("*.json")}  # nothing recomputed
    kept = [k["step"] for k in json.loads((results / "cells" / CELL0 / "retained.json").read_text())["kept"]]
    assert checkpoint_steps(results, CELL0) == kept  # nothing rebuilt


def test_report_values_are_recomputed_from_the_stored_accuracies(ran):
    config, results, _, _ = ran
    rows = json.loads(matrixrl("report", "-c", str(config), "--format", "json").stdout)
    assert len(rows) == 1
    row = rows[0]
    assert list(row) == [
        "workflow", "task", "scale", "policy", "seed", "base", "peak", "peak_step",
        "final", "final_tail", "gain", "gain_z", "peak_gain_z", "cliff", "cliff_onset", "signature", "n_checkpoints",
        "generator_answer_acc_base", "generator_answer_acc_peak", "generator_answer_acc_final",
    ]  # fmt: skip
    curve = accuracies(results, CELL0)
    peak = max(a for _, a in curve)
    assert row["base"] == curve[0][1]
    assert row["peak"] == peak
    assert row["peak_step"] == next(s for s, a in curve if a == peak)
    assert row["final"] == curve[-1][1]
    assert math.isclose(row["gain"], curve[-1][1] - curve[0][1])
    assert row["n_checkpoints"] == 3
    assert math.isclose(row["final_tail"], sum(a for _, a in curve) / 3)  # analysis.final_tail_k is 3
    csv = matrixrl("report", "-c", str(config), "--format", "csv").stdout.splitlines()
    assert csv[0] == (
        "workflow,task,scale,policy,seed,base,peak,peak_step,final,final_tail,gain,gain_z,peak_gain_z,cliff,cliff_onset,"
        "signature,n_checkpoints,generator_answer_acc_base,generator_answer_acc_peak,generator_answer_acc_final"
    )
    assert csv[1].startswith(f"single,arith,tiny-s,shared,0,{row['base']},")
    markdown = matrixrl("report", "-c", str(config), "--format", "markdown").stdout.splitlines()
    assert [c.strip() for c in markdown[0].split("|")[1:4]] == ["workflow", "task", "scale"]
    assert markdown[1].startswith("|:---")


def test_adding_a_seed_runs_only_the_new_cells_jobs(copy):
    config, results = copy
    grown = ["--set", "grid.seed=[0, 1]"]
    mtimes = {p: p.stat().st_mtime_ns for p in (results / "cells" / CELL0).rglob("*.json")}
    pending = [(j["rule"], j["cell"]) for j in plan(config, *grown) if j["status"] == "pending"]
    assert sorted(pending, key=str) == sorted(
        [("train", CELL1), ("copy_base_eval", CELL1), ("evaluate", CELL1), ("evaluate", CELL1), ("retain", CELL1), ("analyse", None)],
        key=str,
    )
    proc = matrixrl("run", "-c", str(config), "--cores", "2", *grown)
    started = jobs_started(proc)
    assert started and all(CELL1 in job or job.startswith("analyse") for job in started), started
    assert mtimes == {p: p.stat().st_mtime_ns for p in (results / "cells" / CELL0).rglob("*.json")}
    assert [s for s, _ in accuracies(results, CELL1)] == [0, 2, 4]


def test_a_failed_job_is_named_with_its_log(copy):
    config, results = copy
    assert {j["status"] for j in plan(config)} == {"done"}  # nothing but the deletion below changes
    # A deleted result is recomputed; without its checkpoint, that evaluation fails. (The final
    # checkpoint: retention keeps it; the deletion of one it pruned is the next test's.)
    shutil.rmtree(results / "cells" / CELL0 / "checkpoints" / "step_4")
    (results / "cells" / CELL0 / "eval" / "step_4.json").unlink()
    proc = matrixrl("run", "-c", str(config), "--cores", "2", check=False)
    assert proc.returncode == 1
    log = results / "logs" / "evaluate" / CELL0 / "step_4.log"
    cell = results.resolve() / "cells" / CELL0
    cause = (
        f"the checkpoint of step 4 is missing ({cell / 'checkpoints' / 'step_4'}), so it cannot be evaluated; "
        f"delete {cell / 'train.json'} and run `matrixrl run` again: the cell rebuilds it from its last checkpoint before"
    )
    assert f"✗ job evaluate (cell={CELL0}, step=4) failed: {cause}; log: {log}" in proc.stderr
    assert "Traceback" not in proc.stderr
    # The fix it names works, and rebuilds the same checkpoint: the same accuracy as before.
    first = dict(accuracies(results, CELL0))
    (cell / "train.json").unlink()
    matrixrl("run", "-c", str(config), "--cores", "2")
    assert dict(accuracies(results, CELL0)) == first


def test_the_deleted_evaluation_of_a_pruned_checkpoint_retrains_the_cell_to_the_same_result(copy):
    config, results = copy
    first = accuracies(results, CELL0)
    kept = checkpoint_steps(results, CELL0)
    record = json.loads((results / "cells" / CELL0 / "retained.json").read_text())
    pruned = next(step for step in record["pruned"] if step > 0)  # step 0's evaluation needs no checkpoint
    (results / "cells" / CELL0 / "eval" / f"step_{pruned}.json").unlink()
    pending = {(j["rule"], j["step"]) for j in plan(config) if j["status"] == "pending"}
    assert pending == {("train", None), ("evaluate", 2), ("evaluate", 4), ("retain", None), ("analyse", None)}
    proc = matrixrl("run", "-c", str(config), "--cores", "2")
    assert f"note: cells/{CELL0}/train.json reruns: evaluations of checkpoints that train.keep_checkpoints deleted" in proc.stderr
    assert f"train cell={CELL0}" in jobs_started(proc)
    assert accuracies(results, CELL0) == first
    assert checkpoint_steps(results, CELL0) == kept  # pruned again


def test_a_corrupt_result_file_is_recomputed_by_the_run(copy):
    config, results = copy
    bad = results / "cells" / CELL0 / "eval" / "step_4.json"
    good = bad.read_text()
    bad.write_text("{ not json")
    pending = [(j["rule"], j["step"], j["reason"]) for j in plan(config) if j["status"] == "pending"]
    assert pending == [("evaluate", 4, "unreadable"), ("retain", None, "upstream"), ("analyse", None, "upstream")]
    proc = matrixrl("run", "-c", str(config), "--cores", "2")
    assert sorted(jobs_started(proc)) == ["analyse", f"evaluate cell={CELL0}, step=4", f"retain cell={CELL0}"]
    assert json.loads(bad.read_text())["accuracy"] == json.loads(good)["accuracy"]


def test_a_result_file_corrupted_while_the_run_goes_is_named(copy, tmp_path, monkeypatch):
    # Damage found only by the job that reads the file: analyse names it and its fix.
    from matrixrl import dag
    from matrixrl.config import load_config
    from matrixrl.jobs.execute import execute

    config, results = copy
    bad = results / "cells" / CELL0 / "eval" / "step_4.json"
    (analyse,) = dag.Graph(load_config(config)).of_kind("analyse")
    bad.write_text("{ not json")
    monkeypatch.chdir(results)  # Snakemake's working folder: the job's paths are relative to it
    with pytest.raises(Exception) as failed:
        execute(analyse, str(tmp_path / "analyse.log"))
    cause = "corrupt result file (not valid JSON); delete it and run `matrixrl run` to recompute it"
    assert cause in str(failed.value) and f"Error: {bad.resolve()}: {cause}" in (tmp_path / "analyse.log").read_text()


def test_a_cell_recomputed_from_scratch_gives_the_same_accuracies(copy):
    config, results = copy
    first = accuracies(results, CELL0)
    rewards = stored(results, f"select step, reward_mean, loss from train_steps where cell = '{CELL0}' order by step")
    shutil.rmtree(results / "cells" / CELL0)
    proc = matrixrl("run", "-c", str(config), "--cores", "2")
    assert f"train cell={CELL0}" in jobs_started(proc)
    assert accuracies(results, CELL0) == first
    assert stored(results, f"select step, reward_mean, loss from train_steps where cell = '{CELL0}' order by step") == rewards


def test_settings_that_cannot_change_a_result_rerun_nothing(copy):
    config, results = copy
    runtime = ["--set", "train.threads=2", "--set", "eval.batch_size=5"]
    assert {j["status"] for j in plan(config, *runtime)} == {"done"}
    assert "Nothing to run" in matrixrl("run", "-c", str(config), "--cores", "2", *runtime).stdout
    # An evaluation setting reruns the evaluations (and the analysis); the training too, here,
    # because retention deleted checkpoints the new evaluations need: the cell retrains to rebuild them.
    pending = {(j["rule"], j["step"]) for j in plan(config, "--set", "eval.temperature=0.5") if j["status"] == "pending"}
    assert pending == {
        ("evaluate_base", 0), ("copy_base_eval", 0), ("train", None), ("evaluate", 2), ("evaluate", 4), ("retain", None),
        ("analyse", None),
    }


def test_a_changed_training_setting_retrains_instead_of_resuming_old_checkpoints(copy):
    config, results = copy
    query = f"select step, reward_mean, loss, grad_norm from train_steps where cell = '{CELL0}' order by step"
    before = stored(results, query)
    log = results / "logs" / "train" / f"{CELL0}.log"
    log.unlink()
    proc = matrixrl("run", "-c", str(config), "--cores", "2", "--set", "train.lr=2e-3")
    assert f"train cell={CELL0}" in jobs_started(proc)
    text = log.read_text()
    assert "written under other training settings; removing them" in text and "resuming" not in text
    after = stored(results, query)
    assert [r[0] for r in after] == [1, 2, 3, 4] and after[1:] != before[1:]
    # The store knows which spec each result came from.
    (digest,) = stored(results, f"select distinct spec_digest from evaluations where cell = '{CELL0}'")
    assert digest[0] == json.loads((results / "cells" / CELL0 / "eval" / "step_4.json").read_text())["spec_digest"]
    # Back to the file's rate: trained afresh again, the first run's numbers come back.
    matrixrl("run", "-c", str(config), "--cores", "2")
    assert stored(results, query) == before


def test_killed_training_resumes_and_matches_an_uninterrupted_run(reference, tmp_path):
    # The uninterrupted run is the session's reference (conftest.py); this one starts from its base
    # model: only the training job is under test.
    from test_signals import GRID, fresh

    config, results = fresh(reference, tmp_path / "killed")
    first_checkpoint = GRID["train.checkpoint_every"]
    checkpoints = results / "cells" / CELL0 / "checkpoints"
    with background_run(config) as runner:
        deadline = time.monotonic() + 300
        while not (checkpoints / f"step_{first_checkpoint}" / "COMPLETE").exists():
            assert time.monotonic() < deadline, f"training never reached step {first_checkpoint}"
            assert runner.poll() is None, "the run ended before it could be killed"
            time.sleep(0.02)
        pids = trainers(CELL0, results)
        assert pids, "no training process to kill"
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        assert runner.wait(timeout=120) != 0
    assert not (results / "cells" / CELL0 / "train.json").exists(), "killed too late to test resumption"
    # The killed job's outputs are incomplete: plan shows them pending (no error).
    assert next(j for j in plan(config) if j["rule"] == "train")["status"] == "pending"

    matrixrl("run", "-c", str(config), "--cores", "1")
    log = (results / "logs" / "train" / f"{CELL0}.log").read_text()
    assert "resuming" in log and "from its checkpoint at step" in log
    resumed_from = int(log.split("from its checkpoint at step ")[1].split()[0])
    assert resumed_from >= first_checkpoint
    assert accuracies(results, CELL0) == accuracies(reference, CELL0)
    query = f"select step, reward_mean, loss, grad_norm from train_steps where cell = '{CELL0}' order by step"
    assert stored(results, query) == stored(reference, query)


def test_no_training_outlives_a_killed_run(ran, tmp_path):
    """kill -9 of Snakemake mid-training: its forked training must not go on writing the cell."""
    _, first_results, _, _ = ran
    config = small_experiment(tmp_path, **{"train.steps": 400, "train.eval_every": 400})
    results = tmp_path / "results"
    shutil.copytree(first_results / "base", results / "base")
    with background_run(config) as runner:
        deadline = time.monotonic() + 300
        while not (pids := trainers(CELL0, results)):
            assert time.monotonic() < deadline, "no training process started"
            assert runner.poll() is None, "the run ended before training started"
            time.sleep(0.1)
        snakemake = subprocess.run(["pgrep", "-f", "--", f"--directory {results}"], capture_output=True, text=True)
        assert snakemake.stdout.split(), "no Snakemake process to kill"
        for pid in snakemake.stdout.split():
            os.kill(int(pid), signal.SIGKILL)
        deadline = time.monotonic() + 30
        while any(Path(f"/proc/{pid}").exists() and "zombie" not in _state(pid) for pid in pids):
            assert time.monotonic() < deadline, f"training {pids} still runs 30 s after its run was killed"
            time.sleep(0.1)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0]
    except (FileNotFoundError, IndexError):
        return "zombie (gone)"


def test_every_workflow_and_policy_mode_runs_and_stores_diagnostics_for_every_step(tmp_path):
    from matrixrl.config import POLICIES, WORKFLOWS

    # 18 evaluations: 16 problems each are enough to have every metric below at every checkpoint.
    config = small_experiment(tmp_path, **{"train.problems_per_step": 4, "tasks.arith.n_eval": 16})
    raw = yaml.safe_load(config.read_text())
    raw["grid"].update(workflow=list(WORKFLOWS), policy=list(POLICIES))
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    results = tmp_path / "results"
    matrixrl("run", "-c", str(config), "--cores", "2")

    # single has one role: its isolated cell is its shared run, trained and evaluated once.
    assert not (results / "cells" / "single-arith-tiny-s-isolated-s0").exists()
    cells = [f"{w}-arith-tiny-s-{p}-s0" for w in WORKFLOWS for p in POLICIES if (w, p) != ("single", "isolated")]
    for cell in cells:
        assert [s for s, _ in accuracies(results, cell)] == [0, 2, 4], cell
        steps = stored(results, f"select distinct step from diagnostics where cell = '{cell}' and kind = 'agent_norm' order by step")
        assert [s for (s,) in steps] == [1, 2, 3, 4], cell
    # Parallel agents are measured one by one: voting has three generators per step.
    agents = stored(results, "select distinct agent from diagnostics where cell = 'voting-arith-tiny-s-isolated-s0' and kind = 'agent_norm'")
    assert sorted(a for (a,) in agents) == ["aggregator0", "generator0", "generator1", "generator2"]
    assert stored(results, "select count(*) from diagnostics where cell = 'voting-arith-tiny-s-shared-s0' and kind = 'role_total_cosine'")[0][0] > 0
    assert stored(results, "select count(*) from diagnostics where cell = 'voting-arith-tiny-s-isolated-s0' and kind = 'role_cosine'")[0][0] == 0

    # Per-role metrics of every checkpoint: the evaluator's verdict accuracy at base included.
    base_roles = stored(results, "select role, metric from role_metrics where cell = 'eval_opt-arith-tiny-s-shared-s0' and source = 'eval' and step = 0")
    assert {("evaluator", "verdict_acc"), ("generator", "answer_acc"), ("episode", "any_correct")} <= set(base_roles)
    train_steps = stored(results, "select distinct step from role_metrics where cell = 'voting-arith-tiny-s-shared-s0' and source = 'train' and metric = 'answer_acc' and role = 'aggregator'")
    assert [s for (s,) in train_steps] == [1, 2, 3, 4]
    for metric in ("answer_acc", "response_length", "entropy", "group_size"):
        per_step = stored(results, f"select distinct step from role_metrics where cell = 'voting-arith-tiny-s-isolated-s0' and source = 'train' and metric = '{metric}' and role = 'generator'")
        assert [s for (s,) in per_step] == [1, 2, 3, 4], metric

    rows = json.loads(matrixrl("report", "-c", str(config), "--table", "diagnostics", "--format", "json").stdout)
    assert [(r["workflow"], r["policy"]) for r in rows] == [(w, p) for w in WORKFLOWS for p in POLICIES]
    by_workflow = {(r["workflow"], r["policy"]): r for r in rows}
    assert by_workflow[("voting", "shared")]["amplified_role"] == "generator"
    assert by_workflow[("orch_workers", "isolated")]["amplified_role"] == "worker"
    assert by_workflow[("single", "shared")]["amplified_role"] is None


def test_a_damaged_store_is_rebuilt_by_run(copy):
    config, results = copy
    query = "select cell, step, accuracy from evaluations order by cell, step"
    before = stored(results, query)
    store = results / "matrixrl.sqlite"
    store.write_bytes(b"not a database " * 100)
    proc = matrixrl("run", "-c", str(config), "--cores", "2")
    assert f"note: {store} was damaged (file is not a database); moved it to {store}.damaged-" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert stored(results, query) == before


def test_a_report_before_the_run_ends_names_the_cells_not_finished(copy):
    config, results = copy
    evaluation = results / "cells" / CELL0 / "eval" / "step_4.json"
    written = evaluation.read_bytes()
    evaluation.unlink()  # as while its evaluation runs
    import matrixrl as api
    from matrixrl import layout as L
    from matrixrl.snake.process import _write_record

    progress = api.Study.load(config).progress()
    assert progress[["cell", "evaluated", "checkpoints", "status"]].values.tolist() == [[CELL0, 2, 3, "in progress"]]
    # No run going (one failed or was stopped): said all the same, a table short of cells is no study's.
    assert matrixrl("report", "-c", str(config)).stderr.strip().splitlines()[-1] == (
        "note: 1 of 1 cells are not finished and no run is going (one failed or was stopped, or none reached them; "
        f"`matrixrl run` finishes them); the tables show only what is done: {CELL0} (2/3 checkpoints)"
    )
    record = results / L.run_record(os.getpid())  # this process, recorded as a run going (what `run` writes)
    _write_record(record, os.getpid())
    try:
        proc = matrixrl("report", "-c", str(config))
    finally:
        record.unlink()
    assert proc.stderr.strip().splitlines()[-1] == (
        "note: a run is going: 1 of 1 cells are not finished; the tables show what is done so far: "
        f"{CELL0} (2/3 checkpoints)"
    )
    assert "0.0" in proc.stdout  # the rows so far are still printed
    evaluation.write_bytes(written)  # as once that evaluation has finished
    assert api.Study.load(config).progress()["status"].tolist() == ["done"]
