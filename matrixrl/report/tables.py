"""The tables of ``matrixrl report``, built from the store with a per-cell cache.

Every table is computed from one record per cell (``matrixrl.analysis.cell``).
A record depends only on that cell's stored results and the ``analysis:``
settings, so the store caches it (``cell_summaries``) under a cache key of
exactly those inputs: the digests the store keeps of each of the cell's stored
results (``cell_keys``, from ``cell_inputs``; one per train or eval result), the
analysis settings and :data:`RECORD_VERSION`. A report reads the cache keys,
recomputes only the cells whose key changed (a new evaluation, a re-trained cell,
another threshold), and aggregates the records into the requested tables, built
from the records as plain rows (``analysis.axes.PerCell``). What a record takes
from the cell's training alone (``analysis.cell.training_part``) is cached too
(``cell_trainings``, keyed by the training's digest): a recomputed record whose
training is unchanged reads only the cell's evaluations.

Only results computed under the cell's current spec are reported
(:func:`current_specs`): an evaluation whose spec digest is not the cell's
``eval_digest()``, a training whose is not its ``train_digest()`` (an old
schedule's checkpoint left on disk, say) is left out; results without a spec
digest (files written before digests) are kept.

Rows are sorted stably by workflow, task, scale, policy, seed — the ``group_by``
axes first — each axis in the order experiments.yaml lists its values.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from matrixrl import grid as G
from matrixrl.analysis.axes import PerCell, cells_frame, missing
from matrixrl.analysis.cell import ROLE_METRICS, TRAINING_METRICS, per_cell_rows, record_of, training_part
from matrixrl.analysis.compare import CONTROL, against_table, compare_table
from matrixrl.analysis.mechanism import mechanism_caption, mechanism_table
from matrixrl.analysis.memory import MODES as MEMORY_MODES
from matrixrl.analysis.memory import memory_table
from matrixrl.analysis.seeds import seeds_table
from matrixrl.analysis.summary import diagnostics_rows, summary_rows
from matrixrl.config import AXES, Config
from matrixrl.config.sweeps import spelled as _shown
from matrixrl.errors import ConfigError, closest, did_you_mean
from matrixrl.report import TABLES
from matrixrl.layout import store_path
from matrixrl.store import Store, ingest_for_report, repairing

RECORD_VERSION = "6"
"""Part of every record's cache key: bump it when a record's computation changes, so caches refresh."""

CLAIMS_CAPTION = "Each verdict by its rule, fixed in advance (docs/report.md, claims); why: the decisive figures."
"""The line under the claims table."""

DIAGNOSTIC_KINDS = ("role_share", "amplification", "role_norm")
"""The gradient-diagnostic kinds a record reads (the store holds more)."""


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
    raise TypeError("the memory table is built from the store's memory evaluations: see _memory_frame")


def _cost(per_cell: PerCell, confidence: float) -> pd.DataFrame:
    raise TypeError("the cost table is built from the store's job costs: see _cost_frame")


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
                f"--group-by {axis}: the {name} table has no {axis} column (it aggregates over {axis}s); "
                f"use one of: {', '.join(axes)}"
            )
    return parsed


def record_cache_key(inputs: str, settings: Mapping) -> str:
    """What a cell's record is computed from: its results' digests (``Store.input_keys``), the
    settings, the record version."""
    blob = json.dumps({"inputs": inputs, "analysis": dict(settings), "version": RECORD_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _jsonable(record: dict) -> dict:
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in record.items()}


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


def compute_records(
    store: Store,
    cells: Mapping[str, str],
    config: Config,
    parts: Mapping[str, Sequence[tuple[str, str]]] | None = None,
    trainings: dict[str, dict] | None = None,
) -> dict[str, dict]:
    """Fresh records of ``cells`` (``{cell: policy}``) from their stored rows.

    ``parts`` (``{cell: [(part, digest), ...]}``, from ``Store.input_digests``): the
    results each record is computed from; other stored rows are left out.
    ``trainings``: ``{cell: training part}`` (``analysis.cell.training_part``) known
    already, used as it is; the parts computed here are added to it. Only cells
    without one read their training's rows (the diagnostics are most of the store).
    """
    trainings = {} if trainings is None else trainings
    ids = list(cells)
    untrained = [cell for cell in ids if cell not in trainings]
    frames = {
        "evals": store.rows("evaluations", ids),
        "roles": store.rows("role_metrics", ids, source="eval", metric=ROLE_METRICS),
    }
    if untrained:
        frames["train_roles"] = store.rows("role_metrics", untrained, source="train", metric=TRAINING_METRICS)
        frames["diagnostics"] = store.rows("diagnostics", untrained, kind=DIAGNOSTIC_KINDS)
    if len(ids) == 1:  # a new evaluation's cell: its rows as they are
        by_cell = {name: {ids[0]: frame} for name, frame in frames.items()}
    else:
        by_cell = {name: dict(tuple(frame.groupby("cell", sort=False))) for name, frame in frames.items()}
    records = {}
    for cell, policy in cells.items():
        rows = {name: by_cell[name].get(cell, frame.iloc[0:0]) for name, frame in frames.items()}
        kept = {part for part, _ in parts.get(cell, ())} if parts is not None else None
        if kept is not None:
            steps = {int(part.removeprefix("eval/step_")) for part in kept if part != "train"}
            rows["evals"] = rows["evals"][rows["evals"]["step"].isin(steps)]
            rows["roles"] = rows["roles"][rows["roles"]["step"].isin(steps)]
        try:
            if cell not in trainings:
                if kept is not None and "train" not in kept:
                    rows["diagnostics"] = rows["diagnostics"].iloc[0:0]
                    rows["train_roles"] = rows["train_roles"].iloc[0:0]
                trainings[cell] = training_part(policy, rows["diagnostics"], rows["train_roles"])
            record = record_of(trainings[cell], rows["evals"], rows["roles"], config.analysis)
        except ValueError as exc:
            raise ValueError(f"cell {cell!r}: {exc}") from exc
        records[cell] = _jsonable(record)
    return records


def training_cache_key(parts: Sequence[tuple[str, str]], policy: str, settings: Mapping) -> str:
    """What a cell's training part is computed from: its training's digest (if any), its policy
    mode, the settings and the record version."""
    train = [list(part) for part in parts if part[0] == "train"]
    blob = json.dumps({"train": train, "policy": policy, "analysis": dict(settings), "version": RECORD_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def cell_records(
    store: Store, cells: pd.DataFrame, config: Config, current: Mapping[str, tuple[str, str]] | None = None
) -> dict[str, dict]:
    """The records of every cell of ``cells`` (``cell`` + AXES) with stored results.

    ``current`` (:func:`current_specs`): each cell's spec digests; a record is then
    computed from the results computed under them only (all stored results if None).
    Cached records are reused when their cache key still matches; the others are
    recomputed and cached (only then is the store written). A recomputed record
    reuses its cell's cached training part when the training is the same (a new
    evaluation): then only the cell's evaluations are read.
    """
    inputs = store.input_keys(cells["cell"].tolist(), current)
    # Every analysis setting a record depends on (the interval level only enters the aggregates).
    settings = config.analysis.model_dump(exclude={"confidence"})
    keys = {cell: record_cache_key(text, settings) for cell, text in inputs.items()}
    cached = store.cached_summaries(list(keys))
    stale = [cell for cell, key in keys.items() if cached.get(cell, (None,))[0] != key]
    if not stale:
        return {cell: cached[cell][1] for cell in keys}
    digests = store.input_digests(stale, current)
    policies = dict(zip(cells["cell"], cells["policy"]))
    training_keys = {cell: training_cache_key(digests[cell], policies[cell], settings) for cell in stale}
    trainings = {
        cell: training
        for cell, (key, training) in store.cached_trainings(stale).items()
        if key == training_keys[cell]
    }
    known = set(trainings)
    fresh = compute_records(store, {cell: policies[cell] for cell in stale}, config, digests, trainings)
    store.save_summaries(
        {cell: (keys[cell], fresh[cell]) for cell in stale},
        {cell: (training_keys[cell], trainings[cell]) for cell in stale if cell not in known},
    )
    return {cell: fresh[cell] if cell in fresh else cached[cell][1] for cell in keys}


def _grid_frame(config: Config) -> pd.DataFrame:
    """The grid's cells (``cell`` + AXES + the extra axes, None where one leaves a cell alone)
    and ``run``, the id their results are stored under."""
    return _grid(config)[0].copy(deep=False)  # copy on write: the caller's to change


_GRIDS: dict[int, tuple[Config, tuple[pd.DataFrame, pd.DataFrame, str | None]]] = {}


def _grid(config: Config) -> tuple[pd.DataFrame, pd.DataFrame, str | None]:
    """The grid frame of ``config``, its runs (:func:`_runs_frame`) and its :func:`same_run_caption`,
    computed once per config, as :func:`_spec_digests`."""
    cached = _GRIDS.get(id(config))
    if cached is None or cached[0] is not config:
        if len(_GRIDS) > 64:
            _GRIDS.clear()
        grid = _new_grid_frame(config)
        cached = _GRIDS[id(config)] = (config, (grid, _runs_frame(grid), same_run_caption(grid)))
    return cached[1]


def _new_grid_frame(config: Config) -> pd.DataFrame:
    extra = list(config.grid.sweeps)
    cells = [(c, G.run_of(c)) for c in G.cells(config)]
    rows = [{"cell": c.id, **c.axes(), **c.sweep_values(), "run": r.id, "run_policy": r.policy} for c, r in cells]
    return cells_frame(rows, ["cell", *AXES, *extra, "run", "run_policy"])


def _runs_frame(cells: pd.DataFrame) -> pd.DataFrame:
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


def _selected(frame: pd.DataFrame, only: Mapping[str, Sequence] | None, skip: tuple[str, ...] = ()) -> pd.Series:
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


def _sorted_cells(per_cell: PerCell, config: Config, group_by: Sequence[str] = ()) -> PerCell:
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

    ``db_file`` is the SQLite file (``matrixrl.layout.store_path(results_dir)``);
    this reads it and refreshes its per-cell cache, it does not ingest result files.
    ``group_by`` (``"workflow,policy"`` or a list) sorts rows by those axes first;
    ConfigError if an axis is unknown or the table aggregates over it.
    ``only`` (``{axis: values}``, e.g. from ``--only``) keeps the rows of those
    cells; ``compare`` still takes its controls (the other policy mode, the
    ``single`` workflow) from the whole grid of ``config``, and keeps a row when
    every axis it names is selected. Per-cell tables (summary, diagnostics,
    mechanism) have a ``cell`` column first; tables may be empty. The mechanism
    table's one-line tally is in ``frame.attrs["caption"]``. ``against`` (``(axis, control
    value)``, from :func:`parse_against`) makes ``compare`` every value of that axis
    against the control instead of the built-in comparisons.
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

    grid = _grid_frame(config)
    selected = grid[_selected(grid, only)] if only else grid
    needed = selected
    if not only:
        pass  # the whole grid: its own controls
    elif "compare" in names and against is not None:
        # Controls: the control value's cells, matching the selection on every other axis.
        needed = grid[grid["cell"].isin(selected["cell"]) | _selected(grid, only, skip=(against[0],))]
    elif "compare" in names:
        # Controls: the other policy mode and the single workflow, for the selected tasks, scales and seeds.
        controls = _selected(grid, only, skip=("workflow", "policy")) & grid["workflow"].isin({*selected["workflow"], CONTROL})
        needed = grid[grid["cell"].isin(selected["cell"]) | controls]
    runs = _runs_frame(needed) if only else _grid(config)[1]
    current = current_specs(config, runs["cell"])

    def read() -> tuple[dict[str, dict], tuple[pd.DataFrame, pd.DataFrame] | None]:
        # One opening of the store for the records and the memory table's rows: opening it
        # is a good part of an incremental report's time.
        with Store(db_file) as store:
            records = cell_records(store, runs, config, current) if any(name not in FROM_STORE for name in names) else {}
            memory = _memory_rows(store, selected) if "memory" in names else None
            costs = store.rows("job_costs", _cost_owners(config, runs)) if "cost" in names else None
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
    per_selected = _sorted_cells(per_selected, config, axes)  # the per-cell tables keep this order

    same_run = same_run_caption(selected) if only else _grid(config)[2]
    frames = {}
    for name in names:
        if name == "compare":
            if against is not None:
                table = against_table(_evaluated(per_cell).frame(), *against, config.analysis.confidence)
            else:
                table = TABLES[name].build(per_cell, config.analysis.confidence)
            table = table[_selected(table, only)] if only else table
        elif name == "memory":
            table = _memory_frame(*memory_rows, config, selected, current)
        elif name == "cost":
            table = _cost_frame(costs, config)
        else:
            table = TABLES[name].build(per_selected, config.analysis.confidence)
        if not TABLES[name].per_cell:  # a per-cell table keeps the order of its rows, sorted already
            table = sort_rows(table, config, axes)
        if name == "mechanism":
            table.attrs["caption"] = mechanism_caption(table)
        elif name == "claims" and not table.empty:
            table.attrs["caption"] = CLAIMS_CAPTION
        elif name == "summary" and same_run is not None:
            table.attrs["caption"] = same_run
        frames[name] = table
    return frames, per_selected


def _cost_owners(config: Config, runs: pd.DataFrame) -> list[str]:
    """The store's owners of the selected runs' results, and of the memory built for their tasks."""
    from matrixrl.layout import MEMORY_OWNER

    return [*runs["cell"], *(f"{MEMORY_OWNER}{task}" for task in config.grid.task)]


def _cost_frame(costs: pd.DataFrame, config: Config) -> pd.DataFrame:
    """The cost table: the stored results' job costs and the base models' jobs, whose result
    files the store does not hold (read where the job graph puts them)."""
    from matrixrl.analysis.cost import cost_table
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
    """``{(run, mode): MemoryEvalSpec digest}`` of ``config``'s grid, once per config (as :func:`_spec_digests`)."""
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


def _memory_rows(store: Store, selected: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The store's ordinary and memory evaluations of the runs of the grid cells ``selected``
    (a grid frame), as the memory table reads them."""
    runs = list(dict.fromkeys(selected["run"]))
    memory = store.rows("memory_evaluations", runs)
    # Without memory evaluations the table is empty: reading every ordinary
    # evaluation for it would be most of an incremental report's time.
    return store.rows("evaluations", runs if not memory.empty else []), memory


def _memory_frame(
    evals: pd.DataFrame, memory: pd.DataFrame, config: Config, selected: pd.DataFrame, current: Mapping[str, tuple[str, str]]
) -> pd.DataFrame:
    """The memory table of the grid cells ``selected`` (a grid frame), from the store's memory
    evaluations and, for ``none``, its ordinary evaluations (those under the current spec),
    as :func:`_memory_rows` read them."""
    evals = current_evaluations(evals, current)
    memory = current_memory_evaluations(memory, config)
    cells = selected.drop(columns=["run_policy"])
    return memory_table(cells, evals, memory, memory_modes(config), config.analysis.confidence)


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
                else "list memory modes in grid.memory (docs/memory.md) and run `matrixrl run`"
            )
            raise ConfigError(f"{results}: no {needs} stored for the cells of this grid; {fix}")
        raise ConfigError(f"{results}: no {needs} stored for the cells of this grid; run `matrixrl run` first")
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
        if _shown(value) == raw or _same(value, raw):
            return axis, value
    names = [value for value in values if isinstance(value, str)]  # a number is another value, not a slip
    if (near := closest(raw, names)) is not None:
        raise ConfigError(f"--against {text!r}: {raw} is not a value of grid.{axis}; did you mean {near}?")
    raise ConfigError(
        f"--against {text!r}: {raw} is not a value of grid.{axis} [{', '.join(map(_shown, values))}]; use one of them"
    )


def _same(value, raw: str) -> bool:
    """Is ``raw`` (as typed) the grid's ``value``? ``1e-4`` is ``0.0001``."""
    import yaml

    try:
        typed = yaml.safe_load(raw)
    except yaml.YAMLError:
        return False
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(typed) == float(value)
        except (TypeError, ValueError):
            return False
    return typed == value
