"""The tables of ``matrixrl report``, built from the store with a per-cell cache.

docs/architecture.md, "Reports at scale".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from matrixrl.analysis.axes import PerCell, missing
from matrixrl.analysis.cell_record import per_cell_rows
from matrixrl.analysis.compare import CONTROL, against_table, compare_table
from matrixrl.analysis.mechanism import mechanism_caption, mechanism_table
from matrixrl.analysis.seeds import seeds_table
from matrixrl.analysis.summary import diagnostics_rows, summary_rows
from matrixrl.config import AXES, Config
from matrixrl.config.sweeps import is_value
from matrixrl.config.sweeps import spelled as _shown
from matrixrl.errors import ConfigError, closest, did_you_mean
from matrixrl.report import TABLES
from matrixrl.layout import store_path
from matrixrl.report.from_store import cost_frame, cost_owners, memory_frame, memory_modes, stored_memory_rows
from matrixrl.report.grid_frames import grid_and_runs, grid_frame, runs_frame, same_run_caption, selected_mask, sort_rows, sorted_cells
from matrixrl.report.records import cell_records
from matrixrl.report.rows import current_specs, nothing_stored
from matrixrl.store import Store, ingest_for_report, repairing

CLAIMS_CAPTION = "Each verdict by its rule, fixed in advance (docs/report.md, claims); why: the decisive figures."
"""The line under the claims table."""


def _summary(per_cell: PerCell, confidence: float) -> pd.DataFrame:
    return summary_rows(per_cell)


def _evaluated(per_cell: PerCell) -> PerCell:
    return per_cell.where(lambda row: not missing(row["base"]))


def _seeds(per_cell: PerCell, confidence: float) -> pd.DataFrame:
    return seeds_table(_evaluated(per_cell), confidence)


def _compare(per_cell: PerCell, confidence: float) -> pd.DataFrame:
    return compare_table(_evaluated(per_cell), confidence)


def _diagnostics(per_cell: PerCell, confidence: float) -> pd.DataFrame:
    return diagnostics_rows(per_cell)


def _mechanism(per_cell: PerCell, confidence: float) -> pd.DataFrame:
    return mechanism_table(per_cell)


def _memory(per_cell: PerCell, confidence: float) -> pd.DataFrame:
    raise TypeError("the memory table is built from the store's memory evaluations: see memory_frame")


def _cost(per_cell: PerCell, confidence: float) -> pd.DataFrame:
    raise TypeError("the cost table is built from the store's job costs: see cost_frame")


# The builders above are the built-in entries of the registry (matrixrl.report.TABLES),
# which names them by path; every table but memory and cost is built from the per-cell records.
FROM_STORE = ("memory", "cost")
"""The tables that read the store themselves rather than the per-cell records."""


def parse_group_by(group_by: str | Sequence[str] | None, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """``"workflow,policy"`` or ``["workflow", "policy"]`` → checked axes (the fixed ones and
    ``extra``, the grid's extra axes); ConfigError names the problem."""
    if group_by is None:
        return ()
    known = [*AXES, *extra]
    text = group_by if isinstance(group_by, str) else ",".join(group_by)
    axes = [a.strip() for a in text.split(",") if a.strip()]
    if not axes:
        raise ConfigError(f"--group-by {text!r}: expected AXIS[,AXIS] with AXIS one of {', '.join(known)}")
    for axis in axes:
        if axis not in known:
            raise ConfigError(f"--group-by {text!r}: unknown axis {axis!r}; {did_you_mean(axis, known)}")
    repeated = sorted({a for a in axes if axes.count(a) > 1}, key=axes.index)
    if repeated:
        raise ConfigError(f"--group-by {text!r}: {', '.join(repeated)} given more than once; list each axis once")
    return tuple(axes)


def check_group_by(name: str, group_by: str | Sequence[str] | None, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """The checked ``group_by`` axes for table ``name``; ConfigError if the table has no such column.
    Every table has a column per extra axis (``extra``)."""
    if name not in TABLES:
        raise ConfigError(f"unknown table {name!r}; {did_you_mean(name, TABLES)}")
    axes = (*TABLES[name].axes, *extra)
    parsed = parse_group_by(group_by, extra)
    if parsed and not TABLES[name].axes:
        raise ConfigError(f"--group-by {','.join(parsed)}: the {name} table has no axis columns (a row is about the whole study); leave --group-by out")
    for axis in parsed:
        if axis not in axes:
            raise ConfigError(
                f"--group-by {axis}: the {name} table has no {axis} column (it aggregates over {_plural(axis)}); "
                f"use one of: {', '.join(axes)}"
            )
    return parsed


def _plural(axis: str) -> str:
    """An axis's name for its values, in the plural: seeds, policies (not policys)."""
    if "." in axis:  # an extra axis: train.lr
        return f"the values of {axis}"
    return f"{axis[:-1]}ies" if axis.endswith("y") and axis[-2:-1] not in ("a", "e", "i", "o", "u") else f"{axis}s"


def build_tables(
    db_file: str | Path,
    config: Config,
    names: Sequence[str] | None = None,
    group_by: str | Sequence[str] | None = None,
    *,
    only: Mapping[str, Sequence] | None = None,
    against: tuple[str, object] | None = None,
) -> dict[str, pd.DataFrame]:
    """The report tables ``names`` (default: all of ``TABLES``) for the grid of ``config``.

    Reads ``db_file`` and refreshes its per-cell cache (no ingest). ``group_by``, ``only``
    (``{axis: values}``) and ``against`` are the options of the same names; ConfigError if an
    axis is unknown or the table aggregates over it. Tables may be empty.
    """
    frames, _ = _build(db_file, config, names, group_by, only, against)
    return frames


def _build(db_file, config, names, group_by, only, against=None) -> tuple[dict[str, pd.DataFrame], PerCell]:
    names = list(TABLES if names is None else names)
    extra = list(config.grid.sweeps)
    for name in names:
        check_group_by(name, group_by, extra)
    axes = parse_group_by(group_by, extra)
    db_file = Path(db_file)
    if not db_file.is_file():
        raise ConfigError(f"{db_file}: no store yet; run `matrixrl run` first")

    grid = grid_frame(config)
    selected = grid[selected_mask(grid, only)] if only else grid
    needed = selected
    if not only:
        pass  # the whole grid: its own controls
    elif "compare" in names and against is not None:
        # Controls: the control value's cells, matching the selection on every other axis.
        needed = grid[grid["cell"].isin(selected["cell"]) | selected_mask(grid, only, skip=(against[0],))]
    elif "compare" in names:
        # Controls: the other policy mode and the single workflow, for the selected tasks, scales and seeds.
        controls = selected_mask(grid, only, skip=("workflow", "policy")) & grid["workflow"].isin({*selected["workflow"], CONTROL})
        needed = grid[grid["cell"].isin(selected["cell"]) | controls]
    runs = runs_frame(needed) if only else grid_and_runs(config)[1]
    current = current_specs(config, runs["cell"])

    def read() -> tuple[dict[str, dict], tuple[pd.DataFrame, pd.DataFrame] | None]:
        # One opening of the store for the records and the memory table's rows: opening it
        # is a good part of an incremental report's time.
        with Store(db_file) as store:
            records = cell_records(store, runs, config, current) if any(name not in FROM_STORE for name in names) else {}
            memory = stored_memory_rows(store, selected) if "memory" in names else None
            costs = store.rows("job_costs", cost_owners(config, runs)) if "cost" in names else None
        return records, memory, costs

    by_run, memory_rows, costs = repairing(db_file, read)  # a damaged store is rebuilt, and read again
    run_of = dict(zip(needed["cell"], needed["run"]))
    records = {cell: by_run[run] for cell, run in run_of.items() if run in by_run}
    per_cell = per_cell_rows(records, needed.drop(columns=["run", "run_policy"]))
    for row in per_cell.rows:
        row["run"] = run_of[row["cell"]]
    per_cell.dtypes["run"] = per_cell.dtypes["cell"]
    if len(selected) < len(needed):
        chosen = set(selected["cell"])
        per_selected = per_cell.where(lambda row: row["cell"] in chosen)
    else:
        per_selected = per_cell
    per_selected = sorted_cells(per_selected, config, axes)  # the per-cell tables keep this order

    same_run = same_run_caption(selected) if only else grid_and_runs(config)[2]
    frames = {}
    for name in names:
        if name == "compare":
            if against is not None:
                table = against_table(_evaluated(per_cell).frame(), *against, config.analysis.confidence)
            else:
                table = TABLES[name].build(per_cell, config.analysis.confidence)
            table = table[selected_mask(table, only)] if only else table
        elif name == "memory":
            table = memory_frame(*memory_rows, config, selected, current)
        elif name == "cost":
            table = cost_frame(costs, config)
        elif name == "claims":
            from matrixrl.analysis.claims import claims_table

            table = claims_table(per_selected, config.analysis.confidence, family=config.analysis.family)
        else:
            table = TABLES[name].build(per_selected, config.analysis.confidence)
        if not TABLES[name].per_cell:  # a per-cell table keeps the order of its rows, sorted already
            table = sort_rows(table, config, axes)
        if name == "mechanism":
            table.attrs["caption"] = mechanism_caption(table)
        elif name == "claims" and not table.empty:
            from matrixrl.analysis.calibration import family_caption

            table.attrs["caption"] = f"{CLAIMS_CAPTION}\n{family_caption(config)}"
        elif name == "summary" and same_run is not None:
            table.attrs["caption"] = same_run
        frames[name] = table
    return frames, per_selected


def report_table(
    results_dir: str | Path,
    config: Config,
    name: str,
    group_by: str | Sequence[str] | None = None,
    *,
    only: Mapping[str, Sequence] | None = None,
    against: tuple[str, object] | None = None,
) -> pd.DataFrame:
    """One table for ``matrixrl report``; ConfigError (one line, how to fix) when it has no rows."""
    results = Path(results_dir)
    frames, per_cell = _build(store_path(results), config, [name], group_by, only, against)
    table = frames[name]
    if table.empty:
        needs = TABLES[name].needs
        evaluated = bool(_evaluated(per_cell).rows)
        if against is not None and evaluated:
            axis, control = against
            raise ConfigError(
                f"{results}: nothing to compare against {axis}={_shown(control)}; it needs cells of that value and "
                f"of another, alike on every other axis and with a seed in common"
            )
        if name == "compare" and evaluated:
            raise ConfigError(
                f"{results}: nothing to compare for the cells of this grid; compare needs cells of both "
                f"policy modes, or of {CONTROL} and another workflow, with the same task, scale and seed"
            )
        if name == "memory":
            modes = [mode for mode in memory_modes(config) if mode != "none"]
            fix = (
                f"run `matrixrl run` to evaluate them under {', '.join(modes)}"
                if modes
                else "list memory modes in grid.memory (docs/memcollab.md) and run `matrixrl run`"
            )
            raise nothing_stored(results, needs, fix)
        raise nothing_stored(results, needs)
    return table


def load_report_table(
    config: Config,
    name: str,
    group_by: str | None = None,
    selected: Config | None = None,
    against: str | None = None,
) -> pd.DataFrame:
    """``matrixrl report``'s table: ingest new result files, then ``report_table`` of ``config``'s grid.

    ``selected``: the config narrowed by ``--only``, whose cells' rows are kept
    (comparisons still take their controls from ``config``'s whole grid).
    """
    check_group_by(name, group_by, list(config.grid.sweeps))
    parsed = parse_against(against, config, name) if against is not None else None
    ingest_for_report(config.results_dir)
    return report_table(config.results_dir, config, name, group_by, only=selection(selected), against=parsed)


def selection(selected: Config | None) -> dict[str, list] | None:
    """``{axis: values}`` of a config narrowed by ``--only`` (extra axes too), for ``only=``; None: everything."""
    if selected is None:
        return None
    return {**{axis: getattr(selected.grid, axis) for axis in AXES}, **selected.grid.sweeps}


def parse_against(text: str, config: Config, table: str = "compare") -> tuple[str, object]:
    """``--against AXIS=VALUE`` → ``(axis, the grid's value)``; ConfigError naming the problem."""
    axis, sep, raw = text.partition("=")
    axis, raw = axis.strip(), raw.strip()
    axes = [a for a in (*AXES, *config.grid.sweeps) if a != "seed"]
    if table != "compare":
        raise ConfigError(f"--against {text!r}: it sets compare's control; use it with --table compare")
    if not sep or not axis or not raw:
        raise ConfigError(f"--against {text!r}: expected AXIS=VALUE, e.g. --against policy=shared")
    if axis == "seed":
        raise ConfigError(f"--against {text!r}: cells are paired by seed, so seed cannot be the control; use another axis")
    if axis not in axes:
        raise ConfigError(f"--against {text!r}: unknown axis {axis!r}; {did_you_mean(axis, axes)}")
    values = config.grid.sweeps[axis] if axis in config.grid.sweeps else getattr(config.grid, axis)
    for value in values:
        if is_value(raw, value):
            return axis, value
    names = [value for value in values if isinstance(value, str)]  # a number is another value, not a slip
    if (near := closest(raw, names)) is not None:
        raise ConfigError(f"--against {text!r}: {raw} is not a value of grid.{axis}; did you mean {near}?")
    raise ConfigError(
        f"--against {text!r}: {raw} is not a value of grid.{axis} [{', '.join(map(_shown, values))}]; use one of them"
    )


