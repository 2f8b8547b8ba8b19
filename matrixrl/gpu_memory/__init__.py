"""The GPU memory of one training or evaluation job at its peak, estimated before it starts.

No torch, no weights: shapes from config.json. docs/real-models.md, "Memory of one job".
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
