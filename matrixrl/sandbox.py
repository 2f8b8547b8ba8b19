"""Run an untrusted Python program against its tests, walled in by the kernel.

The walls, the reasons and what each rests on: docs/sandbox.md.
"""

from __future__ import annotations

import atexit
import functools
import json
import marshal
import math
import os
import queue
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

CHILD_SCRIPT = Path(__file__).with_name("_sandbox_child.py")
WORKER_SCRIPT = Path(__file__).with_name("_sandbox_worker.py")
CACHE_SIZE = 8192
VIEW_PYTHON, SCRATCH = "/usr/bin/python3", "/tmp"  # the interpreter and the scratch, as the view names them
SCRATCH_MB, SCRATCH_FILES = 64, 64  # the scratch's size and its files and folders, enforced by the kernel
MIN_MEMORY_MB = 16  # below this not even a trivial program imports `re` (measured)
REASONS = ("passed", "failed", "syntax", "timeout", "memory", "exited", "blocked", "crashed")
_CHILD_FAILURES = frozenset({"failed", "memory", "exited", "blocked"})
_SANDBOX_UID_BASE, _SANDBOX_UID_SPAN = 1 << 30, 1 << 20
_ENVIRONMENT = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
_WORKER_START_S = 30.0  # as long as the isolation probe waits for an interpreter
# A worker kills its program at the deadline itself; past this much more it is stuck.
_WORKER_GRACE_S = 5.0
_IDLE_WORKERS = max(2, os.cpu_count() or 1)  # kept per isolation; more are ended when idle
# Tests switch this off to show what the kernel layers hold on their own.
_audit_guard = True


@dataclass(frozen=True)
class Verdict:
    """Verdict of one sandboxed run: ``reason`` is one of :data:`REASONS`."""

    passed: bool
    reason: str
    detail: str = ""
    seconds: float = 0.0


def run(
    code: str, tests: str, *, timeout_s: float, memory_mb: int, entry_point: str | None = None
) -> Verdict:
    """Run ``code`` then ``tests`` in a fresh sandbox (or answer from the cache); returns a :class:`Verdict`.

    With ``entry_point`` the answer runs in a process of its own; the reasons: docs/sandbox.md.
    """
    _check_limits(timeout_s, memory_mb)
    return _run_cached(code, tests, float(timeout_s), int(memory_mb), entry_point)


def run_many(
    jobs: Sequence[tuple[str, str] | tuple[str, str, str | None]],
    *, timeout_s: float, memory_mb: int, workers: int,
) -> list[Verdict]:
    """``run`` for each ``(code, tests)`` or ``(code, tests, entry_point)``, up to
    ``workers`` at once; results in input order."""
    _check_limits(timeout_s, memory_mb)
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    keys = [(job[0], job[1], job[2] if len(job) > 2 else None) for job in jobs]
    unique = list(dict.fromkeys(keys))
    if not unique:
        return []
    with ThreadPoolExecutor(max_workers=min(workers, len(unique))) as pool:
        verdicts = pool.map(
            lambda job: run(job[0], job[1], timeout_s=timeout_s, memory_mb=memory_mb, entry_point=job[2]),
            unique,
        )
        by_job = dict(zip(unique, verdicts))
    return [by_job[key] for key in keys]


def clear_cache() -> None:
    """Forget cached verdicts."""
    _run_cached.cache_clear()


def cache_info():
    """Hits, misses and size of the verdict cache (``functools.lru_cache`` statistics)."""
    return _run_cached.cache_info()


def _check_limits(timeout_s: float, memory_mb: int) -> None:
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    if memory_mb < MIN_MEMORY_MB:
        raise ValueError(f"memory_mb must be at least {MIN_MEMORY_MB}, got {memory_mb}")


@functools.lru_cache(maxsize=CACHE_SIZE)
def _run_cached(code: str, tests: str, timeout_s: float, memory_mb: int, entry_point: str | None) -> Verdict:
    compiled = []
    for label, source in (("program", code), ("tests", tests)):
        try:
            # optimize=0 whatever this interpreter's -O: optimized, the tests' asserts vanish.
            compiled.append(compile(source, f"<{label}>", "exec", dont_inherit=True, optimize=0))
        except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError) as error:
            where = f" line {error.lineno}" if getattr(error, "lineno", None) else ""
            message = getattr(error, "msg", None) or str(error) or type(error).__name__
            return Verdict(False, "syntax", f"{label}{where}: {message}"[:300], 0.0)
    return _execute(*compiled, timeout_s, memory_mb, entry_point)


@functools.cache
def isolation() -> tuple[str, tuple[str, ...]]:
    """The strongest isolation this machine allows (``view`` first, ``none`` last): its name and the launcher prefix."""
    unshare, setpriv = shutil.which("unshare"), shutil.which("setpriv")
    root = os.geteuid() == 0
    namespaces = (unshare,) + (() if root else ("--user", "--map-root-user")) + ("--net", "--pid", "--fork", "--kill-child")
    view = namespaces[:-3] + ("--mount",) + namespaces[-3:]
    # No new privileges: a program past the hook that execs a setuid binary gains nothing.
    drop = (setpriv, "--reuid={uid}", "--regid={uid}", "--clear-groups", "--no-new-privs")
    read_any = ("--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search")
    # The child must be this very interpreter (an unprivileged uid that cannot read
    # its libpython silently gets the system's one, another patch release) and must
    # be able to write in its directory by absolute path (TMPDIR may be private).
    identity = (
        "import os, sys; open(os.path.join(os.getcwd(), 'probe'), 'w').close(); "
        "print(sys.version, sys.base_prefix, sys.platlibdir)"
    )
    expected = f"{sys.version} {sys.base_prefix} {sys.platlibdir}\n".encode()
    probe_dir = tempfile.mkdtemp(prefix="matrixrl-sandbox-")
    try:
        candidates = []
        # Each form first with a parent-death signal, so a program dies with the
        # job that started it even when the job is SIGKILLed: the first setpriv
        # sets it, unshare's --kill-child passes it on, and the uid drop (which
        # clears it) sets it again. A setpriv without --pdeathsig gets the plain form.
        for dies in (("--pdeathsig=KILL",), ()):
            dying = (setpriv,) + dies if dies else ()
            candidates.append(("view", dying + view))
        for dies in (("--pdeathsig=KILL",), ()):
            dying = (setpriv,) + dies if dies else ()
            if root and _chown(probe_dir, _SANDBOX_UID_BASE):
                candidates += [
                    ("namespaces+uid", dying + namespaces + drop + dies),
                    ("namespaces+uid", dying + namespaces + drop + dies + read_any),
                    ("uid", drop + dies), ("uid", drop + dies + read_any),
                ]
            candidates += [("namespaces", dying + namespaces)]
        candidates += [("none", ())]
        for name, prefix in candidates:
            if None in prefix:
                continue  # util-linux tool missing
            if name == "view":
                spec = _view_spec(_SANDBOX_UID_BASE if root else None, probe=True)
                if spec is None:
                    continue
                argv = [*prefix, sys.executable, "-I", "-S", "-B", str(WORKER_SCRIPT), json.dumps(spec)]
                wanted = f"{sys.version} {VIEW_PYTHON} {_SANDBOX_UID_BASE if root else 0}\n".encode()
            else:
                argv = _fill_uid(prefix, _SANDBOX_UID_BASE) + [sys.executable, "-I", "-S", "-c", identity]
                wanted = expected
            try:
                started = subprocess.run(argv, capture_output=True, timeout=30, cwd=probe_dir, env=_ENVIRONMENT)
            except (OSError, subprocess.TimeoutExpired):
                continue
            if started.returncode == 0 and started.stdout == wanted:
                return name, prefix
    finally:
        _remove_tree(probe_dir)
    return "none", ()


@functools.cache
def _libraries() -> tuple[str, tuple[str, ...]] | None:
    """The dynamic loader and every shared library the interpreter and the standard
    library's extension modules load (``ldd``); None where ldd does not tell."""
    files = [os.path.realpath(sys.executable)] + sorted(str(p) for p in Path(_dynload()).glob("*.so"))
    try:
        listed = subprocess.run(["ldd", *files], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    loader, libraries = None, set()
    for line in listed.splitlines():
        words = line.split()
        if "=>" in words and len(words) > words.index("=>") + 1 and words[words.index("=>") + 1].startswith("/"):
            libraries.add(words[words.index("=>") + 1])
        elif words and words[0].startswith("/") and not words[0].endswith(":"):
            loader = words[0]
            libraries.add(loader)
    return (loader, tuple(sorted(libraries))) if loader else None


def _dynload() -> str:
    """The standard library's extension modules' folder, that of the base installation: in a
    virtualenv ``platstdlib`` names the environment, which holds none."""
    base = {"platbase": sys.base_exec_prefix, "installed_platbase": sys.base_exec_prefix}
    return os.path.join(sysconfig.get_path("platstdlib", vars=base), "lib-dynload")


def _view_spec(uid: int | None, probe: bool = False) -> dict | None:
    """What a worker builds its view from (``_sandbox_worker.build_view``); None without ldd."""
    found = _libraries()
    if found is None:
        return None
    return {
        "view": True, "uid": uid, "probe": probe, "python": os.path.realpath(sys.executable),
        "stdlib": sysconfig.get_path("stdlib"), "platlibdir": sys.platlibdir,
        "dynload": _dynload(),
        "loader": found[0], "libraries": found[1], "scratch_mb": SCRATCH_MB, "scratch_files": SCRATCH_FILES,
    }


def _chown(path: str, uid: int) -> bool:
    """Hand ``path`` to ``uid``; False where that is impossible (root-squashed NFS)."""
    try:
        os.chown(path, uid, uid)
        return True
    except OSError:
        return False


def _fill_uid(prefix: Sequence[str], uid: int) -> list[str]:
    return [part.replace("{uid}", str(uid)) for part in prefix]


def _execute(program, tests, timeout_s: float, memory_mb: int, entry_point: str | None = None) -> Verdict:
    """Run in one of this process's workers (once more where one dies); ``crashed`` where none can start."""
    started = time.perf_counter()
    mode, prefix = isolation()
    workers = _workers()
    lost = 0
    while lost < 2:
        worker = workers.take(mode, prefix)
        if isinstance(worker, OSError):
            return Verdict(False, "crashed", str(worker)[:300], time.perf_counter() - started)
        try:
            verdict, healthy = _execute_in(
                worker, program, tests, timeout_s, memory_mb, started, entry_point
            )
        except _WorkerLost:
            workers.discard(worker)
            lost += worker.served == 0
            continue
        except BaseException:  # mid-job: its channel may hold half a frame
            workers.discard(worker)
            raise
        if healthy:
            workers.put_back(worker)
        else:
            workers.discard(worker)
        return verdict
    seconds = time.perf_counter() - started
    return Verdict(False, "crashed", "the sandbox worker died during the program, twice", seconds)


def _execute_in(
    worker: _Worker, program, tests, timeout_s: float, memory_mb: int, started: float,
    entry_point: str | None = None,
) -> tuple[Verdict, bool]:
    """The verdict of one run in ``worker``, and whether the worker can run the next."""
    attempt_started = time.perf_counter()
    pass_token, report_token = secrets.token_hex(16).encode(), secrets.token_hex(16).encode()
    view = worker.key[0] == "view"  # the worker's scratch, emptied by the worker after each program
    sandbox_dir = SCRATCH if view else tempfile.mkdtemp(prefix="matrixrl-sandbox-")
    healthy = True
    try:
        if not view and worker.uid is not None and not _chown(sandbox_dir, worker.uid):
            raise OSError(f"cannot hand the sandbox directory {sandbox_dir} to uid {worker.uid}")
        deadline = time.monotonic() + timeout_s
        left = timeout_s - (time.perf_counter() - attempt_started)
        job = marshal.dumps(
            (pass_token, report_token, program, tests, sandbox_dir, memory_mb,
             math.ceil(timeout_s) + 1, _audit_guard, entry_point, left)
        )
        try:
            report, returncode, timed_out, tail = worker.run(job, deadline + _WORKER_GRACE_S)
        except TimeoutError:
            worker.kill()  # before its program's directory goes
            report, returncode, timed_out, tail, healthy = b"", None, True, b"", False
    finally:
        if not view:
            _remove_tree(sandbox_dir)
    seconds = time.perf_counter() - started
    verdict = _verdict(
        report, pass_token, report_token, timed_out, returncode,
        tail.decode("utf-8", "replace"), timeout_s, seconds,
    )
    return verdict, healthy


class _WorkerLost(Exception):
    """The worker ended before it answered."""


class _Worker:
    """One started ``_sandbox_worker.py``, under the isolation's launcher, with a uid
    of its own where the isolation drops one; runs one program at a time."""

    def __init__(self, key: tuple[str, tuple[str, ...]], spawn: Callable[..., subprocess.Popen]) -> None:
        self.key = key  # the isolation (name, launcher prefix) it was started under
        self.served = 0  # programs it has run to the end
        mode, prefix = key
        # In a view the worker drops to it itself; in a user namespace only its uid 0 maps.
        dropping = any("{uid}" in part for part in prefix) or (mode == "view" and "--user" not in prefix)
        self.uid = _SANDBOX_UID_BASE + secrets.randbelow(_SANDBOX_UID_SPAN) if dropping else None
        spec = _view_spec(self.uid) if mode == "view" else {}
        argv = _fill_uid(_worker_launcher(prefix), self.uid or 0) + [
            sys.executable, "-I", "-S", "-B", "-u", str(WORKER_SCRIPT), json.dumps(spec)
        ]
        self.log = tempfile.TemporaryFile()  # the worker's own stderr: why it did not start
        self.process = spawn(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
            cwd="/", env=_ENVIRONMENT, start_new_session=True,
        )
        try:
            hello = self._receive(time.monotonic() + _WORKER_START_S)
        except (_WorkerLost, TimeoutError, ValueError, EOFError, TypeError):
            hello = None
        if not (isinstance(hello, tuple) and hello[:1] == ("ready",)):
            self.kill()
            raise OSError(f"the sandbox worker did not start ({self._last_words()})")

    def run(self, job: bytes, until: float) -> tuple[bytes, int, bool, bytes]:
        """Send ``job``; the worker's reply: verdict bytes, exit status, whether the
        deadline passed, output tail. _WorkerLost if the worker died first,
        TimeoutError if it did not answer by ``until`` (monotonic seconds)."""
        data = len(job).to_bytes(4, "big") + job
        try:
            while data:
                data = data[os.write(self.process.stdin.fileno(), data):]
        except OSError as error:  # BrokenPipeError: it died
            raise _WorkerLost from error
        return self._receive(until)

    def _receive(self, until: float):
        fd = self.process.stdout.fileno()
        header = self._read(fd, 4, until)
        return marshal.loads(self._read(fd, int.from_bytes(header, "big"), until))

    @staticmethod
    def _read(fd: int, size: int, until: float) -> bytes:
        waiter = select.poll()
        waiter.register(fd, select.POLLIN)
        chunks, left = [], size
        while left:
            wait_s = until - time.monotonic()
            if wait_s <= 0 or not waiter.poll(wait_s * 1000):
                raise TimeoutError
            chunk = os.read(fd, left)
            if not chunk:
                raise _WorkerLost
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _last_words(self) -> str:
        self.log.seek(max(0, self.log.seek(0, os.SEEK_END) - 2000))
        text = self.log.read().decode("utf-8", "replace")
        last = next((line for line in reversed(text.splitlines()) if line.strip()), "")
        status = self.process.returncode
        return f"exit status {status}: {last}"[:300] if last or status else "no answer"

    def close(self, wait_s: float = 1.0) -> None:
        """End-of-file on its job channel ends the worker (and any program it runs)."""
        self._close_channels()
        try:
            self.process.wait(wait_s)
        except subprocess.TimeoutExpired:
            self.kill()
        self.log.close()

    def kill(self) -> None:
        """SIGKILL its launcher and itself (one process group; in a PID namespace the
        worker is its process 1, whose death ends every program left in it)."""
        if self.process.returncode is None:  # not reaped: the group id is still its own
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.process.wait()
        self._close_channels()

    def abandon(self) -> None:
        """In a forked child: let go of the parent's worker without ending it."""
        self._close_channels()
        self.log.close()

    def _close_channels(self) -> None:
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass


def _worker_launcher(prefix: Sequence[str]) -> list[str]:
    """The isolation's launcher for a worker; outside a PID namespace without its parent-death
    signal, so that the worker ends at end-of-file on its job channel after killing its program."""
    if "--pid" in prefix:
        return list(prefix)
    return [part for part in prefix if not part.startswith("--pdeathsig")]


class _Spawner:
    """Starts workers from one thread that lives as long as the process: the launcher's
    parent-death signal follows the *thread* that started it, and ``run_many``'s threads end."""

    def __init__(self) -> None:
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="sandbox-worker-starter", daemon=True).start()

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        done: queue.SimpleQueue = queue.SimpleQueue()
        self._requests.put((argv, kwargs, done))
        started, value = done.get()
        if not started:
            raise value
        return value

    def _serve(self) -> None:
        while True:
            argv, kwargs, done = self._requests.get()
            try:
                done.put((True, subprocess.Popen(argv, **kwargs)))
            except BaseException as error:  # handed to the caller
                done.put((False, error))


class _Workers:
    """This process's workers: idle ones per isolation, reused across runs."""

    def __init__(self) -> None:
        self.owner = os.getpid()
        self._lock = threading.Lock()
        self._idle: dict[tuple, list[_Worker]] = {}
        self._live: set[_Worker] = set()
        self._unavailable: dict[tuple, OSError] = {}
        self._spawner: _Spawner | None = None

    def take(self, mode: str, prefix: Sequence[str]) -> _Worker | OSError:
        """An idle worker, a new one, or why none can start (then every program crashes, for
        the rest of this process: no weaker way runs it)."""
        key = (mode, tuple(prefix))
        with self._lock:
            if key in self._unavailable:
                return self._unavailable[key]
            idle = self._idle.setdefault(key, [])
            if idle:
                return idle.pop()
            if self._spawner is None:
                self._spawner = _Spawner()
            spawner = self._spawner
        try:
            worker = _Worker(key, spawner.popen)
        except (OSError, subprocess.SubprocessError) as error:
            with self._lock:
                self._unavailable[key] = OSError(str(error))
            return self._unavailable[key]
        with self._lock:
            self._live.add(worker)
        return worker

    def put_back(self, worker: _Worker) -> None:
        worker.served += 1
        with self._lock:
            idle = self._idle.setdefault(worker.key, [])
            if len(idle) < _IDLE_WORKERS:
                idle.append(worker)
                return
            self._live.discard(worker)
        worker.close()

    def discard(self, worker: _Worker) -> None:
        with self._lock:
            self._live.discard(worker)
        worker.kill()

    def close(self, mode: str | None = None, prefix: Sequence[str] = ()) -> None:
        """End every worker, or those of one isolation; all get end-of-file first, so
        they end together. (Only at exit, or when no run is under way.)"""
        ending = (mode, tuple(prefix))
        with self._lock:
            live = [w for w in self._live if mode is None or w.key == ending]
            self._live.difference_update(live)
            for key in list(self._idle):
                if mode is None or key == ending:
                    del self._idle[key]
        for worker in live:
            worker._close_channels()
        for worker in live:
            worker.close()

    def abandon(self) -> None:
        """In a forked child (taking no lock, which a parent thread may have held)."""
        for worker in list(self._live):
            worker.abandon()
        _ABANDONED.extend(self._live)  # their Popen objects, not to be waited for here


_WORKERS: _Workers | None = None
_WORKERS_LOCK = threading.Lock()
_ABANDONED: list[_Worker] = []


def _workers() -> _Workers:
    """This process's workers; a process forked from another starts its own."""
    global _WORKERS
    with _WORKERS_LOCK:
        if _WORKERS is None or _WORKERS.owner != os.getpid():
            if _WORKERS is not None:
                _WORKERS.abandon()
            _WORKERS = _Workers()
        return _WORKERS


def _forget_parent_workers() -> None:
    """After a fork, in the child: close its copies of the parent's job channels,
    so the parent's workers still see end-of-file when the parent ends."""
    global _WORKERS, _WORKERS_LOCK
    _WORKERS_LOCK = threading.Lock()
    if _WORKERS is not None:
        _WORKERS.abandon()
        _WORKERS = None


def _close_workers() -> None:
    if _WORKERS is not None and _WORKERS.owner == os.getpid():
        _WORKERS.close()


os.register_at_fork(after_in_child=_forget_parent_workers)
atexit.register(_close_workers)


def _verdict(
    report, pass_token, report_token, timed_out, returncode, tail, timeout_s, seconds
) -> Verdict:
    # Exactly the harness's one line: anything else in the report (a program's own write to
    # the verdict channel, before or after) makes it no verdict at all.
    if report == pass_token + b"\n":
        return Verdict(True, "passed", "", seconds)
    if report.startswith(report_token + b" ") and report.count(b"\n") == 1 and report.endswith(b"\n"):
        reason, _, detail = report[len(report_token) + 1:-1].decode("utf-8", "replace").partition(" ")
        if reason in _CHILD_FAILURES:
            return Verdict(False, reason, detail, seconds)
    if report.endswith(pass_token + b"\n"):
        return Verdict(False, "failed", "the program wrote to the verdict channel", seconds)
    if timed_out:
        return Verdict(False, "timeout", f"no verdict within {timeout_s:g} s", seconds)
    last_line = next((line for line in reversed(tail.splitlines()) if line.strip()), "")
    if "MemoryError" in tail:
        return Verdict(False, "memory", last_line[:300], seconds)
    if returncode == 0:
        return Verdict(False, "exited", "the process ended before the tests finished", seconds)
    return Verdict(False, "crashed", f"exit status {returncode}: {last_line}"[:300], seconds)


def _remove_tree(path: str) -> None:
    """Remove the sandbox directory, even where the program took permissions away."""
    try:
        shutil.rmtree(path)
        return
    except FileNotFoundError:
        return
    except OSError:
        pass
    os.chmod(path, 0o700)
    for parent, dirs, _files in os.walk(path):
        for name in dirs:
            target = os.path.join(parent, name)
            if stat.S_ISDIR(os.lstat(target).st_mode):
                os.chmod(target, 0o700)
    shutil.rmtree(path, ignore_errors=True)
