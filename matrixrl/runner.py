"""Running a grid's pending jobs through Snakemake: what ``matrixrl run`` and ``Study.run()`` do."""

from __future__ import annotations

import errno
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from matrixrl import layout as L
from matrixrl.config import Config
from matrixrl.errors import ConfigError, UserError, disk_error_message, os_error_reason
from matrixrl.snake.events import RunEvent, TimeLeft


class RunLockedError(UserError):
    """The results folder is locked by another run (alive, or killed and never unlocked)."""

    exit_code = 1


@dataclass
class Failure:
    """A job that failed: its rule and wildcards, what its log says went wrong, the log."""

    rule: str
    wildcards: str
    cause: str | None
    log: Path | None


@dataclass
class RunOutcome:
    """How a run ended. ``code``: Snakemake's exit status; ``nothing``: every job was done."""

    code: int
    seconds: float
    log_path: Path
    failures: list[Failure] = field(default_factory=list)
    nothing: bool = False

    @property
    def ok(self) -> bool:
        return self.code == 0


class RunProgress:
    """A run as its progress line shows it: the grid's pending jobs done so far (as plan
    counts them), the jobs running, and the time left (:class:`TimeLeft`)."""

    def __init__(self, pending: dict[str, int], cores: int):
        self.total = sum(pending.values())
        self.done = 0
        self.clock = TimeLeft(pending, cores)

    def update(self, event: RunEvent, now: float) -> None:
        if event.kind == "start" and event.rule != "all":
            self.clock.started(event.jobid, event.rule, now)
        elif event.kind in ("finished", "failed"):
            self.clock.finished(event.jobid, now)
            if event.kind == "finished" and event.rule != "all":
                self.done += 1
                self.total = max(self.total, self.done)

    def describe(self, now: float) -> str:
        return self.clock.describe(now)


def locked_by(results: Path, runs: list[dict]) -> str:
    """The error of a results folder whose lock a live `matrixrl run` holds (``runs``: live_runs)."""
    pids = [str(r["pid"]) for r in runs]
    which = f"pid {pids[0]}" if len(pids) == 1 else f"pids {', '.join(pids)}"
    it = "it" if len(pids) == 1 else "them"
    return f"{results} is locked by a run that is still going ({which}); stop {it} (kill {' '.join(pids)}) or wait for {it}, then run again"


NO_FLOCK = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)
"""What ``flock`` raises on a file system that does not support it: the run goes on without :class:`FolderLock`."""


class FolderLock:
    """This process's hold on a results folder (``flock`` on :data:`layout.RUN_LOCK_FILE`), from
    its first look at the folder to the end of its Snakemake, so that a second run cannot redo
    the jobs a finishing one just did (docs/faults.md, "Locks"). Taken before the folder is
    read, where it exists, and at the latest before it is written (:meth:`take` again once
    made); the kernel drops it with the process, and it is not inherited.
    """

    def __init__(self, results: Path):
        self.results = results
        self._fd: int | None = None

    def take(self) -> None:
        """Hold the lock, if the folder exists (a no-op once held); RunLockedError if another run holds it."""
        import fcntl
        import os

        path = self.results / L.RUN_LOCK_FILE
        if self._fd is not None or not self.results.is_dir():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip()
            os.close(fd)
            raise RunLockedError(self._held_by(holder)) from None
        except OSError as exc:
            os.close(fd)
            if exc.errno in NO_FLOCK:  # a file system without flock (Lustre mounted without it): Snakemake's lock alone
                return
            raise
        self._fd = fd  # held from here: release() drops it, also when the pid below cannot be written
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())

    def _held_by(self, holder: str) -> str:
        from matrixrl.snake.process import live_runs

        if going := live_runs(self.results):
            return locked_by(self.results, going)
        which = f" (pid {holder})" if holder.isdigit() else ""
        return f"{self.results} is in use by another matrixrl run{which} that is starting or ending; wait for it, then run again"

    def release(self) -> None:
        import os

        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __enter__(self) -> FolderLock:
        try:
            self.take()
        except BaseException:
            self.release()  # a with statement does not exit what did not enter
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def run_grid(
    config: Config,
    *,
    cores: int,
    keep_going: bool = False,
    profile: Path | None = None,
    on_event: Callable[[RunEvent, RunProgress], None] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> RunOutcome:
    """Run ``config``'s pending jobs; ``on_event`` sees every event of Snakemake's log with the
    run's progress, ``on_note`` what the run says before it starts (a cell that retrains to
    rebuild deleted checkpoints). Raises :class:`RunLockedError` when another run holds the
    results folder, a :class:`matrixrl.snake.process.RunStopped` on a signal."""
    from matrixrl.snake.profiles import check_executor, check_profile

    extra = ["--keep-going"] if keep_going else []
    if profile is not None:
        extra += ["--profile", str(check_profile(profile).resolve())]
        check_executor(Path(profile))
    results = Path(config.results_dir)
    with FolderLock(results) as lock:
        return _run_locked(config, lock, cores, extra, profile, on_event, on_note)


def _run_locked(config: Config, lock: FolderLock, cores: int, extra: list[str], profile, on_event, on_note) -> RunOutcome:
    from matrixrl.dag import Graph
    from matrixrl.gpu_memory.budget import gpu_budget
    from matrixrl.gpu_memory.fits import check_fits
    from matrixrl.models.devices import gpu_count
    from matrixrl.snake.command import snakemake_command
    from matrixrl.status import job_statuses, stale_outputs

    results = Path(config.results_dir)
    # What is stale is matrixrl's to say, as `plan` said it (matrixrl.status); locally, Snakemake's
    # gpu resource is bounded by this machine's GPUs; under a profile the cluster decides.
    graph = Graph(config)
    statuses = job_statuses(config, graph.jobs)
    check_fits(config, gpu_budget(profile), statuses)  # a job its GPU cannot hold: refused before anything runs
    configfile = _prepare(config, lock)
    for job in statuses:
        if job["reason"] == "rebuild" and on_note is not None:
            on_note(
                f"note: {job['output']} reruns: evaluations of checkpoints that train.keep_checkpoints deleted "
                "must be recomputed, so the cell retrains to rebuild them"
            )
    command = snakemake_command(
        config, configfile, cores, extra, gpus=None if profile else gpu_count(), stale=stale_outputs(statuses)
    )
    pending: dict[str, int] = {}
    for job in statuses:
        if job["status"] == "pending":
            pending[job["rule"]] = pending.get(job["rule"], 0) + 1
    progress = RunProgress(pending, cores)
    failed: list[RunEvent] = []
    seen = {"nothing": False, "locked": False}

    def follow(event: RunEvent) -> None:
        progress.update(event, time.perf_counter())
        if event.kind == "failed":
            failed.append(event)
        elif event.kind in seen:
            seen[event.kind] = True
        if on_event is not None:
            on_event(event, progress)

    outcome = _snakemake(command, results, follow)
    if seen["locked"]:
        _raise_locked(results)
    outcome.nothing = seen["nothing"]
    if not outcome.ok:
        outcome.failures = [_failure(results, event) for event in failed]
    elif not outcome.nothing and profile is None:
        _record_overhead(config, graph.jobs, statuses, cores, outcome.seconds)
    return outcome


def _record_overhead(config: Config, jobs, before: list[dict], cores: int, seconds: float) -> None:
    """Write what the run took beyond its jobs (its wall time less theirs, scheduled on its
    cores as matrixrl.planning.makespan does): the next plan's estimate adds it."""
    import json

    from matrixrl import atomic
    from matrixrl.planning import makespan
    from matrixrl.status import job_statuses

    costs: dict[str, dict] = {}
    job_statuses(config, jobs, costs)
    ran = [job for job, row in zip(jobs, before) if row["status"] == "pending"]
    durations = {job.output: float(costs[job.output]["seconds"]) for job in ran if job.output in costs}
    span = makespan(ran, durations, cores)
    record = {"seconds": seconds, "makespan": span, "overhead": max(0.0, seconds - span), "cores": cores, "jobs": len(ran)}
    atomic.write_text(Path(config.results_dir) / L.LAST_RUN_FILE, json.dumps(record, indent=1))


def unlock(config: Config) -> RunOutcome:
    """Remove the lock a killed run left on ``config``'s results folder (refused while that run lives)."""
    from matrixrl.snake.command import snakemake_command
    from matrixrl.snake.process import live_runs

    results = Path(config.results_dir)
    if going := live_runs(results):  # its lock is not stale: leave it, and its config
        raise RunLockedError(locked_by(results, going))
    with FolderLock(results) as lock:
        configfile = _prepare(config, lock)
        outcome = _snakemake(snakemake_command(config, configfile, 1, ["--unlock"]), results, lambda event: None)
    if not outcome.ok:
        raise RunLockedError(f"snakemake --unlock failed; see {outcome.log_path}")
    return outcome


def _prepare(config: Config, lock: FolderLock) -> Path:
    """The results folder ready for Snakemake (its store repaired, if damaged), and held by ``lock``;
    the configfile it reads."""
    from matrixrl.snake.command import write_configfile

    results = Path(config.results_dir)
    try:
        results.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if disk_error_message(exc) is not None:
            raise  # a full disk or a permission problem: the CLI names the path and results_dir in its fix
        # Any other (a folder that takes no new folders, such as /proc): the setting to change.
        raise ConfigError(
            f"results_dir: cannot create {results}: {os_error_reason(exc)}; "
            "point results_dir at a folder this user can write (--set results_dir=PATH)"
        ) from None
    lock.take()  # a folder this run made: held before the first write
    if L.store_path(results).exists():
        from matrixrl.store import engine_at

        engine_at(L.store_path(results)).dispose()  # a damaged store is set aside and rebuilt now, with a note
    return write_configfile(config, results / L.CONFIG_FILE)


def _snakemake(command: list[str], results: Path, on_event: Callable[[RunEvent], None]) -> RunOutcome:
    from matrixrl.snake.process import run_with_events

    log_path = results / L.SNAKEMAKE_LOGS / f"{time.strftime('%Y%m%d-%H%M%S')}.log"
    began = time.perf_counter()
    code = run_with_events(command, log_path, on_event)
    return RunOutcome(code=code, seconds=time.perf_counter() - began, log_path=log_path)


def _raise_locked(results: Path) -> None:
    from matrixrl.snake.process import live_runs

    if going := live_runs(results):
        raise RunLockedError(locked_by(results, going))
    raise RunLockedError(
        f"{results} is locked by another run. If none is running (a run was killed), "
        "run `matrixrl run --unlock` and try again."
    )


def _failure(results: Path, event: RunEvent) -> Failure:
    from matrixrl.jobs.logfile import failure_cause

    # Under a cluster profile Snakemake lists the job's own log, then the scheduler's.
    log = results / event.log.split(", ")[0] if event.log else None
    return Failure(event.rule or "", event.wildcards, failure_cause(log) if log else None, results / event.log if event.log else None)
