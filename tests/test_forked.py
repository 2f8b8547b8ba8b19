"""The job server (matrixrl/jobs/forked.py): exit codes from any thread, one server across runs,
a fresh one when the code changes, none left once idle, signals passed to a run's jobs.

Each test talks to servers of its own (``XDG_RUNTIME_DIR``, a short temporary folder) that
preload nothing or one small module: what is under test is starting, reusing, signalling
and ending servers and their children, not what they import. The job ``exit CODE
[SECONDS]`` only sleeps and exits.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

CLIENT = """
import json, sys, threading
from matrixrl.jobs.forked import run_in_server

preload = json.loads(sys.argv[1])
jobs = json.loads(sys.argv[2])  # [[code, seconds], ...], run from one thread each
codes = [None] * len(jobs)

def one(i, code, seconds):
    request = {"op": "run", "argv": ["exit", str(code), str(seconds)], "title": "test", "log_path": sys.argv[3], "append": True}
    try:
        codes[i] = run_in_server(request, preload=preload)
    except Exception as exc:
        codes[i] = repr(exc)

threads = [threading.Thread(target=one, args=(i, *job)) for i, job in enumerate(jobs)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(json.dumps(codes))
"""


def client(tmp_path: Path, jobs: list[tuple[int, float]], preload=(), linger: float = 60, wait: bool = True, **env):
    """A Python of its own asking the job server of ``tmp_path`` for ``jobs``; its exit codes (or the process)."""
    environment = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path / "run"), "MATRIXRL_JOB_SERVER_LINGER_S": str(linger), **env}
    command = [sys.executable, "-c", CLIENT, json.dumps(list(preload)), json.dumps(jobs), str(tmp_path / "jobs.log")]
    if not wait:
        return subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, text=True, start_new_session=True)
    proc = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def servers(tmp_path: Path) -> list[int]:
    """Pids of the live job servers whose sockets are under ``tmp_path``."""
    needle = str(tmp_path / "run").encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if b"matrixrl.jobs.forked" in cmdline and needle in cmdline and state not in ("Z", "X"):
                found.append(int(entry.name))
    return found


def wait_until(condition, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "it never happened"
        time.sleep(0.05)


@pytest.fixture
def tmp_path():
    """A short folder: a socket's path has at most 107 bytes, and pytest's own are long. No server is left."""
    folder = Path(tempfile.mkdtemp(prefix="jobs-", dir="/tmp"))
    yield folder
    for pid in servers(folder):
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(folder, ignore_errors=True)


def test_concurrent_jobs_each_get_their_own_exit_code(tmp_path) -> None:
    # Snakemake runs jobs from several threads; each must read its own job's status.
    codes = client(tmp_path, [(0, 0), (3, 0)] * 20)
    assert codes == [0, 3] * 20


def test_one_server_serves_the_runs_that_follow_and_ends_once_idle(tmp_path) -> None:
    assert client(tmp_path, [(0, 0)], linger=3) == [0]
    (first,) = servers(tmp_path)
    assert client(tmp_path, [(5, 0)], linger=3) == [5]
    assert servers(tmp_path) == [first]  # the second run asked the first run's server
    wait_until(lambda: servers(tmp_path) == [], timeout=20)  # nobody asks for 3 s: it ends
    assert list((tmp_path / "run").rglob("*.sock")) == list((tmp_path / "run").rglob("*.log")) == []


def test_a_changed_module_gets_a_fresh_server(tmp_path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    module = code / "preloaded_here.py"
    module.write_text("VALUE = 1\n")
    pythonpath = os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")])
    assert client(tmp_path, [(0, 0)], preload=["preloaded_here"], PYTHONPATH=pythonpath) == [0]
    (first,) = servers(tmp_path)
    module.write_text("VALUE = 2\n")
    os.utime(module, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))  # whatever the clock's resolution
    assert client(tmp_path, [(0, 0)], preload=["preloaded_here"], PYTHONPATH=pythonpath) == [0]
    (second,) = servers(tmp_path)
    assert second != first  # the stale one ended: no job of its left, no requester alive


def test_another_environment_gets_another_server(tmp_path) -> None:
    client(tmp_path, [(0, 0)], OMP_NUM_THREADS="1")
    client(tmp_path, [(0, 0)], OMP_NUM_THREADS="2")
    assert len(servers(tmp_path)) == 2


def test_a_jobs_group_signal_reaches_it_and_a_dead_requester_takes_its_jobs(tmp_path) -> None:
    from matrixrl.jobs import forked

    env = {"XDG_RUNTIME_DIR": str(tmp_path / "run")}
    runner = client(tmp_path, [(0, 60), (0, 60)], wait=False)
    wait_until(lambda: len(children(tmp_path)) == 2)
    old = os.environ.get("XDG_RUNTIME_DIR")
    os.environ.update(env)
    try:
        assert forked.signal_jobs(os.getpgid(runner.pid), signal.SIGTERM) == 2
    finally:
        os.environ.pop("XDG_RUNTIME_DIR") if old is None else os.environ.update(XDG_RUNTIME_DIR=old)
    out, _ = runner.communicate(timeout=30)
    assert json.loads(out) == [-signal.SIGTERM, -signal.SIGTERM]

    runner = client(tmp_path, [(0, 60)], wait=False)
    wait_until(lambda: len(children(tmp_path)) == 1)
    os.killpg(runner.pid, signal.SIGKILL)
    runner.wait()
    wait_until(lambda: children(tmp_path) == [])  # its connection ended: the job killed itself


def children(tmp_path: Path) -> list[int]:
    """The live jobs of the servers of ``tmp_path``."""
    parents = set(servers(tmp_path))
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) in parents and fields[0] not in ("Z", "X"):
                found.append(int(entry.name))
    return found


def test_the_server_outlives_the_run_that_started_it_in_no_way_tied_to_it(tmp_path) -> None:
    client(tmp_path, [(0, 0)], MATRIXRL_RUN_PID="12345")
    (server,) = servers(tmp_path)
    environ = Path(f"/proc/{server}/environ").read_bytes()
    assert b"MATRIXRL_RUN_PID" not in environ
    assert os.readlink(f"/proc/{server}/cwd") == "/"
    assert os.getsid(server) == server  # a session of its own: no signal to a run's group reaches it


def test_a_batch_jobs_server_is_its_own_and_ends_with_it(tmp_path) -> None:
    # On a cluster node a job must not run its work in another allocation's server, nor leave one behind.
    assert client(tmp_path, [(0, 0)], linger=60) == [0]
    (outside,) = servers(tmp_path)
    in_job = client(tmp_path, [(0, 3)], linger=60, wait=False, SLURM_JOB_ID="41")
    wait_until(lambda: len(servers(tmp_path)) == 2)  # the job asked a server of its own
    out, _ = in_job.communicate(timeout=30)
    assert json.loads(out) == [0]
    wait_until(lambda: servers(tmp_path) == [outside])  # which ended with it, linger or not


def test_a_server_for_plugins_has_the_whole_environment_and_folder_of_its_run(tmp_path) -> None:
    # A plugin reads its own variables (and relative paths) as the server imports it: a
    # filtered environment made one that needs REVTASK_DATA fail, and one with a default
    # run every job under a value other than the run's.
    client(tmp_path, [(0, 0)], MATRIXRL_PLUGINS="toy", REVTASK_DATA="/a", MATRIXRL_RUN_PID="12345")
    (server,) = servers(tmp_path)
    environ = Path(f"/proc/{server}/environ").read_bytes().split(b"\0")
    assert b"REVTASK_DATA=/a" in environ and not any(v.startswith(b"MATRIXRL_RUN_PID=") for v in environ)
    assert os.readlink(f"/proc/{server}/cwd") == os.path.realpath(os.getcwd())
    client(tmp_path, [(0, 0)], MATRIXRL_PLUGINS="toy", REVTASK_DATA="/b")
    assert len(servers(tmp_path)) == 2  # another value of the plugin's variable: another server


def test_a_server_that_cannot_start_says_why_in_the_jobs_log(tmp_path, monkeypatch) -> None:
    from matrixrl.jobs import forked

    def fails(request, preload=None):
        raise forked.JobServerError("the job server did not start: Traceback | KeyError: 'REVTASK_DATA'")

    monkeypatch.setattr(forked, "run_in_server", fails)
    log = tmp_path / "train.log"
    with pytest.raises(forked.JobServerError):
        forked.run_job(["train", "{}"], "a-cell", str(log))
    assert log.read_text() == "the job server did not start: Traceback | KeyError: 'REVTASK_DATA'\n"
