"""The memory of the GPU a job will get: the smallest visible GPU, or what a profile declares."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from matrixrl.gpu_memory.peak import GIB

PROFILE_RESOURCE = "gpu_memory_gib"
"""The resource a Snakemake profile declares, per rule, for the memory of the GPUs its jobs get
(``set-resources: {train: {gpu_memory_gib: 80}, evaluate: {...}}``); matrixrl reads it, SLURM ignores it."""

BUDGET_RULES = {"training": ("train",), "evaluation": ("evaluate", "evaluate_base"), "memory": ("collect", "label", "distill")}


@dataclass(frozen=True)
class GpuBudget:
    """The memory (bytes) of the GPU a training, an evaluation and a memory job (collect, label,
    distill) will get; None where unknown."""

    training: int | None
    evaluation: int | None
    source: str  # where the numbers come from, or why they are unknown
    memory: int | None = None

    def of(self, job: str) -> int | None:
        """The GPU of a ``job``: "training", "evaluation", or "memory" (or a memory job's rule)."""
        if job == "training":
            return self.training
        if job in ("memory", *BUDGET_RULES["memory"]):
            return self.memory
        return self.evaluation

    @property
    def known(self) -> bool:
        return self.training is not None or self.evaluation is not None

    @classmethod
    def every(cls, size: int | None, source: str) -> GpuBudget:
        """The same GPU for every job."""
        return cls(size, size, source, size)


def local_gpu_memory() -> tuple[int | None, str]:
    """The memory of the smallest GPU jobs started here can use (bytes), from ``nvidia-smi``
    (CUDA is not started), and where that comes from; None without a GPU or a driver."""
    from matrixrl.models.devices import visible_gpus

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None, "no nvidia-smi on this machine"
    visible = visible_gpus()
    if not visible:
        return None, "no GPU visible (CUDA_VISIBLE_DEVICES or nvidia-smi)"
    try:
        proc = subprocess.run(
            [smi, "--query-gpu=index,uuid,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None, "nvidia-smi did not answer"
    sizes = {}
    for line in proc.stdout.splitlines() if proc.returncode == 0 else []:
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 3 and fields[2].isdigit():
            sizes[fields[0]] = sizes[fields[1]] = int(fields[2]) * 2**20  # MiB
    found = [sizes[gpu] for gpu in visible if gpu in sizes]
    if len(found) != len(visible):
        return None, f"nvidia-smi does not list the memory of every visible GPU ({', '.join(visible)})"
    what = "the GPU" if len(found) == 1 else f"the smallest of {len(found)} visible GPUs"
    return min(found), f"nvidia-smi: {what}"


def profile_gpu_memory(profile: Path) -> GpuBudget:
    """The GPU memory a profile declares for the training, evaluation and memory rules (``PROFILE_RESOURCE``, GiB)."""
    from matrixrl.errors import ProfileError
    from matrixrl.snake.profiles import rule_resources

    rules = [rule for names in BUDGET_RULES.values() for rule in names]
    table = rule_resources(profile, rules)
    found: dict[str, int | None] = {}
    for job, names in BUDGET_RULES.items():
        declared = []
        for rule in names:
            value = table[rule].get(PROFILE_RESOURCE)
            if value is None:
                continue
            try:
                declared.append(float(value))
            except (TypeError, ValueError):
                raise ProfileError(
                    f"{profile / 'config.yaml'}: set-resources.{rule}.{PROFILE_RESOURCE} is {value!r}; "
                    "give the GPU's memory in GiB, e.g. 80"
                ) from None
        found[job] = int(min(declared) * GIB) if declared else None
    if not any(v is not None for v in found.values()):
        return GpuBudget(None, None, f"profile {profile} declares no {PROFILE_RESOURCE} for train or evaluate")
    return GpuBudget(found["training"], found["evaluation"], f"profile {profile}: {PROFILE_RESOURCE}", found["memory"])


def gpu_budget(profile: Path | None = None) -> GpuBudget:
    """The memory of the GPU each job will get: under a Snakemake ``profile`` what it declares
    (``PROFILE_RESOURCE`` per rule), locally the smallest visible GPU; None where unknown."""
    if profile is not None:
        return profile_gpu_memory(Path(profile))
    memory, source = local_gpu_memory()
    return GpuBudget.every(memory, source)
