"""Talking to Snakemake: the resolved config it reads, dry-runs for `plan`, runs for `run`.

Snakemake owns scheduling, resumption and retries. matrixrl hands it the resolved
config as a ``--configfile`` (``--config`` would turn nested values into strings)
and runs it as a CLI subprocess, the stable interface across releases. Dry-runs
use the Python API in a fresh subprocess: one process must not evaluate two DAGs
(the second answer comes back stale).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from matrixrl import atomic
from matrixrl import layout as L
from matrixrl.config import Config
from matrixrl.errors import ProfileError, SnakemakeError, disk_error_in_text

SNAKEFILE = Path(__file__).parent / "workflow" / "Snakefile"

RULES = (
    "prepare_base", "evaluate_base", "train", "copy_base_eval", "evaluate",
    "collect", "label", "distill", "bank", "evaluate_base_memory", "copy_base_memory_eval", "evaluate_memory",
    "retain", "analyse",
)
"""The Snakefile's job rules, in the order a plan lists them (the Snakefile checks it defines exactly these)."""
LOCAL_RULES = ("copy_base_eval", "bank", "copy_base_memory_eval", "retain", "analyse")
"""Rules that run on the submitting host, never through a cluster profile (analyse writes the
store; a copy of one small file, or a few deletions, are not worth a cluster job)."""


def write_configfile(config: Config, path: Path) -> Path:
    # What the file set, not the defaults: the Snakefile's validation then sees what the CLI's
    # saw (a default that follows another key stays a default), and so do extra axes' values.
    atomic.write_text(path, yaml.safe_dump(config.model_dump(mode="json", exclude_unset=True), sort_keys=False))
    return path


def job_environment() -> dict[str, str]:
    """The environment of Snakemake and its jobs.

    One code version per run: every Python of the run (Snakemake, the job server of
    jobs/forked.py and its jobs) imports the matrixrl this process runs, whatever
    the current folder holds. ``PYTHONSAFEPATH`` keeps the current folder (another
    checkout's ``matrixrl/``, say) off their paths; where this matrixrl is not the
    one they would find anyway (``python -m matrixrl`` in a checkout that is not
    installed), its folder goes first on ``PYTHONPATH``.
    """
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    env.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    env.setdefault("TQDM_DISABLE", "1")
    env["PYTHONSAFEPATH"] = "1"
    root = _code_root()
    if root is not None:
        env["PYTHONPATH"] = os.pathsep.join([root, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    return env


@functools.cache
def _code_root() -> str | None:
    """The folder that makes a child Python import this matrixrl, or None where it does without."""
    here = Path(__file__).resolve().parent  # the matrixrl package this module belongs to
    # A child with a safe path has this process's path less its first entry, the
    # folder of the script or the current folder (unless this one had a safe path too).
    path = [p for p in (sys.path if sys.flags.safe_path else sys.path[1:]) if p]
    found = None
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is None:
            continue
        try:
            spec = find_spec("matrixrl", path)
        except Exception:
            continue
        if spec is not None:
            found = spec.origin
            break
    if found and Path(found).resolve().parent == here:
        return None
    return str(here.parent)


# --- dry-run ----------------------------------------------------------------------------


RERUN_TRIGGERS = ("software-env",)
"""Snakemake's own rerun triggers, as ``matrixrl run`` passes them: none that can fire.

matrixrl.status decides what is stale from the digests the result files record, and
the run names those outputs with ``--forcerun``. Snakemake's ``mtime``, ``params``,
``input`` and ``code`` triggers would second-guess that (a touched file, a params
string that changed its spelling, an upgraded Snakefile would rerun finished work),
and ``--rerun-triggers`` needs one: ``software-env`` never fires without a conda or
container environment, which matrixrl's rules do not use.
"""


def pending_jobs(config: Config, workdir: Path, stale: list[str] = ()) -> list[dict]:
    """Jobs a run would execute now, by Snakemake's own dry-run: ``[{"rule": ..., "wildcards": {...}}]``.

    ``stale``: the outputs the run names with ``--forcerun`` (matrixrl.status). Planning
    does without this (matrixrl.status answers the same in a fraction of the time); the
    tests compare the two. ``workdir`` must exist; for a results directory that does not
    exist yet, pass an empty temporary folder (everything is pending).
    """
    with tempfile.TemporaryDirectory() as tmp:
        configfile = write_configfile(config, Path(tmp) / "config.yaml")
        proc = subprocess.run(
            [sys.executable, "-m", "matrixrl.snake", str(configfile), str(workdir), *stale],
            capture_output=True,
            text=True,
            env=job_environment(),
        )
    if proc.returncode != 0:
        lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
        reason = next((line for line in reversed(lines) if "Error" in line or "Exception" in line), lines[-1] if lines else "no output")
        if (disk_error := disk_error_in_text(reason)) is not None:
            raise disk_error  # Snakemake writes its metadata in the results folder even for a dry-run
        raise SnakemakeError(f"snakemake's dry-run of {workdir} failed ({reason}); run it by hand for details: snakemake -n --directory {workdir}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _dry_run_in_this_process(configfile: Path, workdir: Path, stale: list[str] = ()) -> list[dict]:
    from snakemake.api import SnakemakeApi
    from snakemake.logging import logger
    from snakemake.settings.enums import RerunTrigger
    from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, ResourceSettings
    from snakemake_interface_logger_plugins.common import LogEvent

    jobs: list[dict] = []

    class Collect(logging.Handler):
        def emit(self, record):
            if getattr(record, "event", None) == LogEvent.JOB_INFO:
                jobs.append({"rule": record.rule_name, "wildcards": dict(record.wildcards or {})})

    handler = Collect()
    # Default output settings: "quiet" would also filter the JOB_INFO events we collect.
    with SnakemakeApi(OutputSettings()) as api:
        logger.addHandler(handler)
        try:
            workflow = api.workflow(
                resource_settings=ResourceSettings(cores=1),
                config_settings=ConfigSettings(configfiles=[configfile]),
                snakefile=SNAKEFILE,
                workdir=workdir,
            )
            # As `matrixrl run` passes --rerun-incomplete: a killed job's outputs are pending, not an error.
            triggers = frozenset(RerunTrigger.parse_choice(name) for name in RERUN_TRIGGERS)
            dag = DAGSettings(force_incomplete=True, rerun_triggers=triggers, forcerun=frozenset(stale))
            workflow.dag(dag).execute_workflow(executor="local", pseudo_executor="dryrun")
        finally:
            logger.removeHandler(handler)
    return jobs


def _default_stop_signals() -> None:
    """In Snakemake's child before exec: SIGINT and SIGTERM act by default there, even when
    matrixrl was started with them ignored (``nohup``, ``cmd &`` in a script), because
    matrixrl stops Snakemake with them (a cluster run's SIGINT cancels its jobs)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)


def planned_jobs(config: Config) -> list[dict]:
    """Every job of the grid with its status (done or pending) and why it is pending
    (matrixrl.status: from the result files, no Snakemake DAG)."""
    from matrixrl.status import job_statuses

    return job_statuses(config)


# --- run ----------------------------------------------------------------------------------


@dataclass
class RunEvent:
    """What the run's progress display needs from Snakemake's log."""

    kind: str  # "start" | "finished" | "failed" | "progress" | "nothing" | "locked" | "line"
    rule: str | None = None
    wildcards: str = ""
    log: str = ""
    done: int = 0
    total: int = 0
    text: str = ""
    jobid: str = ""


_PROGRESS = re.compile(r"(\d+) of (\d+) steps \(\d+%\) done")
_BLOCK = re.compile(r"^(?:(?:local)?rule|Error in rule) (\w+):$")
_FIELD = re.compile(r"^\s+(\w+): (.*)$")
_FINISHED = re.compile(r"^Finished jobid: (\d+) \(Rule: (\w+)\)")


def snakemake_command(
    config: Config, configfile: Path, cores: int, extra: list[str], gpus: int | None = None, stale: list[str] = ()
) -> list[str]:
    """The Snakemake command line of a run. ``gpus``: the machine's GPU count for a local run;
    ``stale``: outputs to recompute although they exist (:data:`RERUN_TRIGGERS`).

    Locally ``--resources gpu=N`` is a semaphore over the jobs that declare a GPU, and
    an unset limit means unlimited, so a local run always passes the detected count
    (0 here: GPU jobs then run on CPU). Cluster runs (a profile) pass None: there the
    scheduler allocates GPUs, and a limit of 0 would strip their requests.
    """
    resources = ["--resources", f"gpu={gpus}"] if gpus is not None else []
    return [
        sys.executable,
        "-P",  # the current folder is not on Snakemake's path: a `matrixrl/` there cannot shadow this one
        "-m",
        "snakemake",
        "--snakefile",
        str(SNAKEFILE),
        "--directory",
        config.results_dir,
        "--configfile",
        str(configfile),
        "--cores",
        str(cores),
        # run: rules execute in this process: analyse itself, and the forks of train,
        # evaluate and prepare_base from the server that imported torch once (jobs/forked.py).
        "--force-use-threads",
        "--rerun-incomplete",
        "--rerun-triggers",
        *RERUN_TRIGGERS,
        "--printshellcmds",
        "--nocolor",
        *resources,
        *extra,
        *(["--forcerun", *stale] if stale else []),
    ]


class _LogParser:
    """Snakemake's log, line by line, as :class:`RunEvent` s; knows which jobs are running.

    Snakemake reports a job as a block: ``rule NAME:`` (or ``Error in rule NAME:``)
    followed by indented ``key: value`` lines. An error block names the job only by
    its jobid, so wildcards are remembered from the job's start block.
    """

    def __init__(self) -> None:
        self.running: dict[str, str] = {}
        """jobid → rule of each job started and not yet finished or failed (``all`` aside)."""
        self._wildcards_of: dict[str, str] = {}
        self._block: dict | None = None

    def feed(self, line: str) -> list[RunEvent]:
        events = []
        if self._block is not None:
            if field := _FIELD.match(line):
                self._block.setdefault(field.group(1), field.group(2).strip())
                return events
            events.append(self._close())
        if match := _BLOCK.match(line):
            self._block = {"rule": match.group(1), "error": line.startswith("Error")}
        elif match := _FINISHED.match(line):
            self.running.pop(match.group(1), None)
            events.append(RunEvent("finished", rule=match.group(2), jobid=match.group(1), text=line))
        elif match := _PROGRESS.search(line):
            events.append(RunEvent("progress", done=int(match.group(1)), total=int(match.group(2))))
        elif "Nothing to be done" in line:
            events.append(RunEvent("nothing", text=line))
        elif "cannot be locked" in line:
            events.append(RunEvent("locked", text=line))
        else:
            events.append(RunEvent("line", text=line))
        return events

    def close(self) -> list[RunEvent]:
        return [self._close()] if self._block is not None else []

    def _close(self) -> RunEvent:
        block, self._block = self._block, None
        jobid = block.get("jobid", "")
        wildcards = block.get("wildcards") or self._wildcards_of.get(jobid, "")
        if block["error"]:
            self.running.pop(jobid, None)
            return RunEvent("failed", rule=block["rule"], wildcards=wildcards, log=block.get("log", "").split(" (")[0], jobid=jobid)
        self._wildcards_of[jobid] = wildcards
        if block["rule"] != "all":
            self.running[jobid] = block["rule"]
        return RunEvent("start", rule=block["rule"], wildcards=wildcards, jobid=jobid)


class TimeLeft:
    """What a run's progress line says: the jobs running, and the time left, estimated
    from the jobs finished so far.

    Each job still to start is expected to take its rule's mean duration so far (the
    mean of every finished job, for a rule none of whose jobs has finished yet), each
    running one what is left of that mean, and ``cores`` of them run at once. No
    estimate before the first job has finished.
    """

    def __init__(self, pending: dict[str, int], cores: int) -> None:
        self.waiting = dict(pending)  # rule → jobs not started yet
        self.cores = max(1, cores)
        self.running: dict[str, tuple[str, float]] = {}  # jobid → (rule, start time)
        self.durations: dict[str, list[float]] = {}

    def started(self, jobid: str, rule: str, now: float) -> None:
        self.running[jobid] = (rule, now)
        if self.waiting.get(rule, 0) > 0:
            self.waiting[rule] -= 1

    def finished(self, jobid: str, now: float) -> None:
        if (job := self.running.pop(jobid, None)) is not None:
            self.durations.setdefault(job[0], []).append(now - job[1])

    def seconds_left(self, now: float) -> float | None:
        every = [d for durations in self.durations.values() for d in durations]
        if not every:
            return None
        overall = sum(every) / len(every)

        def mean(rule: str) -> float:
            durations = self.durations.get(rule)
            return sum(durations) / len(durations) if durations else overall

        work = sum(n * mean(rule) for rule, n in self.waiting.items())
        work += sum(max(mean(rule) - (now - began), 0.0) for rule, began in self.running.values())
        return work / self.cores

    def describe(self, now: float) -> str:
        counts: dict[str, int] = {}
        for rule, _ in self.running.values():
            counts[rule] = counts.get(rule, 0) + 1
        parts = [f"running: {', '.join(f'{rule} ×{n}' if n > 1 else rule for rule, n in counts.items())}"] if counts else []
        left = self.seconds_left(now)
        if left is not None and (counts or any(self.waiting.values())):
            parts.append(f"about {_duration(left)} left")
        return " · ".join(parts) or "jobs"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def run_with_events(command: list[str], log_path: Path, on_event: Callable[[RunEvent], None]) -> int:
    """Run Snakemake, tee its log to ``log_path``, pass each parsed event to ``on_event``; return its exit code.

    Snakemake runs in a session of its own, so that a signal to this process's group
    (Ctrl-C in a terminal, a SIGTERM to the job's group) reaches this process only;
    SIGINT, SIGTERM or SIGHUP then stop Snakemake and its jobs and raise
    :class:`RunStopped` (see :func:`stop_on_signals`). If this process dies
    without a word (kill -9), Snakemake stops itself (:func:`follow_run`). While it runs,
    the run is recorded under ``--directory`` (:func:`live_runs`).
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
_LOCAL_EXECUTORS = {"local", "dryrun", "touch"}


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
    """Within: SIGINT, SIGTERM and SIGHUP raise :class:`RunStopped`, after stopping Snakemake if it runs.

    Outside :func:`run_with_events` a signal raises at once. While Snakemake runs, the
    first signal stops it (:func:`_stop_group`: its jobs end, their checkpoints stay, it
    releases its lock, within :data:`GRACE_S` or it is killed), and
    :func:`run_with_events` raises once the whole process group is gone; a second
    signal kills the group without waiting. Handlers are installed only from the main
    thread (elsewhere the signals keep their handlers), and not for a signal this
    process was started ignoring (``nohup``); nested uses share one.
    """
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
        self.cluster = _cluster_profile(_option(command, "--profile"))
        record = None if "--unlock" in command else workdir / L.run_record(os.getpid())
        locks_before = _lock_files(workdir)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = job_environment()
        env[RUN_PID_ENV] = str(os.getpid())
        env[RUN_LOG_ENV] = str(log_path.resolve())
        parser = _LogParser()
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
    """Stop Snakemake, the leader of process group ``pgid``, and its jobs; kill the group after :data:`GRACE_S`.

    Locally the whole group gets SIGTERM, again every second (a job forked meanwhile
    too): the jobs die, their checkpoints stay, their rules fail, and Snakemake,
    which SIGTERM tells to start nothing more, exits and releases its lock. Under a
    cluster executor Snakemake gets SIGINT, once: it cancels its cluster jobs and
    exits. ``ended(timeout)`` waits up to ``timeout`` for Snakemake to end, true
    once it has; ``ready()`` says whether Snakemake may be sent SIGTERM yet.
    """
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
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _option(command: list[str], name: str) -> str | None:
    """The value of ``name VALUE`` in a command line, or None."""
    for i, arg in enumerate(command[:-1]):
        if arg == name:
            return command[i + 1]
    return None


def _cluster_profile(profile: str | None) -> bool:
    """Whether a profile sends jobs to a cluster executor (they are no processes of this machine)."""
    if profile is None:
        return False
    try:
        executor = profile_config(Path(profile)).get("executor", "local")
    except ProfileError:
        return False
    return str(executor) not in _LOCAL_EXECUTORS


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
    """The other `matrixrl run` s recorded under ``results_dir`` that are still going.

    Each run records itself in ``.matrixrl/runs/PID.json`` while its Snakemake runs: its
    pid and start time, and Snakemake's pid. A record whose process is gone (a run
    killed with -9) is stale: ignored, and removed.
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
    """Called by the Snakefile: stop this Snakemake and its jobs once the `matrixrl run` that started it is gone.

    A `matrixrl run` killed with -9 cannot stop Snakemake, which runs in a session of
    its own; so Snakemake watches its parent. Only the Snakemake process that
    `matrixrl run` started watches (its parent's pid is :data:`RUN_PID_ENV`), not the
    dry-runs, nor Snakemake's job processes on a cluster. Once the parent is gone,
    the log goes on in the run's log file, and the run stops as on a signal
    (:func:`_stop_group`): its jobs end, Snakemake releases its lock and exits.
    """
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


if __name__ == "__main__":
    # python -m matrixrl.snake CONFIGFILE WORKDIR [STALE...] → JSON list of pending jobs on stdout
    print(json.dumps(_dry_run_in_this_process(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:])))


# --- profiles ---------------------------------------------------------------------------


def profile_config(profile: Path) -> dict:
    """A Snakemake profile's config.yaml, read for `plan` (Snakemake itself reads it for `run`)."""
    path = profile / "config.yaml"
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ProfileError(f"--profile {profile}: no config.yaml in it; see profiles/slurm/ for an example")
    except UnicodeDecodeError as exc:
        raise ProfileError(f"{path}: not UTF-8 text (byte {exc.start}); save it as UTF-8")
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: not valid YAML ({getattr(exc, 'problem', exc)}); fix its syntax")
    if not isinstance(raw, dict):
        raise ProfileError(f"{path}: expected a mapping of Snakemake options")
    return raw


def _as_mapping(value, where: str) -> dict:
    """Profile resources come as a mapping or as a list of ``key=value`` strings."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list):
        pairs = {}
        for item in value:
            key, sep, val = str(item).partition("=")
            if not sep:
                raise ProfileError(f"{where}: {item!r} is not key=value")
            pairs[key.strip()] = yaml.safe_load(val)
        return pairs
    raise ProfileError(f"{where}: expected a mapping or a list of key=value")


def rule_resources(profile: Path, rules: list[str]) -> dict[str, dict]:
    """Resources each rule will request under ``profile`` (defaults, then per-rule settings)."""
    raw = profile_config(profile)
    path = profile / "config.yaml"
    defaults = _as_mapping(raw.get("default-resources"), f"{path}: default-resources")
    per_rule = raw.get("set-resources") or {}
    if isinstance(per_rule, list):  # ["train:mem_mb=4000", ...]
        grouped: dict[str, dict] = {}
        for item in per_rule:
            rule, _, pair = str(item).partition(":")
            grouped.setdefault(rule, {}).update(_as_mapping([pair], f"{path}: set-resources"))
        per_rule = grouped
    threads = raw.get("set-threads") or {}
    local = set(LOCAL_RULES)
    table = {}
    for rule in rules:
        if rule in local:
            table[rule] = {"host": "local"}
            continue
        resources = {**defaults, **_as_mapping(per_rule.get(rule), f"{path}: set-resources.{rule}")}
        if rule in threads:
            resources["threads"] = threads[rule]
        table[rule] = resources
    return table
