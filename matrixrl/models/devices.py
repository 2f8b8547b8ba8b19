"""One GPU per job when several jobs share a machine.

Snakemake's ``--resources gpu=N`` (``matrixrl run`` passes the detected count) only
bounds how many GPU jobs run at once; it does not say which GPU each one takes, and
it does not set ``CUDA_VISIBLE_DEVICES``. So a job that needs a GPU claims one
itself: it takes an exclusive ``flock`` on a lock file per GPU, the first one free,
and holds it until it ends (the kernel drops the lock when the process dies, so a
killed job never leaves a GPU claimed). A training process then sets
``CUDA_VISIBLE_DEVICES`` to its GPU before CUDA starts; evaluation jobs, which run as
threads of one process, use ``cuda:N`` instead.

The lock files live in one folder per machine (``/tmp/matrixrl-gpus``, or
``$MATRIXRL_GPU_LOCK_DIR``), so separate runs on one machine share them too. Under
SLURM, ``CUDA_VISIBLE_DEVICES`` is the job's allocation and a claim picks from it.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from matrixrl.errors import GpuClaimError

LOCK_DIR_ENV = "MATRIXRL_GPU_LOCK_DIR"
WAIT_ENV = "MATRIXRL_GPU_WAIT_S"
DEFAULT_WAIT_S = 600.0


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` names them.

    Its entries when it is set (CUDA stops at the first invalid one, ``-1`` hides
    all); otherwise the indices ``nvidia-smi`` lists; none without a driver.
    """
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        gpus = []
        for entry in (e.strip() for e in env.split(",")):
            if not entry or entry.startswith("-"):
                break
            gpus.append(entry)
        return gpus
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        proc = subprocess.run(
            [smi, "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    if proc.returncode != 0:
        return []
    return [line.strip() for line in proc.stdout.splitlines() if line.strip()]


def gpu_count() -> int:
    """How many GPUs jobs started from here can use (0 on a machine without them)."""
    return len(visible_gpus())


def lock_dir() -> Path:
    return Path(os.environ.get(LOCK_DIR_ENV) or Path(tempfile.gettempdir()) / "matrixrl-gpus")


@dataclass
class GpuClaim:
    """A GPU held by this process until ``release`` (or the process ends)."""

    gpu: str  # its CUDA_VISIBLE_DEVICES name (an index or a UUID)
    position: int  # its index among this process's visible GPUs: torch's ``cuda:{position}``
    _fd: int | None = field(default=None, repr=False)

    @property
    def device(self) -> str:
        return f"cuda:{self.position}"

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __enter__(self) -> "GpuClaim":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def claim_gpu(gpus: list[str] | None = None, *, locks: Path | None = None, wait_s: float | None = None, poll_s: float = 0.5) -> GpuClaim:
    """Claim the first free GPU of ``gpus`` (default: the visible ones), waiting up to ``wait_s``.

    ``flock`` locks belong to an open file, so two threads of one process exclude
    each other as two processes do. Raises ``GpuClaimError`` when there is no GPU,
    or when every one stays held for ``wait_s`` seconds (``$MATRIXRL_GPU_WAIT_S``,
    default 600).
    """
    gpus = visible_gpus() if gpus is None else list(gpus)
    if not gpus:
        raise GpuClaimError("no GPU is visible to this job (CUDA_VISIBLE_DEVICES / nvidia-smi); use device: cpu for this scale")
    locks = locks or lock_dir()
    if wait_s is None:
        wait_s = float(os.environ.get(WAIT_ENV) or DEFAULT_WAIT_S)
    locks.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_s
    while True:
        for position, gpu in enumerate(gpus):
            path = locks / f"gpu-{re.sub(r'[^A-Za-z0-9_.-]', '_', gpu)}.lock"
            fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)  # read-only: other users can lock it too
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return GpuClaim(gpu, position, fd)
        if time.monotonic() >= deadline:
            raise GpuClaimError(
                f"all {len(gpus)} GPUs ({', '.join(gpus)}) stayed claimed by other jobs for {wait_s:.0f} s "
                f"(locks in {locks}); wait for them, or raise ${WAIT_ENV}"
            )
        time.sleep(poll_s)
