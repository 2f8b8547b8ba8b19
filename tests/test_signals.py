"""Signals, a kill -9, the lock and the code version of `matrixrl run`, on real small runs.

SIGINT, SIGTERM and SIGHUP stop a run within seconds, with one line and exit code
128 + N; a kill -9 of matrixrl takes Snakemake and its jobs with it. Either way no
process of the run is left, nor Snakemake's lock, and the next plain `matrixrl run`
resumes and gives the results of an undisturbed run. `--unlock` refuses while the
run holding the lock is alive, and the jobs run the matrixrl that started the run,
whatever the current folder holds.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from matrixrl import layout as L
from test_e2e import CELL0, small_experiment

REPO = Path(__file__).resolve().parents[1]
GRID = {"train.steps": 40, "train.eval_every": 20, "train.checkpoint_every": 10}
"""Long enough for a signal to land mid-training, after its first checkpoint (step 10), with few evaluations."""
STOP_WITHIN_S = 30  # Snakemake's grace is 20 s; a clean stop takes one or two


def matrixrl(*args: str, cwd: Path | None = None, python: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *python, "-m", "matrixrl", *args], capture_output=True, text=True, timeout=600, cwd=cwd
    )


def outcome(results: Path) -> tuple[dict, list[dict], int]:
    """What a run computed for the cell: accuracy per evaluated step, per-step metrics without wall-clock time."""
    cell = results / L.cell_dir(CELL0)
    accuracy = {p.name: json.loads(p.read_text())["accuracy"] for p in sorted((cell / "eval").glob("step_*.json"))}
    train = json.loads((cell / "train.json").read_text())
    metrics = [{k: v for k, v in m.items() if k != "seconds"} for m in train["metrics"]]
    return accuracy, metrics, train["steps"]


def undisturbed_run(folder: Path) -> Path:
    """An undisturbed run of the grid in ``folder``; its results.

    The session's ``reference`` fixture (conftest.py): its base model seeds the other runs' results.
    """
    config = small_experiment(folder, **GRID)
    proc = matrixrl("run", "-c", str(config), "--cores", "2")
    assert proc.returncode == 0, proc.stderr
    return folder / "results"


def fresh(reference: Path, folder: Path, **overrides) -> tuple[Path, Path]:
    """The grid in ``folder``, its base model copied from the reference: only training is under test."""
    config = small_experiment(folder, **{**GRID, **overrides})
    results = folder / "results"
    shutil.copytree(reference / "base", results / "base")
    return config, results


def as_from_a_terminal() -> None:
    """The signals a terminal's user sends act by default in the run, however pytest itself
    was started (``nohup`` or ``&`` in a script leave SIGHUP or SIGINT ignored, and an
    ignored signal stays ignored across exec, as ``nohup matrixrl run`` relies on)."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


@contextlib.contextmanager
def background_run(config: Path, stderr: Path):
    """`matrixrl run` in a session of its own (a signal to its group spares pytest); killed at the end if need be."""
    with stderr.open("w") as err:
        runner = subprocess.Popen(
            [sys.executable, "-m", "matrixrl", "run", "-c", str(config), "--cores", "2"],
            stdout=subprocess.DEVNULL, stderr=err, start_new_session=True, preexec_fn=as_from_a_terminal,
        )  # fmt: skip
    try:
        yield runner
    finally:
        if runner.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(runner.pid, signal.SIGKILL)
        runner.wait()


def wait_for(condition, runner: subprocess.Popen, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert runner.poll() is None, f"the run ended before {what}"
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.02)


def record_of(results: Path, runner: subprocess.Popen) -> dict:
    """The run's record of itself: its pid and Snakemake's (the id of Snakemake's process group)."""
    path = results / L.run_record(runner.pid)
    wait_for(path.exists, runner, "the run recorded itself")
    return json.loads(path.read_text())


def training_under_way(results: Path, step: int = GRID["train.checkpoint_every"]):
    """True once the training wrote its checkpoint of ``step`` (by default its first after step 0):
    what a resumed run starts from."""
    return lambda: (results / L.checkpoint_dir(L.cell_dir(CELL0), step) / "COMPLETE").exists()


def leftovers(results: Path, record: dict) -> list[str]:
    """Processes of the run still there: in Snakemake's group, or referring to the results folder
    by their command line, working directory or environment (zombies aside)."""
    mine = {os.getpid()}
    needle = str(results).encode()
    left = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        pid = int(entry.name)
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if stat[0] in ("Z", "X"):
                continue
            cmdline = (entry / "cmdline").read_bytes()
            cwd = os.readlink(entry / "cwd")
            environ = (entry / "environ").read_bytes()
        except OSError:  # ended meanwhile
            continue
        if (
            pid in (record["pid"], record["snakemake"])
            or int(stat[2]) == record["snakemake"]
            or needle in cmdline
            or cwd.startswith(str(results))
            or f"MATRIXRL_RUN_PID={record['pid']}\0".encode() in environ
        ):
            command = cmdline.replace(b"\0", b" ").decode(errors="replace")
            left.append(f"{pid} {command[:120]}")
    return left


def assert_run_gone(results: Path, record: dict, timeout: float = 0) -> None:
    deadline = time.monotonic() + timeout
    while (left := leftovers(results, record)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == [], f"processes of the run are left: {left}"
    locks = results / L.SNAKEMAKE_LOCKS
    assert not locks.exists() or not any(locks.iterdir()), f"Snakemake's lock is left: {list(locks.iterdir())}"


def assert_resumes_to_the_reference(config: Path, results: Path, reference: Path) -> None:
    assert not (results / L.train_result(CELL0)).exists(), "stopped too late to test resumption"
    proc = matrixrl("run", "-c", str(config), "--cores", "2")
    assert proc.returncode == 0, proc.stderr
    log = (results / L.job_log("train", cell=CELL0)).read_text()
    assert "from its checkpoint at step" in log, log
    assert outcome(results) == outcome(reference)


STOPS = [(signal.SIGTERM, "group"), (signal.SIGINT, "matrixrl"), (signal.SIGHUP, "group")]
"""How a run is stopped: SIGTERM to its group (``kill -- -PGID``, a scheduler), SIGINT to matrixrl
alone (as Ctrl-C's would be, were the terminal's group not the run's), SIGHUP to the group (a closed terminal)."""


@pytest.mark.slow
def test_each_signal_stops_the_run_which_resumes_to_the_same_results(reference, tmp_path):
    """One chain of runs: each signal of STOPS in turn stops a run mid-training, the first after the
    training's first checkpoint, each later one after the checkpoint that follows the one its run
    resumed from; the run after the last stop finishes with the results of an undisturbed run.
    (Each stop is asserted as it would be on its own, and a stop that spoilt a checkpoint would
    show in the final results; one run resumes and is stopped again, so the chain needs two runs
    fewer than a run and its resumption per signal.)"""
    config, results = fresh(reference, tmp_path / "grid")
    every = GRID["train.checkpoint_every"]
    train_log = results / L.job_log("train", cell=CELL0)
    for n, (signum, target) in enumerate(STOPS, start=1):
        name = signal.Signals(signum).name
        stderr = tmp_path / f"stderr-{n}-{name}"
        with background_run(config, stderr) as runner:
            record = record_of(results, runner)
            assert record["pid"] == runner.pid
            wait_for(training_under_way(results, n * every), runner, f"the training's checkpoint of step {n * every}")
            assert "▶ train cell=" in stderr.read_text()
            (os.killpg if target == "group" else os.kill)(runner.pid, signum)
            sent = time.monotonic()
            code = runner.wait(timeout=STOP_WITHIN_S + 30)
            took = time.monotonic() - sent
        assert code == 128 + signum, stderr.read_text()
        assert took < STOP_WITHIN_S, f"the run took {took:.0f} s to stop after {name}"
        lines = stderr.read_text().splitlines()
        stops = [line for line in lines if line.startswith("Stopped")]
        assert len(stops) == 1 and stops == lines[-1:], lines
        assert re.fullmatch(
            rf"Stopped by {name} after \d+ s: 1 job was running; its cell resumes from its last checkpoint with matrixrl run\.",
            stops[0],
        ), stops[0]
        assert "Error" not in stderr.read_text() and "Traceback" not in stderr.read_text()
        assert_run_gone(results, record)
        assert not list((results / L.RUNS_DIR).glob("*.json")), f"the run's record is left after {name}"
        assert not (results / L.train_result(CELL0)).exists(), f"{name} came too late to test resumption"
        if n > 1:  # this run resumed from where the one before it was stopped
            assert f"from its checkpoint at step {(n - 1) * every}" in train_log.read_text(), train_log.read_text()
    assert_resumes_to_the_reference(config, results, reference)
    assert f"from its checkpoint at step {len(STOPS) * every}" in train_log.read_text(), train_log.read_text()


@pytest.mark.slow
def test_kill_9_of_matrixrl_alone_takes_snakemake_and_its_jobs_with_it(reference, tmp_path):
    from matrixrl.snake.process import live_runs

    config, results = fresh(reference, tmp_path / "grid")
    with background_run(config, tmp_path / "stderr") as runner:
        record = record_of(results, runner)
        wait_for(training_under_way(results), runner, "the training's first checkpoint")
        os.kill(runner.pid, signal.SIGKILL)  # matrixrl alone: Snakemake runs in a session of its own
        assert runner.wait(timeout=30) == -signal.SIGKILL
        # Snakemake notices within half a second; its jobs end, it releases its lock and exits.
        assert_run_gone(results, record, timeout=STOP_WITHIN_S)
    assert "is gone; stopping its jobs" in next((results / L.SNAKEMAKE_LOGS).glob("*.log")).read_text()
    assert live_runs(results) == []  # the dead run's record is stale: ignored (and removed)
    assert_resumes_to_the_reference(config, results, reference)


@pytest.mark.slow
def test_unlock_refuses_while_the_run_holding_the_lock_is_alive(reference, tmp_path):
    config, results = fresh(reference, tmp_path / "grid", **{"train.steps": 4000, "train.eval_every": 4000, "train.checkpoint_every": None})
    with background_run(config, tmp_path / "stderr") as runner:
        record_of(results, runner)
        wait_for(lambda: "▶ train" in (tmp_path / "stderr").read_text(), runner, "the training started")
        message = (
            f"Error: {results} is locked by a run that is still going (pid {runner.pid}); "
            f"stop it (kill {runner.pid}) or wait for it, then run again"
        )
        unlock = matrixrl("run", "-c", str(config), "--unlock")
        assert (unlock.returncode, unlock.stderr.splitlines(), unlock.stdout) == (1, [message], "")
        assert any((results / L.SNAKEMAKE_LOCKS).iterdir()), "the live run's lock was removed"
        second = matrixrl("run", "-c", str(config), "--cores", "1")
        assert second.returncode == 1
        assert second.stderr.splitlines()[-1] == message
        assert runner.poll() is None, "the first run did not survive"
        os.kill(runner.pid, signal.SIGTERM)  # the fix the message names
        assert runner.wait(timeout=STOP_WITHIN_S + 30) == 128 + signal.SIGTERM
    # A record left by a run that is gone does not hold anything up.
    stale = results / L.run_record(12345678)
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_text(json.dumps({"pid": 12345678, "started": 1, "snakemake": 12345679}))
    unlock = matrixrl("run", "-c", str(config), "--unlock")
    assert unlock.returncode == 0, unlock.stderr
    assert unlock.stdout.strip() == f"Unlocked {results}."


@pytest.mark.slow
def test_jobs_run_the_matrixrl_that_started_the_run_whatever_the_current_folder_holds(reference, tmp_path):
    config, results = fresh(reference, tmp_path / "grid", **{"train.steps": 2, "train.eval_every": 2})
    elsewhere = tmp_path / "checkout"
    # Another checkout's package in the current folder, and one in the results folder,
    # the current folder of Snakemake and of the server the jobs are forked from.
    for folder in (elsewhere, results):
        (folder / "matrixrl").mkdir(parents=True)
        (folder / "matrixrl" / "__init__.py").write_text('raise ImportError("wrong matrixrl")\n')
    # `python -m` puts the current folder first for matrixrl itself too (Python does, before
    # matrixrl runs); the console script or -P do not.
    proc = matrixrl("run", "-c", str(config), "--cores", "2", cwd=elsewhere, python=("-P",))
    assert proc.returncode == 0, proc.stderr
    assert "wrong matrixrl" not in proc.stderr
    assert sorted(p.name for p in (results / L.cell_dir(CELL0) / "eval").glob("*.json")) == ["step_0.json", "step_2.json"]


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.xdist_group("slurm-cluster")  # one worker runs every SLURM test (tests/conftest.py)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "kill-9"])
def test_a_stopped_run_under_a_slurm_profile_cancels_its_cluster_jobs(reference, tmp_path, signum):
    """Under a cluster profile the jobs are no processes of this machine: Snakemake gets SIGINT and scancels them.

    From matrixrl on a signal; from Snakemake itself once matrixrl is gone (kill -9).
    """
    import importlib.util

    from slurm_cluster import TERMINAL_STATES, slurm_cluster, unavailable
    from test_slurm import write_profile

    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        unavailable('snakemake-executor-plugin-slurm is not installed (pip install "matrixrl[slurm]")')
    config, results = fresh(reference, tmp_path / "grid", **{"train.steps": 4000, "train.eval_every": 4000, "train.checkpoint_every": None})
    train_log = results / L.job_log("train", cell=CELL0)
    stderr = tmp_path / "stderr"
    with slurm_cluster(tmp_path / "slurm", cpus=2, gpus=1) as cluster:
        profile = write_profile(tmp_path / "profile", cluster.partition)
        with stderr.open("w") as err:
            runner = subprocess.Popen(
                [sys.executable, "-m", "matrixrl", "run", "-c", str(config), "--profile", str(profile), "--cores", "2"],
                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True, preexec_fn=as_from_a_terminal, env=cluster.env(),
            )  # fmt: skip
        try:
            record = record_of(results, runner)
            wait_for(lambda: train_log.exists() and "step 1/" in train_log.read_text(), runner, "the training on SLURM started")
            (job,) = [j for j in cluster.jobs() if j["state"] == "RUNNING"]
            os.kill(runner.pid, signum)
            code = runner.wait(timeout=STOP_WITHIN_S + 30)
        finally:
            if runner.poll() is None:
                os.killpg(runner.pid, signal.SIGKILL)
                runner.wait()
        if signum == signal.SIGKILL:
            assert code == -signal.SIGKILL
        else:
            assert code == 128 + signum, stderr.read_text()
            assert stderr.read_text().splitlines()[-1].endswith(
                "1 job was running; its cell resumes from its last checkpoint with matrixrl run."
            ), stderr.read_text()
        deadline = time.monotonic() + 30
        while (state := cluster.job_state(job["id"])) not in TERMINAL_STATES:
            assert time.monotonic() < deadline, f"SLURM job {job['id']} still {state} after the run stopped"
            time.sleep(0.25)
        assert state == "CANCELLED"
        # Killing a cancelled job's processes is SLURM's part (KillWait 5 s). Without cgroups
        # (proctrack/linuxproc) one of them escaped it once on a loaded machine, the job's
        # `snakemake --target-jobs` living on after slurmstepd was done: such a stray is killed
        # here, and anything else of the run that is left still fails the test.
        deadline = time.monotonic() + STOP_WITHIN_S
        while (strays := slurm_job_processes(job["id"])) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in strays:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert_run_gone(results, record, timeout=STOP_WITHIN_S)


def slurm_job_processes(job_id: str) -> list[int]:
    """Processes of this machine that run in SLURM job ``job_id`` (by their environment)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if f"SLURM_JOB_ID={job_id}\0".encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
    return found


# --- quick: no run ----------------------------------------------------------------------


IMPORTED = "import matrixrl, sys; print(matrixrl.__file__)"
CHILD = f"""
import subprocess, sys
from matrixrl.snake.command import job_environment
print(subprocess.run([sys.executable, "-c", {IMPORTED!r}], env=job_environment(), capture_output=True, text=True).stdout.strip())
"""


def test_job_environment_imports_this_matrixrl_not_the_current_folders(tmp_path):
    installed = subprocess.run([sys.executable, "-P", "-c", IMPORTED], capture_output=True, text=True, cwd=tmp_path)
    # The installed matrixrl, from a folder holding another package of that name.
    (tmp_path / "matrixrl").mkdir()
    (tmp_path / "matrixrl" / "__init__.py").write_text('raise ImportError("wrong matrixrl")\n')
    proc = subprocess.run([sys.executable, "-P", "-c", CHILD], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == installed.stdout.strip()
    # A matrixrl that is not installed (`python -m matrixrl` in another checkout): its jobs import it too.
    checkout = tmp_path / "other"
    shutil.copytree(REPO / "matrixrl", checkout / "matrixrl", ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, cwd=checkout)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(checkout / "matrixrl" / "__init__.py")


def test_only_live_runs_hold_a_results_folder(tmp_path):
    from matrixrl.snake.process import _process_start, live_runs

    runs = tmp_path / L.RUNS_DIR
    runs.mkdir(parents=True)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        started = _process_start(sleeper.pid)[1]
        (runs / f"{sleeper.pid}.json").write_text(json.dumps({"pid": sleeper.pid, "started": started}))
        (runs / "1.json").write_text(json.dumps({"pid": 1, "started": started + 1}))  # pid 1 since, not this run
        (runs / "99999999.json").write_text(json.dumps({"pid": 99999999, "started": 1}))  # gone
        (runs / f"{os.getpid()}.json").write_text(json.dumps({"pid": os.getpid()}))  # the asking run itself
        assert [r["pid"] for r in live_runs(tmp_path)] == [sleeper.pid]
        assert sorted(p.name for p in runs.iterdir()) == sorted([f"{sleeper.pid}.json", f"{os.getpid()}.json"])
    finally:
        sleeper.kill()
        sleeper.wait()
    assert live_runs(tmp_path) == []


HOLD_THE_FOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, b"%d\\n" % os.getpid())
print("held", flush=True)
time.sleep(120)
"""


def test_a_run_refuses_a_folder_that_another_run_is_starting_or_ending_in(experiment, tmp_path):
    # Snakemake builds its job graph before it locks, and matrixrl reads what is stale before
    # Snakemake starts: a run that did either while another was ending redid that run's last jobs.
    from conftest import run_cli

    from matrixrl.runner import FolderLock

    results = tmp_path / "results"
    (results / ".matrixrl").mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_THE_FOLDER, str(results / L.RUN_LOCK_FILE)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        ran = run_cli("run", "-c", str(experiment), "--cores", "1")
        assert (ran.exit_code, ran.stderr.splitlines()) == (1, [
            f"Error: {results} is in use by another matrixrl run (pid {holder.pid}) that is starting or ending; "
            "wait for it, then run again"
        ])  # fmt: skip
        assert sorted(p.name for p in results.rglob("*")) == [".matrixrl", "run.lock"]  # nothing read into, nothing run
    finally:
        holder.kill()
        holder.wait()
    with FolderLock(results) as lock:  # the kernel dropped the holder's lock with it
        assert lock._fd is not None and not os.get_inheritable(lock._fd)  # Snakemake and its jobs never hold it
    with FolderLock(tmp_path / "not-yet") as lock:  # a folder that does not exist holds nothing yet
        assert lock._fd is None and not (tmp_path / "not-yet").exists()


def test_a_file_system_without_flock_runs_on_snakemakes_lock_alone(tmp_path, monkeypatch):
    # Lustre mounted without -o flock answers ENOSYS; a cluster's results folder may be there.
    import errno
    import fcntl

    from matrixrl.runner import FolderLock

    def unsupported(fd, operation):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", unsupported)
    with FolderLock(tmp_path) as lock:
        assert lock._fd is None  # not held, and no error


def test_a_lock_whose_pid_cannot_be_written_is_not_kept(tmp_path, monkeypatch):
    # A full disk as the run writes its pid: the error goes up, and the lock goes with it (a
    # Python session that calls Study.run() again must not find its own folder held).
    import errno

    from matrixrl.runner import FolderLock

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(os, "write", full)
        with pytest.raises(OSError, match="No space left"):
            with FolderLock(tmp_path):
                pass
    with FolderLock(tmp_path) as lock:
        assert lock._fd is not None


def test_the_stop_line_names_the_signal_and_what_resumes():
    from matrixrl.snake.process import RunStopped

    assert RunStopped(signal.SIGINT, 0.4, 0).exit_code == 130
    assert RunStopped(signal.SIGHUP, 3, 2).exit_code == 129
    assert RunStopped(signal.SIGTERM, 12.2, 3).message == (
        "Stopped by SIGTERM after 12 s: 3 jobs were running; their cells resume from their last checkpoints with matrixrl run."
    )
    assert RunStopped(signal.SIGINT, 0.4, 0).message == (
        "Stopped by SIGINT after 0 s: no job was running; matrixrl run runs the pending jobs."
    )


def test_the_log_parser_knows_which_jobs_run():
    from matrixrl.snake.events import LogParser

    parser = LogParser()
    log = """
localrule train:
    output: cells/a/train.json
    jobid: 2
    wildcards: cell=a
localrule train:
    jobid: 3
    wildcards: cell=b
Finished jobid: 2 (Rule: train)
Error in rule train:
    jobid: 3
    log: logs/train/b.log (check log file(s) for error details)
localrule evaluate:
    jobid: 4
    wildcards: cell=a, step=0
localrule all:
    jobid: 0
"""
    events, running = [], []
    for line in log.splitlines():
        events += parser.feed(line)
        running.append(dict(parser.running))
    events += parser.close()
    kinds = [(e.kind, e.rule, e.wildcards) for e in events if e.kind != "line"]
    assert kinds == [
        ("start", "train", "cell=a"), ("start", "train", "cell=b"), ("finished", "train", ""),
        ("failed", "train", "cell=b"), ("start", "evaluate", "cell=a, step=0"), ("start", "all", ""),
    ]  # fmt: skip
    assert parser.running == {"4": "evaluate"}
    assert [r for i, r in enumerate(running) if r and r != running[i - 1]] == [
        {"2": "train"}, {"3": "train"}, {"4": "evaluate"},
    ]  # fmt: skip
