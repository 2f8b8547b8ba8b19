"""The memory and cost tables: built from the store's own rows, not from the per-cell records."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from matrixrl import grid as G
from matrixrl.analysis.memcollab import MODES as MEMORY_MODES
from matrixrl.analysis.memcollab import memory_table
from matrixrl.config import Config
from matrixrl.report.rows import current_evaluations
from matrixrl.store import Store


def cost_owners(config: Config, runs: pd.DataFrame) -> list[str]:
    """The store's owners of the selected runs' results, and of the memory built for their tasks."""
    from matrixrl.layout import MEMORY_OWNER

    return [*runs["cell"], *(f"{MEMORY_OWNER}{task}" for task in config.grid.task)]


def cost_frame(costs: pd.DataFrame, config: Config) -> pd.DataFrame:
    """The cost table: the stored results' job costs and the base models' jobs, whose result
    files the store does not hold (read where the job graph puts them)."""
    from matrixrl.analysis.cost_table import cost_table
    from matrixrl.dag import RULES, Graph
    from matrixrl.errors import ResultFileError
    from matrixrl.results import BaseResult, EvalResult, read_result

    base = []
    kinds = {"prepare_base": BaseResult, "evaluate_base": EvalResult}
    for job in Graph(config).jobs:
        if job.rule in kinds and (Path(config.results_dir) / job.output).is_file():
            try:
                cost = read_result(Path(config.results_dir) / job.output, kinds[job.rule]).cost
            except ResultFileError:
                continue  # a damaged one is plan's and run's to name: it is recomputed
            if cost is not None:
                base.append({"rule": job.rule, **cost.model_dump()})
    frame = pd.concat([pd.DataFrame(base), costs], ignore_index=True) if base else costs
    return cost_table(frame, RULES)


def memory_modes(config: Config) -> list[str]:
    """The memory modes of ``config``'s grid (``grid.memory``), ``none`` first."""
    modes = getattr(config.grid, "memory", None) or MEMORY_MODES
    return ["none", *(mode for mode in modes if mode != "none")]


def current_memory_evaluations(frame: pd.DataFrame, config: Config) -> pd.DataFrame:
    """The rows of the store's ``memory_evaluations`` computed under their (run, mode)'s current
    ``MemoryEvalSpec`` (matrixrl.grid: the cell's evaluation, its memory, the retrieval),
    or without a digest; a (run, mode) the grid does not plan keeps its rows (they are left out
    by mode)."""
    wanted = _memory_digests(config)
    if frame.empty or not wanted:
        return frame
    digests = [wanted.get((run, mode)) for run, mode in zip(frame["cell"], frame["memory"])]
    keep = [stored is None or want is None or stored == want for stored, want in zip(frame["spec_digest"].tolist(), digests)]
    return frame[keep]


_MEMORY_SPECS: dict[int, tuple[Config, dict[tuple[str, str], str]]] = {}


def _memory_digests(config: Config) -> dict[tuple[str, str], str]:
    """``{(run, mode): MemoryEvalSpec digest}`` of ``config``'s grid, once per config (as ``rows._spec_digests``)."""
    cached = _MEMORY_SPECS.get(id(config))
    if cached is None or cached[0] is not config:
        if len(_MEMORY_SPECS) > 64:
            _MEMORY_SPECS.clear()
        cached = _MEMORY_SPECS[id(config)] = (config, _new_memory_digests(config))
    return cached[1]


def _new_memory_digests(config: Config) -> dict[tuple[str, str], str]:
    if not [mode for mode in memory_modes(config) if mode != "none"]:
        return {}
    plan = G.plan_memory(config)
    if not plan.modes:
        return {}
    specs = {run.id: G.cell_spec(config, run) for run in G.runs(config)}
    return {key: spec.digest() for key, spec in G.memory_evals(config, specs, plan).items()}


def stored_memory_rows(store: Store, selected: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The store's ordinary and memory evaluations of the runs of the grid cells ``selected``
    (a grid frame), as the memory table reads them."""
    runs = list(dict.fromkeys(selected["run"]))
    memory = store.rows("memory_evaluations", runs)
    # Without memory evaluations the table is empty: reading every ordinary
    # evaluation for it would be most of an incremental report's time.
    return store.rows("evaluations", runs if not memory.empty else []), memory


def memory_frame(
    evals: pd.DataFrame, memory: pd.DataFrame, config: Config, selected: pd.DataFrame, current: Mapping[str, tuple[str, str]]
) -> pd.DataFrame:
    """The memory table of the grid cells ``selected`` (a grid frame), from the store's memory
    evaluations and, for ``none``, its ordinary evaluations (those under the current spec),
    as :func:`stored_memory_rows` read them."""
    evals = current_evaluations(evals, current)
    memory = current_memory_evaluations(memory, config)
    cells = selected.drop(columns=["run_policy"])
    return memory_table(cells, evals, memory, memory_modes(config), config.analysis.confidence)
