"""retain: delete a cell's checkpoints that ``train.keep_checkpoints`` does not keep (matrixrl.retention)."""

from __future__ import annotations

from pathlib import Path

from matrixrl.config import Analysis
from matrixrl.jobs.logfile import file_logger, logged_failures
from matrixrl.results import EvalResult, read_result


def retain_job(
    cell: str, cell_dir: str, eval_files: list[str], keep: str, analysis: dict, resume_digest: str, log_path: str
) -> None:
    """The ``retain`` rule's body. A local rule, in Snakemake's process: on the host that
    holds the results (cluster jobs share its filesystem), with no job to queue for a few
    deletions. What goes wrong is written to its own log, then raised."""
    from matrixrl.retention import retain

    log = file_logger(log_path)
    with logged_failures(log):
        evaluations = [read_result(Path(path), EvalResult) for path in eval_files]
        retain(cell, Path(cell_dir), evaluations, keep, Analysis(**analysis), resume_digest, log=log)
