"""train: GRPO-train one cell from its scale's base model (resuming if interrupted)."""

from __future__ import annotations

from pathlib import Path

from matrixrl.grid import CellSpec
from matrixrl.results import TrainResult, write_result


def train(spec: CellSpec, base_dir: Path, cell_dir: Path, output: Path, log=print) -> TrainResult:
    from matrixrl.train.trainer import train_cell

    result = TrainResult.model_validate(train_cell(spec, base_dir, cell_dir, log=log))
    write_result(output, result)
    return result
