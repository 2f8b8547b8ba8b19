"""Snakemake's process under `matrixrl run`: stopped on a signal, recorded while it runs, ended with its run.

What a user sees when a run is stopped, and the locks: docs/faults.md, "Stopping a run".
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from matrixrl import atomic
from matrixrl import layout as L
from matrixrl.snake.command import job_environment
from matrixrl.snake.events import RunEvent, LogParser
from matrixrl.snake.profiles import is_cluster_profile

def _default_stop_signals() -> None:
    """In Snakemake's child before exec: SIGINT and SIGTERM act by default there, even when
    matrixrl was started with them ignored (``nohup``, ``cmd &`` in a script), because
    matrixrl stops Snakemake with them (a cluster run's SIGINT cancels its jobs)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)



def run_with_events(command: list[str], log_path: Path, on_event: Callable[[RunEvent], None]) -> int:
    """Run Snakemake, tee its log to ``log_path``, pass each parsed event to ``on_event``; return its exit code.

    A signal stops Snakemake (in a session of its own) and raises :class:`RunStopped`.
    """
    with stop_on_signals() as guard:
        return guard.run(command, log_path, on_event)


# --- stopping a run -----------------------------------------------------------------------

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
GRACE_S = 20.0
"""How long a stopped Snakemake may take to end its jobs and release its lock before it is killed."""
RUN_PID_ENV = "MATRIXRL_RUN_PID"
"""Set for the Snakemake of a `matrixrl run`: the pid of that run, whose death stops Snakemake (:func:`follow_run`)."""
RUN_LOG_ENV = "MATRIXRL_RUN_LOG"
"""Set with :data:`RUN_PID_ENV`: the run's copy of Snakemake's log, where Snakemake writes once the run is gone."""


class RunStopped(Exception):
    """`matrixrl run` was stopped by a signal; Snakemake, its jobs and its lock are gone."""

    def __init__(self, signum: int, seconds: float, running: int):
        self.signum, self.seconds, self.running = signum, seconds, running
        super().__init__(self.message)

    @property
    def exit_code(self) -> int:
        """The shell's convention for a process ended by signal N: 128 + N (130 for SIGINT)."""
        return 128 + self.signum

    @property
    def message(self) -> str:
        name = signal.Signals(self.signum).name
        head = f"Stopped by {name} after {self.seconds:.0f} s: "
        if self.running == 0:
            return head + "no job was running; matrixrl run runs the pending jobs."
        if self.running == 1:
            return head + "1 job was running; its cell resumes from its last checkpoint with matrixrl run."
        return head + f"{self.running} jobs were running; their cells resume from their last checkpoints with matrixrl run."


_ACTIVE: _Guard | None = None


@contextmanager
def stop_on_signals() -> Iterator[_Guard]:
    """Within: SIGINT, SIGTERM and SIGHUP raise :class:`RunStopped`, after stopping Snakemake if it runs."""
    global _ACTIVE
    if _ACTIVE is not None:
        yield _ACTIVE
        return
    guard = _Guard()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in STOP_SIGNALS:
            if signal.getsignal(signum) != signal.SIG_IGN:  # under nohup, or `&` in a script: ignored it stays
                previous[signum] = signal.signal(signum, guard.on_signal)
    _ACTIVE = guard
    try:
        yield guard
    finally:
        _ACTIVE = None
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class _Guard:
    """One run's Snakemake process and what a signal does to it."""

    def __init__(self) -> None:
        self.began = time.monotonic()
        self.stopped: RunStopped | None = None
        self.deferred = False  # within run(): a signal is acted on there, not raised where it lands
        self.snakemake: subprocess.Popen | None = None
        self.cluster = False
        self.running: dict[str, str] = {}
        self.exited = threading.Event()  # Snakemake ended and what was left of its group is killed
        self._stopper: threading.Thread | None = None

    def on_signal(self, signum: int, frame) -> None:
        if self.stopped is not None:  # a second signal: no more grace
            if self.snakemake is not None and not self.exited.is_set():
                _killpg(self.snakemake.pid, signal.SIGKILL)
            return
        self.stopped = RunStopped(signum, time.monotonic() - self.began, len(self.running))
        if not self.deferred:
            raise self.stopped
        if self.snakemake is not None:
            self._stop_snakemake()

    def _stop_snakemake(self) -> None:
        if self._stopper is None:
            pgid = self.snakemake.pid  # the leader of its own session
            self._stopper = threading.Thread(
                target=_stop_group, args=(pgid, self.cluster, self.exited.wait), name="matrixrl-stop", daemon=True
            )
            self._stopper.start()

    def run(self, command: list[str], log_path: Path, on_event: Callable[[RunEvent], None]) -> int:
        workdir = Path(_option(command, "--directory") or ".")
        self.cluster = is_cluster_profile(_option(command, "--profile"))
        record = None if "--unlock" in command else workdir / L.run_record(os.getpid())
        locks_before = _lock_files(workdir)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = job_environment()
        env[RUN_PID_ENV] = str(os.getpid())
        env[RUN_LOG_ENV] = str(log_path.resolve())
        parser = LogParser()
        self.running = parser.running
        self.deferred = True
        proc = None
        try:
            if self.stopped is not None:  # came while this was being set up
                raise self.stopped
            proc = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, env=env, start_new_session=True, preexec_fn=_default_stop_signals,
            )  # fmt: skip
            self.snakemake = proc
            threading.Thread(target=self._reap, args=(proc,), name="matrixrl-reap", daemon=True).start()
            if self.stopped is not None:
                self._stop_snakemake()
            if record is not None:
                _write_record(record, proc.pid)
            with log_path.open("w") as log:
                assert proc.stdout is not None
                for line in proc.stdout:  # to the end: after Snakemake, the rest of its group is killed
                    log.write(line)
                    log.flush()
                    for event in parser.feed(line.rstrip("\n")):
                        on_event(event)
                for event in parser.close():
                    on_event(event)
            code = proc.wait()
        finally:
            if proc is not None:
                if proc.poll() is None:  # on_event raised: no run without its reader
                    _stop_group(proc.pid, self.cluster, self.exited.wait)
                self.exited.wait()
                proc.wait()
                if proc.returncode < 0 and not live_runs(workdir):
                    _remove_new_locks(workdir, locks_before)  # killed: it could not release its lock
            if record is not None:
                record.unlink(missing_ok=True)
            self.deferred = False
            self.snakemake = None
        if self.stopped is not None:
            raise self.stopped
        return code

    def _reap(self, proc: subprocess.Popen) -> None:
        """Once Snakemake has ended, kill whatever is left of its group (e.g. a job forked while it was stopping).

        Waits without reaping: while Snakemake is a zombie its pid, the group's id, cannot be reused.
        """
        try:
            if hasattr(os, "waitid"):
                os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
            else:  # pragma: no cover - platforms without waitid
                proc.wait()
        except ChildProcessError:
            pass
        finally:
            _killpg(proc.pid, signal.SIGKILL)
            self.exited.set()


def _stop_group(
    pgid: int,
    cluster: bool,
    ended: Callable[[float], bool],
    ready: Callable[[], bool] = lambda: True,
    before_kill: Callable[[], None] | None = None,
) -> None:
    """Stop Snakemake, the leader of process group ``pgid``, and its jobs; kill the group after :data:`GRACE_S`."""
    deadline = time.monotonic() + GRACE_S
    if cluster:
        _kill(pgid, signal.SIGINT)
    while True:
        if not cluster and ready():
            _killpg(pgid, signal.SIGTERM)
        if ended(max(0.0, min(1.0, deadline - time.monotonic()))):
            return
        if time.monotonic() >= deadline:
            break
    if before_kill is not None:
        before_kill()
    _killpg(pgid, signal.SIGKILL)


def _kill(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _killpg(pgid: int, signum: int) -> None:
    """Signal Snakemake's process group and the jobs it asked the job server for, which are
    the server's children, not in the group (matrixrl/jobs/forked.py)."""
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass
    from matrixrl.jobs.forked import signal_jobs

    signal_jobs(pgid, signum)


def _option(command: list[str], name: str) -> str | None:
    """The value of ``name VALUE`` in a command line, or None."""
    for i, arg in enumerate(command[:-1]):
        if arg == name:
            return command[i + 1]
    return None




def _lock_files(workdir: Path) -> set[Path]:
    return set((workdir / L.SNAKEMAKE_LOCKS).glob("*.lock"))


def _remove_new_locks(workdir: Path, before: set[Path]) -> None:
    """Release the lock a killed Snakemake left: the lock files that appeared since it started."""
    for path in _lock_files(workdir) - before:
        path.unlink(missing_ok=True)


# --- which runs are alive -----------------------------------------------------------------


def _process_start(pid: int) -> tuple[str, int] | None:
    """A process's state and start time (clock ticks after boot) from ``/proc``, or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0], int(fields[19])


def _write_record(path: Path, snakemake_pid: int) -> None:
    me = _process_start(os.getpid())
    sm = _process_start(snakemake_pid)
    record = {
        "pid": os.getpid(),
        "started": me[1] if me else None,
        "snakemake": snakemake_pid,  # also the id of its process group
        "snakemake_started": sm[1] if sm else None,
        "argv": sys.argv,
    }
    atomic.write_text(path, json.dumps(record, indent=1))


def _alive(record: dict) -> bool:
    """Whether the process a record names is that same process, still running."""
    pid = record.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    state = _process_start(pid)
    if state is None:
        if Path("/proc/self").exists():
            return False
        try:  # no /proc: the pid's existence is all there is to know
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    if state[0] in ("Z", "X"):
        return False
    if record.get("started") is not None:
        return state[1] == record["started"]  # not another process that got the pid since
    try:
        return b"matrixrl" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def live_runs(results_dir: str | Path) -> list[dict]:
    """The other `matrixrl run` s recorded under ``results_dir`` (``.matrixrl/runs/PID.json``)
    that are still going; a record whose process is gone is removed.
    """
    runs = []
    for path in sorted((Path(results_dir) / L.RUNS_DIR).glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict) or record.get("pid") == os.getpid():
            continue
        if _alive(record):
            runs.append(record)
        else:
            path.unlink(missing_ok=True)
    return runs


# --- in Snakemake's process ---------------------------------------------------------------

_FOLLOWING = False


def follow_run(workflow) -> None:
    """Called by the Snakefile: stop this Snakemake and its jobs once the `matrixrl run` that started it is gone."""
    global _FOLLOWING
    try:
        parent = int(os.environ.get(RUN_PID_ENV, ""))
    except ValueError:
        return
    if _FOLLOWING or os.getppid() != parent:
        return
    _FOLLOWING = True

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        _output_to(os.environ.get(RUN_LOG_ENV) or os.devnull)
        print(f"matrixrl: `matrixrl run` (pid {parent}) is gone; stopping its jobs", flush=True)
        cluster = bool(getattr(workflow, "non_local_exec", False))

        def ready() -> bool:  # SIGTERM kills Snakemake until its scheduler handles it (as "stop scheduling")
            return signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)

        def unlock() -> None:
            try:
                workflow.persistence.unlock()
            except Exception:
                pass

        _stop_group(os.getpgid(0), cluster, ended=lambda timeout: time.sleep(timeout) or False, ready=ready, before_kill=unlock)

    threading.Thread(target=watch, name="matrixrl-follow-run", daemon=True).start()


def _output_to(path: str) -> None:
    """Send this process's stdout and stderr (a pipe nobody reads any more) to ``path``."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError:
        fd = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)

