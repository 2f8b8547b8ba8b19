"""The GPU memory of one training or evaluation job at its peak, estimated before it starts.

``plan`` shows, per hf scale, the largest training and evaluation job and the GPU they
will get; ``plan`` and ``run`` refuse a job whose estimate exceeds that GPU, with one
line naming the cell, the estimate, the GPU and the fixes (``refusals``). Nothing is
loaded and torch is not imported: the model's shapes come from its config.json
(``matrixrl.disk``: an hf scale's folder or the local Hugging Face cache; a tiny scale's
settings). Units: bytes in every breakdown; GiB (2^30 bytes, what nvidia-smi's MiB and
torch report) in every line printed.

One module per concern:

- ``model``: a cell's model as its jobs hold it (:class:`JobModel`), bytes per parameter,
  token and row, from its config.json;
- ``workload``: what a workflow asks of the model, its ``generate`` calls and its agents'
  turns in rows and tokens, and the token counts it assumes;
- ``peak``: every phase of a job, its parts in bytes and the largest (:func:`estimate`;
  a memory job's: :func:`memory_estimate`), with what each part holds;
- ``budget``: the memory of the GPU a job will get (:func:`gpu_budget`);
- ``fits``: the jobs that would not fit it, each in one line with its fixes
  (:func:`refusals`, :func:`check_fits`), what ``plan`` prints about GPU memory
  (:func:`memory_lines`), and each job's estimate in ``plan --format json`` (:func:`job_memory`).
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
