"""The report: tables built from the store (``tables``) and rendered (``formats``).

No pandas here: a builder is imported when its table is first built.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass

from matrixrl.errors import RegistrationError
from matrixrl.plugins import Registry, load_plugins


@dataclass(frozen=True)
class Table:
    """One report table: how to build it and how to describe it."""

    name: str
    title: str
    """Its heading, over the terminal table and its section of the HTML page."""
    help: str
    """What it shows, in a few words: its part of ``--table``'s help."""
    builder: str | Callable
    """``(per-cell rows, confidence level) → the table``, or its ``"module:function"`` path.

    The rows are an ``analysis.axes.PerCell`` of the cells it covers (``.frame()``: one
    row per cell, ``cell``, the axes, then the cell's record: base, peak, final, gain,
    cliff, ...); confidence is ``analysis.confidence``."""
    columns: tuple[str, ...]
    """The reading formats' default columns after the axes; a name the table lacks is skipped."""
    per_cell: bool = True
    """One row per cell (a ``cell`` column, then every axis), else one per workflow, task,
    scale and policy (its rows aggregate over seeds)."""
    needs: str = "evaluations"
    """What must be stored for it to have rows (named in the error when it has none)."""
    page: bool = True
    """Whether ``report --html`` has a section for it."""
    first: bool = False
    """Whether ``report --html`` shows it first, above the matrix (the claims: the study's answer)."""
    row_axes: tuple[str, ...] | None = None
    """The axes it has a column for, where a row is neither a cell nor a group of seeds: ``()``
    for a table about the study as a whole (the claims)."""

    @property
    def axes(self) -> tuple[str, ...]:
        """The axes the table has a column for (what ``--group-by`` may name), extra axes aside."""
        if self.row_axes is not None:
            return self.row_axes
        if self.per_cell:
            from matrixrl.config import AXES

            return AXES
        from matrixrl.analysis.seeds import GROUP_AXES

        return GROUP_AXES

    def build(self, per_cell, confidence: float):
        """The table of the per-cell rows ``per_cell``."""
        builder = self.builder
        if isinstance(builder, str):
            module, _, function = builder.partition(":")
            builder = getattr(importlib.import_module(module), function)
        return builder(per_cell, confidence)


_TABLES = "matrixrl.report.tables"

TABLES: Registry = Registry(
    "table",
    {
        table.name: table
        for table in (
            # Did it help, did it collapse.
            Table(
                "summary", "per-cell summary", "per cell accuracies, cliffs, per-role accuracies", f"{_TABLES}:_summary",
                ("base", "peak@step", "final", "gain", "cliff@onset"),
            ),
            Table(
                "seeds", "across seeds", "mean and 95% interval over seeds", f"{_TABLES}:_seeds",
                ("n_seeds", "base_mean", "peak_mean", "final±ci", "gain±ci", "cliff_rate"), per_cell=False,
            ),
            Table(
                "compare", "comparisons", "isolated - shared and each workflow - single", f"{_TABLES}:_compare",
                ("comparison", "n_pairs", "final_diff±ci", "gain_diff±ci", "cliff_rate_diff", "amplification_diff±ci"),
                per_cell=False,
            ),
            Table(
                "diagnostics", "per-cell gradient diagnostics", "per-role gradients", f"{_TABLES}:_diagnostics",
                ("dominant_role", "dominant_share", "amplified_role", "amplification_mean", "logp_gap_max"),
                needs="gradient diagnostics",
            ),
            Table(
                "mechanism", "mechanism: does the signal rise before the cliff?", "does the signal rise before the cliff?",
                f"{_TABLES}:_mechanism", ("cliff@onset", "signal", "change", "rise_step", "lead", "verdict"),
            ),
            # Built from the store's memory evaluations, not from the per-cell rows (from_store.memory_frame).
            Table(
                "memory", "memory: accuracy with each memory mode, and its difference from none",
                "accuracy under each memory mode vs none", f"{_TABLES}:_memory",
                ("base", "peak@step", "base_diff±ci", "peak_diff±ci", "peak_tokens"), per_cell=False,
                needs="memory evaluations",
            ),
            # The answer: each finding of the study tested on these cells (first on the HTML page).
            Table(
                "claims", "claims: the findings tested", "each finding of the study: its test, evidence and verdict",
                "matrixrl.analysis.claims:claims_table", ("finding", "evidence", "cells", "verdict", "fragility"),
                per_cell=False, first=True, row_axes=(),
            ),
            # Built from the store's job_costs and the base models' result files (from_store.cost_frame);
            # what running the study took, not what it found: not on the HTML page.
            Table(
                "cost", "cost: what the jobs took, per kind of job and scale",
                "wall time, peak memory and tokens/s per kind of job and scale", f"{_TABLES}:_cost",
                ("rule", "jobs", "seconds_total", "seconds_mean", "peak_rss_gb", "peak_gpu_gb", "tokens_per_s"), per_cell=False,
                needs="job costs", page=False, row_axes=("scale",),
            ),
        )
    },
)
"""Every table of ``matrixrl report --table NAME``, in the order the CLI and the HTML page list them."""


_NAME = re.compile(r"[a-z][a-z0-9_]*")


def register_table(table: Table) -> Table:
    """Add ``table`` (a plugin's entry of ``TABLES``); its builder should import pandas and the
    like inside, so that the CLI's start-up stays light."""
    global TABLE_NAMES
    if not _NAME.fullmatch(table.name):
        raise RegistrationError(f"table {table.name!r}: a table's name is lower-case letters, digits and _")
    TABLES.add(table.name, table)
    TABLE_NAMES = tuple(TABLES)
    return table


load_plugins()

TABLE_NAMES = tuple(TABLES)
"""The names of ``TABLES``, in order."""

FORMATS = ("table", "csv", "markdown", "latex", "json")
"""Every ``--format`` of ``matrixrl report`` (``matrixrl.report.formats.render``)."""
