"""analyse: ingest every result file into the store and write the per-cell summary."""

from __future__ import annotations

import traceback
from pathlib import Path

import pandas as pd

from matrixrl import atomic
from matrixrl.analysis.summary import summary_table
from matrixrl.config import Analysis
from matrixrl.errors import UserError, disk_error_message
from matrixrl.grid import Cell
from matrixrl.jobs.logfile import file_logger
from matrixrl.store import ingest, read_table


def analyse_job(cells: list[dict], analysis: dict, output: str, log_path: str) -> None:
    """The ``analyse`` rule's body. Runs on the submitting host (a local rule), in
    Snakemake's process: what goes wrong is written to its own log, then raised."""
    log = file_logger(log_path)
    try:
        results_dir = Path(output).resolve().parent
        log(f"ingested {ingest(results_dir)} new or changed result files")
        grid = pd.DataFrame([{"cell": Cell(**c).id, **c} for c in cells])
        table = summary_table(grid, read_table(results_dir, "evaluations"), Analysis(**analysis))
        atomic.write_text(output, table.to_json(orient="records", indent=1))
        log(f"summarised {len(table)} cells")
    except Exception as exc:
        message = str(exc) if isinstance(exc, UserError) else disk_error_message(exc)
        if message is None:
            log(traceback.format_exc().rstrip())
            message = f"{type(exc).__name__}: {exc}"
        log(f"Error: {message}")
        raise
