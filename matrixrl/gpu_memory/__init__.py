"""The GPU memory of one training or evaluation job at its peak, estimated before it starts.

``plan`` shows, per hf scale, the largest training and evaluation job and the GPU they will get;
``plan`` and ``run`` refuse a job whose estimate exceeds that GPU (``refusals``). Nothing is
loaded and torch is not imported: the shapes come from the model's config.json. Bytes in every
breakdown, GiB (2^30 bytes) in every line printed. docs/real-models.md, "Memory of one job".
"""

from matrixrl.gpu_memory.budget import GpuBudget, gpu_budget
from matrixrl.gpu_memory.fits import check_fits, fixes, job_memory, memory_lines, refusal, refusals
from matrixrl.gpu_memory.model import JobModel, job_model
from matrixrl.gpu_memory.peak import GIB, Estimate, estimate, gib, memory_estimate

__all__ = [
    "GIB",
    "Estimate",
    "GpuBudget",
    "JobModel",
    "check_fits",
    "estimate",
    "fixes",
    "gib",
    "gpu_budget",
    "job_memory",
    "job_model",
    "memory_estimate",
    "memory_lines",
    "refusal",
    "refusals",
]
