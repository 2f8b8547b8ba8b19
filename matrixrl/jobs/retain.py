"""retain: delete a cell's checkpoints that ``train.keep_checkpoints`` does not keep (matrixrl.retention)."""

from __future__ import annotations

from pathlib import Path

from matrixrl.grid import RetainSpec
from matrixrl.results import EvalResult, read_result


def retain_job(spec: RetainSpec, cell_dir: Path, eval_files: list[Path], log=print) -> None:
    """The ``retain`` job (matrixrl.dag; a local rule, in Snakemake's process: on the host
    that holds the results, with no job to queue for a few deletions), on the cell's
    folder and its evaluations."""
    from matrixrl.retention import retain

    evaluations = [read_result(Path(path), EvalResult) for path in eval_files]
    retain(spec.cell, Path(cell_dir), evaluations, spec.keep, spec.analysis, spec.resume_digest, log=log)
