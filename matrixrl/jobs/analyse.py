"""analyse: ingest every result file into the store and write the per-cell summary."""

from __future__ import annotations

import json
from pathlib import Path

from matrixrl import atomic
from matrixrl.analysis.axes import cells_frame
from matrixrl.analysis.summary import summary_table
from matrixrl.config import Analysis
from matrixrl.jobs.logfile import file_logger, logged_failures
from matrixrl.report.tables import current_evaluations
from matrixrl.store import ingest, read_table


def analyse_job(
    cells: list[dict], analysis: dict, output: str, log_path: str, eval_digests: dict[str, str] | None = None,
    digest: str | None = None,
) -> None:
    """The ``analyse`` rule's body. Runs on the submitting host (a local rule), in
    Snakemake's process: what goes wrong is written to its own log, then raised.

    ``eval_digests`` (run id → its current spec's eval digest): evaluations stored under
    another spec (a checkpoint an old schedule evaluated) are left out, as in the report.
    ``digest`` (matrixrl.status.analyse_digest): what the summary is computed from, recorded in it.
    """
    log = file_logger(log_path)
    with logged_failures(log):
        results_dir = Path(output).resolve().parent
        log(f"ingested {ingest(results_dir)} new or changed result files")
        grid = cells_frame(cells, list(dict.fromkeys(key for cell in cells for key in cell)))
        evaluations = read_table(results_dir, "evaluations")
        if eval_digests is not None:
            evaluations = current_evaluations(evaluations, {run: (None, digest) for run, digest in eval_digests.items()})
        table = summary_table(grid, evaluations, Analysis(**analysis))
        records = json.loads(table.to_json(orient="records"))
        atomic.write_text(output, json.dumps({"spec_digest": digest, "cells": records}, indent=1))
        log(f"summarised {len(table)} cells")
