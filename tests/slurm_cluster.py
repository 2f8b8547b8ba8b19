"""A real single-node SLURM cluster for tests, started (as root) on this machine.

Usage::

    from slurm_cluster import slurm_cluster

    with slurm_cluster(tmp_path / "slurm") as cluster:
        out = cluster.run("sbatch", "--parsable", "--wrap", "hostname")
        cluster.wait_for_job(out.stdout.strip())

What it does, in order:

* skips the test (``pytest.skip``) when not root or when ``slurmctld``,
  ``slurmd``, ``munged``, ``munge``/``unmunge`` or the client commands are not
  on PATH -- except when the environment variable ``CI`` is ``true``: there
  the test FAILS instead, so CI really runs it;
* starts a private ``munged`` (own random key, own socket in a ``/tmp``
  directory it removes afterwards; slurm.conf points at that socket with
  ``AuthInfo=socket=...``). The system munge (``/etc/munge/munge.key``,
  ``/run/munge``) is neither used nor touched, so no key is ever created and a
  munged that may already run on the machine is left alone;
* writes ``slurm.conf``, ``gres.conf`` (fake GPUs: ``Name=gpu File=<ordinary
  file>``) and an empty ``plugstack.conf`` into ``tmp_dir/etc``; state, spool,
  pid and log files all live under ``tmp_dir``. No cgroups:
  ``proctrack/linuxproc``, ``task/none``, no accounting;
* makes the config reachable at ``/etc/slurm/slurm.conf`` and
  ``/etc/slurm/gres.conf`` (symlinks): the executor plugin clears
  ``SLURM_CONF`` inside jobs, so clients must find the default path. Existing
  files there are renamed aside and put back afterwards; what it created is
  removed (also ``/etc/slurm`` itself, if it created it). A stale
  ``/etc/slurm/slurm.conf`` without a controller makes every ``snakemake``
  start spend ~11 s in ``scontrol``, hence the care;
* starts ``slurmctld -D`` and ``slurmd -D`` under ``subprocess.Popen``
  (``start_new_session=True``), records their PIDs, and waits (30 s at most)
  until ``sinfo`` shows the node ``idle``; on failure it raises with the tails
  of the daemons' logs;
* on exit cancels leftover jobs (``scancel --user root``), then stops ONLY the
  daemons it started, by PID (SIGTERM, SIGKILL after 5 s), munged last, and
  restores ``/etc/slurm``.

Ports are picked free at start, so it does not clash with a SLURM that may
already run on the machine (6817/6818). ``MinJobAge=300`` keeps finished jobs
visible to ``squeue`` for five minutes: the executor plugin only trusts
``squeue`` as status command when ``MinJobAge >= 3 * init-seconds-before-
status-checks`` (otherwise it falls back to ``sacct``, which does not work
without accounting).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

from conftest import skip_or_fail

ETC_SLURM = Path("/etc/slurm")
# Files made reachable under /etc/slurm (symlinks into conf_dir).
PLACED = ("slurm.conf", "gres.conf")
REQUIRED = (
    "slurmctld",
    "slurmd",
    "munged",
    "munge",
    "unmunge",
    "sbatch",
    "squeue",
    "sinfo",
    "scontrol",
    "scancel",
)
TERMINAL_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
}
INSTALL_HINT = (
    "apt-get install -y slurmctld slurmd slurm-client munge (and run as root)"
)


def unavailable(reason: str) -> None:
    """Skip the test -- or fail it on CI (``CI=true``), where it must run."""
    skip_or_fail("SLURM test", reason, INSTALL_HINT)


def check_prerequisites() -> None:
    if os.geteuid() != 0:
        unavailable("a real SLURM cluster needs root (SlurmUser=root)")
    missing = [name for name in REQUIRED if shutil.which(name) is None]
    if missing:
        unavailable(f"not on PATH: {', '.join(missing)}")


def client_env() -> dict[str, str]:
    """This process's environment without SLURM_* variables.

    Without ``SLURM_CONF`` the clients read ``/etc/slurm/slurm.conf``, which
    the cluster points at its own config; a ``SLURM_JOB_ID`` etc. from an
    outer allocation would confuse sbatch and the executor plugin.
    """
    return {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}


@dataclasses.dataclass
class SlurmCluster:
    partition: str
    node: str
    cpus: int
    gpus: int
    conf_dir: Path
    log_dir: Path
    pids: dict[str, int] = dataclasses.field(default_factory=dict)
    etc_before: dict[str, object] = dataclasses.field(default_factory=dict)
    """/etc/slurm's placed files before the cluster started (``etc_slurm_state``)."""
    etc_after: dict[str, object] = dataclasses.field(default_factory=dict)
    """The same after it stopped, read while this cluster still held ONE_AT_A_TIME: another
    test's cluster cannot have changed /etc/slurm in between."""

    @property
    def conf(self) -> Path:
        return self.conf_dir / "slurm.conf"

    def env(self) -> dict[str, str]:
        return client_env()

    def run(
        self, *args: str, check: bool = True, timeout: float = 30, **kwargs
    ) -> subprocess.CompletedProcess:
        """Run a SLURM client command (text output captured)."""
        result = subprocess.run(
            [str(a) for a in args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=kwargs.pop("env", self.env()),
            **kwargs,
        )
        if check and result.returncode != 0:
            raise RuntimeError(
                f"{' '.join(map(str, args))} exited {result.returncode}:\n"
                f"{result.stdout}{result.stderr}"
            )
        return result

    def jobs(self) -> list[dict[str, str]]:
        """All jobs slurmctld still knows (finished ones for MinJobAge=300 s)."""
        out = self.run(
            "squeue", "--noheader", "--states=all", "--format=%i|%T|%j|%N"
        ).stdout
        jobs = []
        for line in out.splitlines():
            if line.strip():
                job_id, state, name, nodes = line.strip().split("|", 3)
                jobs.append(
                    {"id": job_id, "state": state, "name": name, "nodes": nodes}
                )
        return jobs

    def job_state(self, job_id: str) -> str | None:
        for job in self.jobs():
            if job["id"] == str(job_id):
                return job["state"]
        return None

    def wait_for_job(self, job_id: str, timeout: float = 60) -> str:
        """Poll ``squeue`` until the job reaches a terminal state; returns it."""
        deadline = time.monotonic() + timeout
        state = None
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if state in TERMINAL_STATES:
                return state
            time.sleep(0.25)
        raise TimeoutError(
            f"job {job_id} still {state} after {timeout} s\n{self.log_tails()}"
        )

    def log_tails(self, lines: int = 30) -> str:
        parts = []
        for path in sorted(self.log_dir.glob("*")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path.name} (last {lines} lines) ---")
            parts.extend(text)
        return "\n".join(parts)


def _short_hostname() -> str:
    return subprocess.run(
        ["hostname", "-s"], capture_output=True, text=True, check=True
    ).stdout.strip()


def _free_ports(n: int) -> list[int]:
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _mem_total_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    return 1024


def _write_configs(
    tmp_dir: Path,
    *,
    node: str,
    partition: str,
    cpus: int,
    gpus: int,
    mem_mb: int,
    munge_socket: Path,
) -> tuple[Path, Path]:
    conf_dir, log_dir = tmp_dir / "etc", tmp_dir / "log"
    state, spool, run, dev = (
        tmp_dir / "state",
        tmp_dir / "spool",
        tmp_dir / "run",
        tmp_dir / "dev",
    )
    for d in (conf_dir, log_dir, state, spool, run, dev):
        d.mkdir(parents=True, exist_ok=True)
    ctld_port, slurmd_port = _free_ports(2)

    gres_lines = ["AutoDetect=off"]
    for i in range(gpus):
        # A symlink to /dev/null: slurmd wants a character device (with an
        # ordinary file it logs "not a valid character or block device" and
        # sets no CUDA_VISIBLE_DEVICES); the trailing digit is the GPU index.
        fake = dev / f"fakegpu{i}"
        fake.symlink_to("/dev/null")
        gres_lines.append(f"NodeName={node} Name=gpu File={fake}")
    (conf_dir / "gres.conf").write_text("\n".join(gres_lines) + "\n")
    (conf_dir / "plugstack.conf").write_text("")

    node_gres = f" Gres=gpu:{gpus}" if gpus else ""
    (conf_dir / "slurm.conf").write_text(
        f"""\
# Written by tests/slurm_cluster.py for one test; removed afterwards.
ClusterName=matrixrltest
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={state}
SlurmdSpoolDir={spool}
SlurmctldPidFile={run}/slurmctld.pid
SlurmdPidFile={run}/slurmd.pid
SlurmctldLogFile={log_dir}/slurmctld.log
SlurmdLogFile={log_dir}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig={conf_dir}/plugstack.conf
MailProg=/bin/true
# no cgroups, no accounting
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
SlurmctldTimeout=10
SlurmdTimeout=30
MessageTimeout=10
KillWait=5
InactiveLimit=0
# finished jobs stay visible to squeue for 5 min (the executor plugin's
# squeue status command needs MinJobAge >= 3 * init-seconds-before-status-checks)
MinJobAge=300
GresTypes=gpu
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={mem_mb}{node_gres} State=UNKNOWN
PartitionName={partition} Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""
    )
    return conf_dir, log_dir


@contextlib.contextmanager
def _placed_in_etc(conf_dir: Path) -> Iterator[None]:
    """Symlink conf_dir's PLACED files into /etc/slurm; undo it all after."""
    created_dir = not ETC_SLURM.exists()
    moved: list[tuple[Path, Path]] = []
    linked: list[Path] = []
    try:
        ETC_SLURM.mkdir(parents=True, exist_ok=True)
        for name in PLACED:
            target = ETC_SLURM / name
            if target.exists() or target.is_symlink():
                aside = target.with_name(f"{name}.matrixrl-test-aside-{os.getpid()}")
                target.rename(aside)
                moved.append((aside, target))
            target.symlink_to(conf_dir / name)
            linked.append(target)
        yield
    finally:
        for target in linked:
            ours = conf_dir / target.name
            if target.is_symlink() and Path(os.readlink(target)) == ours:
                target.unlink()
        for aside, target in moved:
            if not (target.exists() or target.is_symlink()):
                aside.rename(target)
        if created_dir:
            with contextlib.suppress(OSError):
                ETC_SLURM.rmdir()


def _start(name: str, args: list[str], log_dir: Path) -> subprocess.Popen:
    out = open(log_dir / f"{name}.out", "ab")
    try:
        return subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=client_env(),
        )
    finally:
        out.close()


def _stop(proc: subprocess.Popen, grace: float = 5) -> None:
    """SIGTERM the process we started (by its PID), SIGKILL after ``grace`` s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(grace)


def _munge_answers(sock: Path) -> bool:
    try:
        cred = subprocess.run(
            ["munge", "-n", "-S", str(sock)], capture_output=True, timeout=5
        )
        if cred.returncode != 0:
            return False
        check = subprocess.run(
            ["unmunge", "-S", str(sock)],
            input=cred.stdout,
            capture_output=True,
            timeout=5,
        )
        return check.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _wait(what: str, ready, procs: dict[str, subprocess.Popen], cluster, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name, proc in procs.items():
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{name} exited with {proc.returncode} while waiting for "
                    f"{what}\n{cluster.log_tails()}"
                )
        if ready():
            return
        time.sleep(0.2)
    raise RuntimeError(
        f"timed out after {timeout} s waiting for {what}\n{cluster.log_tails()}"
    )


ONE_AT_A_TIME = Path("/tmp/matrixrl-test-slurm-cluster.lock")
"""Held while a cluster runs: the cluster's config is /etc/slurm's and its daemons take fixed ports,
so tests run in parallel (pytest-xdist) start their clusters one after another."""


@contextlib.contextmanager
def slurm_cluster(
    tmp_dir: Path,
    cpus: int = 2,
    gpus: int = 1,
    partition: str = "debug",
    mem_mb: int | None = None,
    timeout: float = 30,
) -> Iterator[SlurmCluster]:
    """Start munged + slurmctld + slurmd for one node; yield a SlurmCluster.

    ``tmp_dir`` holds everything (configs, state, spool, logs, fake GPU
    files). ``mem_mb`` defaults to 90 % of this machine's memory.
    """
    check_prerequisites()
    from filelock import FileLock

    with FileLock(ONE_AT_A_TIME):
        before = etc_slurm_state()
        with _one_cluster(tmp_dir, cpus, gpus, partition, mem_mb, timeout) as cluster:
            cluster.etc_before = before
            yield cluster
        cluster.etc_after = etc_slurm_state()


def etc_slurm_state() -> dict[str, object]:
    """What /etc/slurm holds for the files the cluster replaces."""
    state: dict[str, object] = {"dir": ETC_SLURM.is_dir()}
    for name in PLACED:
        path = ETC_SLURM / name
        if path.is_symlink():
            state[name] = ("link", os.readlink(path))
        elif path.exists():
            state[name] = ("file", path.read_bytes())
        else:
            state[name] = None
    return state


@contextlib.contextmanager
def _one_cluster(
    tmp_dir: Path, cpus: int, gpus: int, partition: str, mem_mb: int | None, timeout: float
) -> Iterator[SlurmCluster]:
    tmp_dir = Path(tmp_dir).resolve()
    tmp_dir.mkdir(parents=True, exist_ok=True)
    node = _short_hostname()
    mem_mb = mem_mb or max(256, int(_mem_total_mb() * 0.9))

    # munged insists that every directory above its socket is executable by
    # all (pytest's tmp_path under /tmp/pytest-of-root is 0700), so its files
    # live in their own 0755 directory under /tmp, removed afterwards.
    munge_dir = Path(tempfile.mkdtemp(prefix="slurm-munge-", dir="/tmp"))
    munge_dir.chmod(0o755)
    munge_socket = munge_dir / "munge.socket"
    conf_dir, log_dir = _write_configs(
        tmp_dir,
        node=node,
        partition=partition,
        cpus=cpus,
        gpus=gpus,
        mem_mb=mem_mb,
        munge_socket=munge_socket,
    )
    cluster = SlurmCluster(
        partition=partition,
        node=node,
        cpus=cpus,
        gpus=gpus,
        conf_dir=conf_dir,
        log_dir=log_dir,
    )
    procs: dict[str, subprocess.Popen] = {}
    try:
        key = munge_dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        procs["munged"] = _start(
            "munged",
            [
                "munged",
                "--foreground",
                f"--socket={munge_socket}",
                f"--key-file={key}",
                f"--pid-file={munge_dir / 'munged.pid'}",
                f"--seed-file={munge_dir / 'munged.seed'}",
                "--num-threads=2",
            ],
            log_dir,
        )
        cluster.pids["munged"] = procs["munged"].pid
        _wait("munged", lambda: _munge_answers(munge_socket), procs, cluster, 10)

        with _placed_in_etc(conf_dir):
            try:
                conf = str(ETC_SLURM / "slurm.conf")
                procs["slurmctld"] = _start(
                    "slurmctld", ["slurmctld", "-D", "-c", "-f", conf], log_dir
                )
                cluster.pids["slurmctld"] = procs["slurmctld"].pid
                procs["slurmd"] = _start(
                    "slurmd", ["slurmd", "-D", "-N", node, "-f", conf], log_dir
                )
                cluster.pids["slurmd"] = procs["slurmd"].pid

                def idle() -> bool:
                    r = cluster.run(
                        "sinfo", "--noheader", "--Node", "--format=%T",
                        "--nodes", node, check=False, timeout=10,
                    )
                    return r.returncode == 0 and r.stdout.strip() == "idle"

                _wait(f"node {node} idle in sinfo", idle, procs, cluster, timeout)
                yield cluster
            finally:
                if procs.get("slurmctld") and procs["slurmctld"].poll() is None:
                    with contextlib.suppress(Exception):
                        cluster.run(
                            "scancel", "--user", "root", check=False, timeout=10
                        )
                        deadline = time.monotonic() + 10
                        while time.monotonic() < deadline and any(
                            j["state"] not in TERMINAL_STATES for j in cluster.jobs()
                        ):
                            time.sleep(0.2)
                for name in ("slurmd", "slurmctld"):
                    if name in procs:
                        _stop(procs[name])
    finally:
        if "munged" in procs:
            _stop(procs["munged"])
        shutil.rmtree(munge_dir, ignore_errors=True)
