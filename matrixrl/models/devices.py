"""One GPU per job when several jobs share a machine (docs/real-models.md, "GPUs")."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from matrixrl import environment
from matrixrl.errors import GpuClaimError

LOCK_DIR_ENV = environment.GPU_LOCK_DIR
# PyTorch's allocator settings (either name; the second is torch 2.9's generic one) and what a
# job sets when neither is: docs/performance.md, "Reserved memory while the KV cache grows".
ALLOCATOR_ENVS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
ALLOCATOR_DEFAULT = "expandable_segments:True"
WAIT_ENV = environment.GPU_WAIT_S


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
    position: int  # its index among the GPUs this process saw when it claimed it
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


def lock_name(gpu: str) -> str:
    """The lock file of ``gpu``: its allocation's own under SLURM (see the module's docstring)."""
    job = os.environ.get("SLURM_JOB_ID")
    key = f"slurm{job}-{gpu}" if job else gpu
    return f"gpu-{re.sub(r'[^A-Za-z0-9_.-]', '_', key)}.lock"


def claim_gpu(gpus: list[str] | None = None, *, locks: Path | None = None, wait_s: float | None = None, poll_s: float = 0.5) -> GpuClaim:
    """Claim the first free GPU of ``gpus`` (default: the visible ones), waiting up to ``wait_s``
    (``$MATRIXRL_GPU_WAIT_S``, default 600); two threads exclude each other as two processes do.
    Raises ``GpuClaimError`` when there is no GPU or every one stays held.
    """
    gpus = visible_gpus() if gpus is None else list(gpus)
    if not gpus:
        raise GpuClaimError("no GPU is visible to this job (CUDA_VISIBLE_DEVICES / nvidia-smi); use device: cpu for this scale")
    locks = locks or lock_dir()
    if wait_s is None:
        wait_s = environment.seconds(WAIT_ENV)
    locks.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_s
    while True:
        for position, gpu in enumerate(gpus):
            path = locks / lock_name(gpu)
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


@contextmanager
def claimed_gpu(*scales, log=print) -> Iterator[str | None]:
    """The device a job of ``scales`` loads its models onto, on a GPU it holds for the block.

    When a scale needs a GPU and one is visible: claims it, makes it the only one CUDA shows,
    sets :func:`allocator_defaults` and yields ``cuda``; otherwise None. Raises ``GpuClaimError``
    if CUDA has already started in this process.
    """
    from matrixrl.models.hf import needs_gpu

    if not any(needs_gpu(scale) for scale in scales) or not gpu_count():
        yield None
        return
    if _cuda_started():
        # CUDA reads CUDA_VISIBLE_DEVICES once, when it starts: setting it now would not hide the other GPUs.
        raise GpuClaimError(
            "CUDA started in this job before it claimed its GPU, so CUDA_VISIBLE_DEVICES can no longer confine it "
            "to one GPU; claim the GPU (matrixrl.models.devices.claimed_gpu) before anything touches CUDA"
        )
    before = {name: os.environ.get(name) for name in ("CUDA_VISIBLE_DEVICES", ALLOCATOR_ENVS[0])}
    with claim_gpu() as claim:
        os.environ["CUDA_VISIBLE_DEVICES"] = claim.gpu
        allocator = allocator_defaults()
        log(f"claimed GPU {claim.gpu} (CUDA_VISIBLE_DEVICES={claim.gpu} in this job; allocator {allocator})")
        try:
            yield "cuda"
        finally:
            for name, value in before.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def allocator_defaults() -> str:
    """PyTorch's CUDA allocator settings for this process, as it will read them when CUDA
    starts: the environment's, or else ``ALLOCATOR_DEFAULT`` (segments that grow in place,
    so that a KV cache grown a position at a time does not strand memory), set here.
    Call it before CUDA starts; afterwards the allocator has read its settings."""
    for name in ALLOCATOR_ENVS:
        if os.environ.get(name):
            return f"{name}={os.environ[name]} (from the environment)"
    os.environ[ALLOCATOR_ENVS[0]] = ALLOCATOR_DEFAULT
    return f"{ALLOCATOR_ENVS[0]}={ALLOCATOR_DEFAULT}"


def _cuda_started() -> bool:
    torch = sys.modules.get("torch")  # never imported just to ask: a job without torch has no CUDA
    return torch is not None and torch.cuda.is_initialized()
