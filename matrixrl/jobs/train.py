"""train: GRPO-train one cell from its scale's base model (resuming if interrupted).

A GPU cell claims one GPU for the whole job (``models.devices.claimed_gpu``).
"""

from __future__ import annotations

from pathlib import Path

from matrixrl.grid import CellSpec
from matrixrl.results import TrainResult, write_result


def train(
    spec: CellSpec, base_dir: Path, cell_dir: Path, output: Path, memory: list[Path] | None = None, log=print
) -> TrainResult:
    """``memory``: a cell trained with a memory's bank file and labeller folder."""
    from matrixrl.jobs.cost import Meter
    from matrixrl.models.devices import claimed_gpu

    meter = Meter(spec.cell.scale)
    ran = {"steps": 0, "tokens": 0}  # what this job trained: a resumed training ran the last steps only

    def count(row: dict) -> None:
        ran["steps"] += 1
        ran["tokens"] += row["completion_tokens"]

    labeller = [spec.memory.labeller.scale] if spec.memory is not None else []
    with claimed_gpu(spec.scale, *labeller, log=log):
        from matrixrl.train.trainer import train_cell

        spec = sized_update(spec, log)
        guide = memory_guide(spec, memory, log) if spec.memory is not None and memory is not None else None
        trained = train_cell(spec, base_dir, cell_dir, log=log, guide=guide, on_step=count)
        result = TrainResult.model_validate({**trained, "cost": meter.cost(tokens=ran["tokens"], steps=ran["steps"])})
    write_result(output, result)
    return result


def sized_update(spec: CellSpec, log=print) -> CellSpec:
    """``spec`` with ``train.micro_batch_tokens: auto`` resolved for the GPU this job holds
    (``matrixrl.gpu_memory.peak.update_tokens``), said in one line; any other value as it is."""
    if spec.train.micro_batch_tokens != "auto":
        return spec
    import torch

    from matrixrl.gpu_memory.model import job_device
    from matrixrl.gpu_memory.peak import update_tokens

    cuda = job_device(spec.scale) == "cuda" and torch.cuda.is_available()
    gpu = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory if cuda else None
    tokens = update_tokens(spec, gpu)
    log(f"train.micro_batch_tokens: auto is {tokens if tokens is not None else 'null (every turn at once)'}"
        + (f" for this GPU's {gpu / 2**30:.1f} GiB" if gpu else " (no GPU)"))
    return spec.model_copy(update={"train": spec.train.model_copy(update={"micro_batch_tokens": tokens})})


def memory_guide(spec: CellSpec, memory: tuple[Path, Path], log=print):
    """What makes the guide of a cell trained with a memory (``train_cell`` calls it once with the
    cell's task, under ``fork_rng``): the bank file's constraints, and the labeller loaded from its folder."""

    def make(task):
        from matrixrl.jobs.memcollab import TrainingGuide

        guide = TrainingGuide.load(spec.memory, *memory, task.family, spec.prompts)
        log(f"{spec.cell.id}: training with memory {spec.memory.mode} ({len(guide.entries)} constraints)")
        return guide

    return make
