"""The grid as the tables see it: its cells and runs as frames, a selection, rows in order."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from matrixrl import grid as G
from matrixrl.analysis.axes import PerCell, cells_frame, missing
from matrixrl.config import AXES, Config


def grid_frame(config: Config) -> pd.DataFrame:
    """The grid's cells (``cell`` + AXES + the extra axes, None where one leaves a cell alone)
    and ``run``, the id their results are stored under."""
    return grid_and_runs(config)[0].copy(deep=False)  # copy on write: the caller's to change


_GRIDS: dict[int, tuple[Config, tuple[pd.DataFrame, pd.DataFrame, str | None]]] = {}


def grid_and_runs(config: Config) -> tuple[pd.DataFrame, pd.DataFrame, str | None]:
    """The grid frame of ``config``, its runs (:func:`runs_frame`) and its :func:`same_run_caption`,
    computed once per config, as ``rows._spec_digests``."""
    cached = _GRIDS.get(id(config))
    if cached is None or cached[0] is not config:
        if len(_GRIDS) > 64:
            _GRIDS.clear()
        grid = _new_grid_frame(config)
        cached = _GRIDS[id(config)] = (config, (grid, runs_frame(grid), same_run_caption(grid)))
    return cached[1]


def _new_grid_frame(config: Config) -> pd.DataFrame:
    extra = list(config.grid.sweeps)
    cells = [(c, G.run_of(c)) for c in G.cells(config)]
    rows = [{"cell": c.id, **c.axes(), **c.sweep_values(), "run": r.id, "run_policy": r.policy} for c, r in cells]
    return cells_frame(rows, ["cell", *AXES, *extra, "run", "run_policy"])


def runs_frame(cells: pd.DataFrame) -> pd.DataFrame:
    """The runs of ``cells`` (a grid frame) as cells of their own: ``cell`` (the run id) and its ``policy``."""
    runs = cells.drop_duplicates("run")
    return pd.DataFrame({"cell": runs["run"], "policy": runs["run_policy"]})


def same_run_caption(cells: pd.DataFrame) -> str | None:
    """A line naming the cells that are another cell's run (one-role workflows under isolated)."""
    aliases = cells[cells["cell"] != cells["run"]]
    if aliases.empty:
        return None
    workflows = ", ".join(dict.fromkeys(aliases["workflow"]))
    return (
        f"{workflows}: one role, so isolated is the same computation as shared; "
        f"its isolated rows repeat the shared runs (computed once)"
    )


def selected_mask(frame: pd.DataFrame, only: Mapping[str, Sequence] | None, skip: tuple[str, ...] = ()) -> pd.Series:
    keep = pd.Series(True, index=frame.index)
    for axis, values in (only or {}).items():
        if axis in skip or axis not in frame.columns:
            continue
        wanted = {str(v) for v in values}
        keep &= frame[axis].isna() | frame[axis].astype(str).isin(wanted)
    return keep


def sort_rows(frame: pd.DataFrame, config: Config, group_by: Sequence[str] = ()) -> pd.DataFrame:
    """Stable sort by ``group_by``, then the other axes, each in experiments.yaml's order.

    A missing axis value (``policy`` of an ``isolated - shared`` row) sorts first.
    """
    keys = _sort_keys(frame.columns, config, group_by)
    if frame.empty or not keys:
        return frame.reset_index(drop=True)
    order = _sorted_order({name: frame[name].tolist() for name in keys}, config, len(frame))
    if order == list(range(len(frame))):
        return frame.reset_index(drop=True)
    return frame.take(order).reset_index(drop=True)


def sorted_cells(per_cell: PerCell, config: Config, group_by: Sequence[str] = ()) -> PerCell:
    """The rows of ``per_cell`` in :func:`sort_rows`' order (a per-cell table built from them needs no sort)."""
    keys = _sort_keys(per_cell.columns, config, group_by)
    if not keys:
        return per_cell
    order = _sorted_order({name: [row[name] for row in per_cell.rows] for name in keys}, config, len(per_cell.rows))
    return PerCell([per_cell.rows[i] for i in order], per_cell.dtypes)


def _sort_keys(columns, config: Config, group_by: Sequence[str]) -> list[str]:
    keys = [*group_by, *(a for a in [*AXES, *config.grid.sweeps] if a not in group_by)]
    return [k for k in keys if k in columns]


def _sorted_order(columns: Mapping[str, list], config: Config, n: int) -> list[int]:
    """Positions ``0..n-1`` stably sorted by each column's values' positions in experiments.yaml
    (Python's sort is stable: ``sort_values(keys, kind="stable")`` without pandas' cost per column)."""

    def positions(name: str, values: list) -> list[int]:
        listed = config.grid.sweeps[name] if "." in name else getattr(config.grid, name)
        order = {str(v): i for i, v in enumerate(listed)}
        return [-1 if missing(v) else order.get(str(v), len(order)) for v in values]

    by_key = list(zip(*(positions(name, values) for name, values in columns.items())))
    return sorted(range(n), key=by_key.__getitem__)
