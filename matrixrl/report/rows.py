"""A study's stored rows, as the report reads them: one copy per grid cell, current results only.

Nothing here ingests: call ``matrixrl.store.ingest_for_report`` first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from matrixrl import grid as G
from matrixrl.analysis.axes import cells_frame
from matrixrl.analysis.cell_record import rows_of_cells
from matrixrl.config import AXES, Config
from matrixrl.errors import ConfigError
from matrixrl.store import read_table

STORED = ("evaluations", "train_steps", "diagnostics", "role_metrics")
"""The store tables :func:`stored_rows` reads."""

_DROPPED = {"evaluations": ["spec_digest"], "diagnostics": ["id"]}
"""Store bookkeeping columns that are no result."""


def nothing_stored(results_dir: str | Path, needs: str = "evaluations", fix: str = "run `matrixrl run` first") -> ConfigError:
    """The error of a table, plot or export that finds no rows computed under the grid's current
    specs (results of other settings are there but do not count)."""
    return ConfigError(f"{Path(results_dir)}: no {needs} stored for the cells of this grid at these settings; {fix}")


def current_specs(config: Config, runs: Sequence[str] | None = None) -> dict[str, tuple[str, str]]:
    """Each run's ``(train digest, eval digest)`` under ``config`` (of ``runs`` only, if given):
    what its stored results must have been computed under to be reported."""
    wanted = None if runs is None else set(runs)
    return {run: digests for run, digests in _spec_digests(config).items() if wanted is None or run in wanted}


_SPECS: dict[int, tuple[Config, dict[str, tuple[str, str]]]] = {}


def _spec_digests(config: Config) -> dict[str, tuple[str, str]]:
    """Every run's spec digests under ``config``, computed once per config (a validated config never
    changes): a process that reports again and again (the Python API, a notebook) pays it once."""
    cached = _SPECS.get(id(config))
    if cached is None or cached[0] is not config:  # held here, so its id is not reused meanwhile
        if len(_SPECS) > 64:
            _SPECS.clear()
        cached = _SPECS[id(config)] = (config, G.spec_digests(config, G.runs(config)))
    return cached[1]


def current_evaluations(evals: pd.DataFrame, current: Mapping[str, tuple[str, str]]) -> pd.DataFrame:
    """The rows of the store's ``evaluations`` computed under their run's current spec (or without a digest)."""
    wanted = evals["cell"].map({run: digests[1] for run, digests in current.items()})
    return evals[evals["spec_digest"].isna() | (evals["spec_digest"] == wanted)]


def current_trainings(frame: pd.DataFrame, trained: pd.DataFrame, current: Mapping[str, tuple[str, str]]) -> pd.DataFrame:
    """The rows of ``frame`` (a training's rows: diagnostics, steps) of runs whose stored training
    (``trained``: the store's ``cells``) was computed under their current spec (or without a digest)."""
    wanted = trained["cell"].map({run: digests[0] for run, digests in current.items()})
    stale = trained.loc[trained["spec_digest"].notna() & (trained["spec_digest"] != wanted), "cell"]
    return frame[~frame["cell"].isin(set(stale))]



def grid_cells(config: Config) -> pd.DataFrame:
    """The grid's cells in the grid's order: ``cell``, the five axes, the extra axes
    (None where one leaves a cell alone) and ``run``, the id its results are stored under."""
    extra = list(config.grid.sweeps)
    rows = [{"cell": c.id, **c.axes(), **c.sweep_values(), "run": G.run_of(c).id} for c in G.cells(config)]
    return cells_frame(rows, ["cell", *AXES, *extra, "run"])


def stored_rows(config: Config, table: str, current: dict[str, tuple[str, str]] | None = None) -> pd.DataFrame:
    """The store's ``table`` (one of :data:`STORED`) for the grid cells of ``config``.

    Rows are keyed by grid cell id (``cell``); stale results are left out (see the
    module docstring). ``current``: :func:`current_specs` of ``config``, if the
    caller has it already.
    """
    if table not in STORED:
        raise ValueError(f"unknown store table {table!r}; use one of: {', '.join(STORED)}")
    results = Path(config.results_dir)
    current = current_specs(config) if current is None else current
    runs = G.run_ids(config)
    frame = read_table(results, table)
    if table == "evaluations":
        frame = current_evaluations(frame, current)
    elif table in ("train_steps", "diagnostics"):
        frame = current_trainings(frame, read_table(results, "cells"), current)
    else:  # role_metrics: training's rows with their training, evaluation's with their evaluation
        train = current_trainings(frame[frame["source"] == "train"], read_table(results, "cells"), current)
        evals = current_evaluations(read_table(results, "evaluations"), current)[["cell", "step"]]
        evaluated = frame[frame["source"] == "eval"].merge(evals, on=["cell", "step"])
        frame = pd.concat([train, evaluated], ignore_index=True)
    frame = frame.drop(columns=_DROPPED.get(table, []))
    return rows_of_cells(frame, runs).reset_index(drop=True)
