"""analyse: ingest every result file into the store and write the per-cell summary."""

from __future__ import annotations

import json
from pathlib import Path

from matrixrl import atomic
from matrixrl.grid import AnalyseSpec


def analyse(spec: AnalyseSpec, output: Path, log=print) -> None:
    """The ``analyse`` job (matrixrl.dag; a local rule: it writes the store on the submitting
    host), writing the summary to ``output``. Evaluations stored under another spec than their
    run's current one (a checkpoint an old schedule evaluated) are left out, as in the report."""
    from matrixrl.analysis.axes import cells_frame
    from matrixrl.analysis.summary import summary_table
    from matrixrl.report.rows import current_evaluations
    from matrixrl.store import ingest, read_table

    results_dir = Path(output).resolve().parent
    log(f"ingested {ingest(results_dir)} new or changed result files")
    cells = spec.cells
    grid = cells_frame(cells, list(dict.fromkeys(key for cell in cells for key in cell)))
    evaluations = read_table(results_dir, "evaluations")
    evaluations = current_evaluations(evaluations, {run: (None, digest) for run, digest in spec.eval_digests.items()})
    table = summary_table(grid, evaluations, spec.analysis)
    records = json.loads(table.to_json(orient="records"))
    atomic.write_text(output, json.dumps({"spec_digest": spec.digest, "cells": records}, indent=1))
    log(f"summarised {len(table)} cells")
