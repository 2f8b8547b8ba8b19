"""Every job cost the store holds, read with sqlite3 alone (``plan``'s estimate), never repairing."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

from matrixrl.layout import MEMORY_OWNER, store_path


def recorded_costs(results_dir: str | Path) -> list[dict]:
    """Every job cost the store of ``results_dir`` holds (``job_costs``), each with its owner
    (``cell``, ``part``: layout.result_key) and its cell's ``workflow`` and ``task`` (a memory
    job's task from its owner), whether or not the grid still has the job; ``[]`` when there is
    no store or it cannot be read."""
    path = store_path(results_dir)
    if not path.is_file():
        return []
    query = (
        "SELECT j.cell, j.part, j.rule, j.scale, j.seconds, j.steps, c.workflow, c.task "
        "FROM job_costs j LEFT JOIN cells c ON c.cell = j.cell"
    )
    try:
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as conn:
            rows = conn.execute(query).fetchall()
    except sqlite3.Error:
        return []
    names = ("cell", "part", "rule", "scale", "seconds", "steps", "workflow", "task")
    found = [dict(zip(names, row)) for row in rows]
    for row in found:
        if row["task"] is None and row["cell"].startswith(MEMORY_OWNER):
            row["task"] = row["cell"].removeprefix(MEMORY_OWNER)
    return found
