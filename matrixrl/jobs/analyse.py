"""analyse: ingest every result file into the store and write the per-cell summary."""

from __future__ import annotations

import json
from pathlib import Path

from matrixrl import atomic
from matrixrl.grid import AnalyseSpec


def run(spec: str, paths: list[str], log=print) -> None:
    """The ``analyse`` job (matrixrl.dag; a local rule: it writes the store on the submitting
    host). ``paths`` is the summary file. Evaluations stored under another spec than their
    run's current one (a checkpoint an old schedule evaluated) are left out, as in the report."""
    from matrixrl.analysis.axes import cells_frame
    from matrixrl.analysis.summary import summary_table
    from matrixrl.report.rows import current_evaluations
    from matrixrl.store import ingest, read_table

    found = AnalyseSpec.model_validate_json(spec)
    (output,) = paths
    results_dir = Path(output).resolve().parent
    log(f"ingested {ingest(results_dir)} new or changed result files")
    cells = found.cells
    grid = cells_frame(cells, list(dict.fromkeys(key for cell in cells for key in cell)))
    evaluations = read_table(results_dir, "evaluations")
    evaluations = current_evaluations(evaluations, {run: (None, digest) for run, digest in found.eval_digests.items()})
    table = summary_table(grid, evaluations, found.analysis)
    records = json.loads(table.to_json(orient="records"))
    atomic.write_text(output, json.dumps({"spec_digest": found.digest, "cells": records}, indent=1))
    log(f"summarised {len(table)} cells")
