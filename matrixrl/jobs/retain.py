"""retain: delete a cell's checkpoints that ``train.keep_checkpoints`` does not keep (matrixrl.retention)."""

from __future__ import annotations

from pathlib import Path

from matrixrl.grid import RetainSpec
from matrixrl.results import EvalResult, read_result


def run(spec: str, paths: list[str], log=print) -> None:
    """The ``retain`` job (matrixrl.dag; a local rule, in Snakemake's process: on the host
    that holds the results, with no job to queue for a few deletions). ``paths`` are the
    cell's folder, then its evaluations."""
    from matrixrl.retention import retain

    found = RetainSpec.model_validate_json(spec)
    cell_dir, *eval_files = paths
    evaluations = [read_result(Path(path), EvalResult) for path in eval_files]
    retain(found.cell, Path(cell_dir), evaluations, found.keep, found.analysis, found.resume_digest, log=log)
