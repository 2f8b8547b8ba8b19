"""train: GRPO-train one cell from its scale's base model (resuming if interrupted).

A cell whose scale runs on a GPU first claims one GPU of the machine for the whole
process (matrixrl.models.devices) and hides the others, before CUDA starts.
"""

from __future__ import annotations

import os
from pathlib import Path

from matrixrl.grid import CellSpec
from matrixrl.results import TrainResult, write_result


def train(
    spec: CellSpec, base_dir: Path, cell_dir: Path, output: Path, log=print, memory: tuple[Path, Path] | None = None
) -> TrainResult:
    """``memory``: a cell trained with a memory's bank file and labeller folder (trainer.train_cell)."""
    from matrixrl.models.devices import claim_gpu, gpu_count
    from matrixrl.models.hf import needs_gpu

    claim = None
    if needs_gpu(spec.scale) and gpu_count():
        claim = claim_gpu()
        os.environ["CUDA_VISIBLE_DEVICES"] = claim.gpu  # this process sees its GPU as cuda:0
        log(f"{spec.cell.id}: training on GPU {claim.gpu}")
    try:
        from matrixrl.train.trainer import train_cell

        result = TrainResult.model_validate(train_cell(spec, base_dir, cell_dir, log=log, memory=memory))
    finally:
        if claim is not None:
            claim.release()
    write_result(output, result)
    return result
