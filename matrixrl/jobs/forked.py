"""Run a training, evaluation, memory or warm-start job in its own process, forked from a pre-imported server.

docs/architecture.md, "Why jobs do not start their own Python".
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import importlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from matrixrl import environment

# Before any preload import: torch reads it at each is_available() call, and the server,
# started by fork + exec from this process, inherits it. Jobs inherit it too, where
# asking NVML is as good (their CUDA starts once they load a model anyway).
os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"

# What the server imports once; each child finds these modules already loaded.
PRELOAD = [
    "matrixrl.jobs.__main__",
    "matrixrl.dag",
    "matrixrl.jobs.train",
    "matrixrl.jobs.prepare_base",
    "matrixrl.jobs.evaluate",
    "matrixrl.train.trainer",
]
LINGER_ENV = environment.JOB_SERVER_LINGER_S
"""Seconds a job server stays once no process that asked it for a job is alive (0: it ends with its runs)."""
PRELOAD_TIMEOUT_S = 600.0
"""How long a requester waits for a new server's imports (a cold disk, a loaded machine)."""

# Variables that change what the server's imports do or find; a server started under
# other values of them is another server. The per-run variables (matrixrl/snake/process.py's
# MATRIXRL_RUN_*) are not among them: every run sets its own.
KEY_PREFIXES = (
    "PYTHON", "MATRIXRL_", "OMP_", "MKL_", "OPENBLAS_", "TORCH", "PYTORCH_", "CUDA_", "NVIDIA_",
    "HF_", "TRANSFORMERS_", "TOKENIZERS_", "TRITON_", "LD_", "VIRTUAL_ENV",
)  # fmt: skip
RUN_VARS = ("MATRIXRL_RUN_PID", "MATRIXRL_RUN_LOG")
PER_RUN = (*RUN_VARS, LINGER_ENV)
BATCH_JOB_VARS = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID")
"""Set inside a batch system's job: there the server is that job's own and ends with it, so
that no job's work runs outside its allocation (its cgroup, its GPUs) and nothing outlives it."""
SERVER_ENV_KEEP = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "TMPDIR", "TZ")

_PR_SET_PDEATHSIG = 1
_HEADER = struct.Struct("!I")


class JobFailed(RuntimeError):
    """A forked job exited non-zero; its log says why."""


class JobServerError(RuntimeError):
    """The job server could not be started or ended during a job."""


# --- the requester's side (a Snakemake thread) ----------------------------------------------


def run_job(argv: list[str], name: str, log_path: str, append: bool = False) -> None:
    """Run ``python -m matrixrl.jobs ARGV...`` in a child of the job server, its output to ``log_path``;
    JobFailed unless it exits 0."""
    title = f"matrixrl.jobs {argv[0]} {name}"
    request = {"op": "run", "argv": argv, "title": title, "log_path": log_path, "append": append}
    try:
        exitcode = run_in_server(request)
    except JobServerError as exc:  # no child wrote the log: say why there, not only in Snakemake's log
        with contextlib.suppress(OSError), open(log_path, "a") as log:
            log.write(f"{exc}\n")
        raise
    if exitcode != 0:
        how = f"was killed by signal {-exitcode}" if exitcode < 0 else f"exited {exitcode}"
        raise JobFailed(f"{title} {how}; see its log {log_path}")


def run_in_server(request: dict, preload: list[str] | None = None) -> int:
    """Send a ``run`` request with this process's cwd and environment; wait for its exit code (safe from any thread)."""
    env = dict(os.environ)
    request = {**request, "cwd": os.getcwd(), "env": env}
    for _ in range(3):  # a stale server (its code changed) or one that just ended: start another
        conn = _connect(env, preload)
        with conn:
            _send(conn, request)
            reply = _receive(conn)
            if reply is None or "pid" not in reply:  # it answered "stale" (and stopped listening) or ended
                continue
            done = _receive(conn)
            if done is None:
                raise JobServerError(f"the job server ended while {request['title']} ran; see {_server_log(env, preload)}")
            return int(done["exitcode"])
    raise JobServerError(f"no job server would take {request['title']}; see {_server_log(env, preload)}")


def signal_jobs(pgid: int, signum: int) -> int:
    """Send ``signum`` to every job a process of group ``pgid`` asked this user's live job servers for;
    returns how many."""
    sent = 0
    for path in _socket_dir().glob("*.sock"):
        with contextlib.suppress(OSError, ValueError):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(5)
                conn.connect(str(path))
                _send(conn, {"op": "signal", "pgid": pgid, "signum": int(signum)})
                reply = _receive(conn)
                sent += int((reply or {}).get("signalled", 0))
    return sent


def server_key(env: dict[str, str], preload: list[str] | None = None) -> str:
    """The address of the server for this Python and environment: a server started with
    another value of a variable that steers imports (``PYTHONPATH``, ``MATRIXRL_PLUGINS``,
    ``OMP_NUM_THREADS``, ...) is another server."""
    digest = hashlib.sha256(sys.executable.encode())
    plugins = _with_plugins(env)
    for name in sorted(env):
        if (name.startswith(KEY_PREFIXES) and name not in PER_RUN) or name in BATCH_JOB_VARS or (plugins and name not in PER_RUN):
            digest.update(f"\0{name}={env[name]}".encode())
    if plugins:
        digest.update(f"\0cwd={os.getcwd()}".encode())
    digest.update(json.dumps(PRELOAD if preload is None else preload).encode())
    return digest.hexdigest()[:20]


def _socket_dir() -> Path:
    """A folder only this user can enter: the servers' sockets, locks and logs."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    if len(base) > 60:  # a socket's path has at most 107 bytes
        base = "/tmp"
    path = Path(base) / f"matrixrl-{os.getuid()}" / "job-servers"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.stat().st_uid != os.getuid():  # a folder another user made: never talk to their servers
        raise JobServerError(f"{path} belongs to another user; remove it or set XDG_RUNTIME_DIR")
    return path


def _server_log(env: dict[str, str], preload: list[str] | None = None) -> Path:
    return _socket_dir() / f"{server_key(env, preload)}.log"


def _connect(env: dict[str, str], preload: list[str] | None) -> socket.socket:
    """A connection to the server for ``env``, started first if none listens."""
    folder, key = _socket_dir(), server_key(env, preload)
    address, log = folder / f"{key}.sock", folder / f"{key}.log"
    conn = _try_connect(address)
    if conn is not None:
        return conn
    with open(folder / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one requester starts it; the others wait here, then connect
        conn = _try_connect(address)
        if conn is not None:
            return conn
        address.unlink(missing_ok=True)  # a dead server's
        server = _start_server(address, log, env, preload)
        deadline = time.monotonic() + PRELOAD_TIMEOUT_S
        while (conn := _try_connect(address)) is None:
            if server.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace").strip().splitlines()[-5:]
                raise JobServerError(f"the job server did not start: {' | '.join(tail) or 'no output'}")
            time.sleep(0.05)
        return conn


def _try_connect(address: Path) -> socket.socket | None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(address))
    except OSError:
        conn.close()
        return None
    return conn


def _with_plugins(env: dict[str, str]) -> bool:
    """Whether ``env`` names plugins (``MATRIXRL_PLUGINS``): then the server gets the whole
    environment and the folder of the run that starts it, and is keyed by them (:func:`server_key`),
    since plugins may read either as they are imported (docs/architecture.md)."""
    return bool(env.get("MATRIXRL_PLUGINS", "").strip())


def _start_server(address: Path, log: Path, env: dict[str, str], preload: list[str] | None) -> subprocess.Popen:
    """Fork + exec a server in a session of its own, from the root folder, with only the
    variables that steer imports: nothing ties it to the run that started it. With plugins,
    the whole environment and the run's folder (:func:`_with_plugins`)."""
    plugins = _with_plugins(env)
    server_env = {k: v for k, v in env.items() if plugins or k.startswith(KEY_PREFIXES) or k in SERVER_ENV_KEEP or k.startswith("LC_")}
    for name in RUN_VARS:
        server_env.pop(name, None)
    server_env["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    linger = 0.0 if any(env.get(name) for name in BATCH_JOB_VARS) else environment.seconds(LINGER_ENV, env)
    command = [sys.executable, "-m", "matrixrl.jobs.forked", str(address), str(linger)]
    command += [",".join(PRELOAD if preload is None else preload), str(os.getpid())]
    with open(log, "w") as output:
        return subprocess.Popen(
            command, env=server_env, cwd=os.getcwd() if plugins else "/", stdin=subprocess.DEVNULL, stdout=output, stderr=output,
            start_new_session=True,
        )


def _send(conn: socket.socket, message: dict) -> None:
    data = json.dumps(message).encode()
    conn.sendall(_HEADER.pack(len(data)) + data)


def _receive(conn: socket.socket) -> dict | None:
    """The next message, or None once the other end closed."""
    header = _read_exactly(conn, _HEADER.size)
    if header is None:
        return None
    body = _read_exactly(conn, _HEADER.unpack(header)[0])
    return None if body is None else json.loads(body)


def _read_exactly(conn: socket.socket, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        try:
            chunk = conn.recv(left)
        except ConnectionResetError:
            return None
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# --- the server -------------------------------------------------------------------------------


class _Server:
    """Accepts requests, forks a child per ``run``, reports each child's exit code to its requester."""

    def __init__(self, address: Path, linger_s: float, preload: list[str], starter: int) -> None:
        for module in preload:
            importlib.import_module(module)
        self.imported = _module_files()
        self.address = address
        self.linger_s = linger_s
        self.children: dict[int, tuple[socket.socket, int]] = {}  # pid -> (its requester's connection, the requester's pgid)
        self.requesters = {starter}  # pids of processes that asked for a job: the server lingers after the last
        self.pending: list[socket.socket] = []  # accepted, request not read yet
        self.idle_since = time.monotonic()
        self.stale = False
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(address))
        self.listener.listen(64)
        self.inode = address.stat().st_ino
        self.wakeup_r, wakeup_w = os.pipe()
        os.set_blocking(wakeup_w, False)
        signal.set_wakeup_fd(wakeup_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select() through the wakeup fd

    def serve(self) -> None:
        while True:
            self._reap()
            self.requesters = {pid for pid in self.requesters if _alive(pid)}
            if self.children or self.requesters:
                self.idle_since = time.monotonic()
            elif time.monotonic() - self.idle_since >= self.linger_s:
                self._stop_listening()
                if not self.stale:  # a clean end leaves no log (a newer server of the same key writes its own)
                    self.address.with_suffix(".log").unlink(missing_ok=True)
                return
            listening = [self.listener] if self.listener.fileno() != -1 else []
            readable, _, _ = select.select([*listening, self.wakeup_r, *self.pending], [], [], 1.0)
            if self.wakeup_r in readable:
                os.read(self.wakeup_r, 4096)
            if listening and self.listener in readable:
                conn, _ = self.listener.accept()
                self.pending.append(conn)
            for conn in [c for c in readable if c in self.pending]:
                self.pending.remove(conn)
                self._handle(conn)

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(10)  # a requester that connected and never wrote must not hold up the others
        try:
            request = _receive(conn)
        except OSError:
            request = None
        if request is None:
            conn.close()
            return
        conn.settimeout(None)
        if request["op"] == "signal":
            signalled = 0
            for pid, (_, pgid) in self.children.items():
                if pgid == request["pgid"]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, request["signum"])
                        signalled += 1
            _send(conn, {"signalled": signalled})
            conn.close()
            return
        changed = self._changed_module()
        if changed is not None:
            _send(conn, {"stale": changed})
            conn.close()
            self._stop_listening()  # the requester starts a fresh server; this one ends with its children
            self.stale = True
            self.linger_s = 0
            return
        peer_pid, peer_uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        if peer_uid != os.getuid():
            conn.close()
            return
        try:
            pgid = os.getpgid(peer_pid)
        except ProcessLookupError:
            conn.close()
            return
        self.requesters.add(peer_pid)
        pid = os.fork()
        if pid == 0:
            self.listener.close()
            for other in [*self.pending, *(c for c, _ in self.children.values())]:
                other.close()
            _child(conn, request)  # never returns
        self.children[pid] = (conn, pgid)
        _send(conn, {"pid": pid})

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn, _ = self.children.pop(pid, (None, 0))
            if conn is not None:
                with contextlib.suppress(OSError):
                    _send(conn, {"exitcode": os.waitstatus_to_exitcode(status)})
                conn.close()

    def _changed_module(self) -> str | None:
        """A file of a module this server imported that changed since (or None)."""
        for path, stamp in self.imported.items():
            try:
                current = os.stat(path).st_mtime_ns
            except OSError:
                return path
            if current != stamp:
                return path
        return None

    def _stop_listening(self) -> None:
        if self.listener.fileno() == -1:
            return
        self.listener.close()
        with contextlib.suppress(OSError):
            if self.address.stat().st_ino == self.inode:  # not a newer server's
                self.address.unlink()


def _module_files() -> dict[str, int]:
    stamps = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path:
            with contextlib.suppress(OSError):
                stamps[path] = os.stat(path).st_mtime_ns
    return stamps


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs: a zombie (a Snakemake its run has not reaped yet) does not."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _child(conn: socket.socket, request: dict) -> None:
    """In the forked child: become the requester's job, run it, exit with its status."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        server = os.getppid()
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != server:  # the server died before the line above
            os._exit(1)
        _die_with_requester(conn)
        from setproctitle import setproctitle

        setproctitle(request["title"])  # before the environment changes: it finds argv's memory beside environ's
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        log_path = request["log_path"]
        os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if request["append"] else os.O_TRUNC)
        fd = os.open(log_path, flags, 0o644)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        code = _run(request["argv"])
    except BaseException:  # noqa: BLE001 - the child must end here whatever happened
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _run(argv: list[str]) -> int:
    """``python -m matrixrl.jobs ARGV``'s exit status, run in this process."""
    if argv and argv[0] == "exit":  # ``exit CODE [SECONDS]``: the server's own check (tests/test_forked.py)
        time.sleep(float(argv[2]) if len(argv) > 2 else 0)
        return int(argv[1])
    from matrixrl.jobs.__main__ import run

    try:
        run(argv)  # exits 1 with an "Error: ..." line for errors the user can fix
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


def _die_with_requester(conn: socket.socket) -> None:
    """SIGKILL this child once the process that asked for it is gone (its connection reads end-of-file).

    The requester sends nothing after its request, so the only thing to read is the end.
    """

    def watch() -> None:
        with contextlib.suppress(OSError):
            while conn.recv(4096):
                pass
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="die-with-requester", daemon=True).start()


def main(argv: list[str]) -> None:
    """``python -m matrixrl.jobs.forked SOCKET LINGER_S PRELOAD STARTER_PID``: serve until idle for LINGER_S."""
    address, linger_s, preload, starter = Path(argv[0]), float(argv[1]), [m for m in argv[2].split(",") if m], int(argv[3])
    try:
        server = _Server(address, linger_s, preload, starter)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return
        raise
    server.serve()


if __name__ == "__main__":
    main(sys.argv[1:])
