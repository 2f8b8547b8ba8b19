"""train: GRPO-train one cell from its scale's base model (resuming if interrupted).

A cell whose scale runs on a GPU, or whose memory's labeller does, first claims one
GPU of the machine for the whole job and hides the others, before CUDA starts
(``matrixrl.models.devices.claimed_gpu``): the cell's model and its labeller share it.
"""

from __future__ import annotations

from pathlib import Path

from matrixrl.grid import CellSpec
from matrixrl.results import TrainResult, write_result


def train(
    spec: CellSpec, base_dir: Path, cell_dir: Path, output: Path, log=print, memory: tuple[Path, Path] | None = None
) -> TrainResult:
    """``memory``: a cell trained with a memory's bank file and labeller folder (trainer.train_cell)."""
    from matrixrl.models.devices import claimed_gpu

    labeller = [spec.memory.labeller.scale] if spec.memory is not None else []
    with claimed_gpu(spec.scale, *labeller, log=log):
        from matrixrl.train.trainer import train_cell

        result = TrainResult.model_validate(train_cell(spec, base_dir, cell_dir, log=log, memory=memory))
    write_result(output, result)
    return result


def run(spec: str, paths: list[str], log=print) -> None:
    """The ``train`` job (matrixrl.dag): ``paths`` are the base model's folder, the cell's
    folder, the output, and for a cell trained with a memory its bank and labeller's folder."""
    base_dir, cell_dir, output, *memory = map(Path, paths)
    train(CellSpec.model_validate_json(spec), base_dir, cell_dir, output, log=log, memory=tuple(memory) or None)
