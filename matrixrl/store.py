"""The SQLite store: every checkpoint's accuracy and every step's training metrics.

Result files are the truth; the store is an index over them that makes tables
quick to regenerate. ``ingest`` upserts files that are new or changed since they
were last read (keyed by path, size and mtime), all in one transaction, after
validating every one of them — a corrupt file aborts the ingest with nothing
written. Only the submitting host writes the store (never a cluster job).

For incremental reports the store also keeps, per cell, a digest of every result
it holds for that cell (``cell_inputs``: one row per train or eval result) and the
cell's cached summary with the cache key of what it was computed from
(``cell_summaries``); see :class:`Store` and ``matrixrl.report.tables``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import get_args
from pathlib import Path

import pandas as pd
from pydantic import BaseModel
from sqlalchemy import Boolean, Column, Float, Integer, MetaData, String, Table, Text, create_engine, delete, event, select
from sqlalchemy.orm import Session

from matrixrl import layout as L
from matrixrl.config import AXES
from matrixrl.errors import ConfigError
from matrixrl.layout import store_path
from matrixrl.results import DiagnosticRow, EvalResult, RoleMetric, StepMetrics, TrainResult, read_result


METADATA = MetaData()


def _table(name: str, keys: Mapping[str, type], values: Mapping[str, type], optional: Mapping[str, type] = {}) -> Table:
    """A table of primary-key columns ``keys``, required ``values`` and nullable ``optional`` ones."""
    return Table(
        name,
        METADATA,
        *(Column(column, kind, primary_key=True) for column, kind in keys.items()),
        *(Column(column, kind, nullable=False) for column, kind in values.items()),
        *(Column(column, kind, nullable=True) for column, kind in optional.items()),
    )


# A trained cell's axes, and the digest of the spec it was trained under.
CELLS = _table("cells", {"cell": String}, {axis: Integer if axis == "seed" else String for axis in AXES}, {"spec_digest": String})
# A digest of each result stored for a cell: part is "train" or "eval/step_N".
CELL_INPUTS = _table("cell_inputs", {"cell": String, "part": String}, {"digest": String})
# A cell's cached per-cell summary (JSON), the cache key of what it was computed from, how often it was.
CELL_SUMMARIES = _table(
    "cell_summaries", {"cell": String}, {"cache_key": String, "summary": Text, "computations": Integer, "computed_at": Float}
)
# Every result file read, by its path relative to the results directory, as it was then.
INGESTED_FILES = _table("ingested_files", {"path": String}, {"size": Integer, "mtime_ns": Integer})


# The tables that hold result files' contents are derived from the result models
# (matrixrl.results), so a field added there is a column here: a scalar field is a
# column of the same name; lists and mappings (roles, pass_at, ...) go to their own tables.
_SQL_TYPES = {int: Integer, float: Float, str: String, bool: Boolean}


def _result_columns(model: type[BaseModel], keys: Sequence[str] = (), exclude: Sequence[str] = ()) -> list[Column]:
    columns = []
    for name, field in model.model_fields.items():
        if name in exclude:
            continue
        members = get_args(field.annotation) or (field.annotation,)
        scalar = [m for m in members if m is not type(None)]
        if len(scalar) != 1 or scalar[0] not in _SQL_TYPES:
            raise TypeError(f"{model.__name__}.{name}: no SQL column for {field.annotation}; exclude it or store it in its own table")
        nullable = type(None) in members and name not in keys
        columns.append(Column(name, _SQL_TYPES[scalar[0]](), primary_key=name in keys, nullable=nullable))
    return columns


EVALUATIONS = Table(
    "evaluations", METADATA, *_result_columns(EvalResult, keys=("cell", "step"), exclude=("roles", "pass_at"))
)
TRAIN_STEPS = Table(
    "train_steps",
    METADATA,
    Column("cell", String, primary_key=True),
    *_result_columns(StepMetrics, keys=("step",)),
)
DIAGNOSTICS = Table(
    "diagnostics",
    METADATA,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("cell", String, index=True, nullable=False),
    *_result_columns(DiagnosticRow),
)
ROLE_METRICS = Table(
    "role_metrics",
    METADATA,
    Column("cell", String, primary_key=True),
    # train: one row per training step; eval: per checkpoint (the evaluation's step).
    Column("source", String, primary_key=True),
    *_result_columns(RoleMetric, keys=("step", "role", "metric")),
)


def engine_for(results_dir: str | Path):
    return engine_at(store_path(results_dir))


SCHEMA_VERSION = 3
"""SQLite's ``user_version`` of a store with these tables. A store of another version
is an index of an older layout: it is emptied and refilled from the result files,
which are the truth (``ingest`` reads every file again)."""


def engine_at(db_file: str | Path):
    """An engine on the SQLite file ``db_file`` (created, with every table, if missing;
    rebuilt empty if it was written by another schema version)."""
    engine = create_engine(f"sqlite:///{db_file}")

    @event.listens_for(engine, "connect")
    def _pragmas(conn, _):
        # Concurrent readers (report) wait for the one writer rather than failing.
        conn.execute("PRAGMA busy_timeout = 30000")

    with engine.begin() as conn:
        version = conn.exec_driver_sql("PRAGMA user_version").scalar()
        if version != SCHEMA_VERSION:
            tables = [row[0] for row in conn.exec_driver_sql("SELECT name FROM sqlite_master WHERE type = 'table'")]
            for table in tables:
                conn.exec_driver_sql(f'DROP TABLE "{table}"')
            METADATA.create_all(conn)
            conn.exec_driver_sql(f"PRAGMA user_version = {SCHEMA_VERSION}")
    return engine


@functools.cache
def _upsert_sql(table, columns: tuple[str, ...]) -> str:
    # Plain SQLite upsert text: SQLAlchemy cannot cache its compiled ON CONFLICT construct
    # and would recompile it for every result file.
    keys = [c.name for c in table.primary_key.columns]
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in keys)
    return (
        f"INSERT INTO {table.name} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))}) "
        f"ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {updates}"
    )


def _upsert(session: Session, table, rows: list[dict]) -> None:
    """Insert or update ``rows`` (dicts with the same keys) by primary key, as one executemany."""
    if rows:
        columns = tuple(rows[0])
        session.connection().exec_driver_sql(_upsert_sql(table, columns), [tuple(r[c] for c in columns) for r in rows])


def _digest(result: TrainResult | EvalResult) -> str:
    return hashlib.sha256(result.model_dump_json().encode()).hexdigest()


def _write_result(session: Session, result: TrainResult | EvalResult) -> None:
    """Replace everything the store holds from this one result, and record its digest."""
    if isinstance(result, TrainResult):
        _upsert(session, CELLS, [{"cell": result.cell, **result.axes, "spec_digest": result.spec_digest}])
        session.execute(delete(TRAIN_STEPS).where(TRAIN_STEPS.c.cell == result.cell))
        _upsert(session, TRAIN_STEPS, [{"cell": result.cell, **m.model_dump()} for m in result.metrics])
        session.execute(delete(DIAGNOSTICS).where(DIAGNOSTICS.c.cell == result.cell))
        if result.diagnostics:
            # A long run logs hundreds of thousands of rows: straight to the driver's executemany,
            # which is an order of magnitude faster than building SQLAlchemy parameters per row.
            columns = tuple(DiagnosticRow.model_fields)
            dumped = result.model_dump(include={"diagnostics"})["diagnostics"]
            session.connection().exec_driver_sql(
                f"INSERT INTO diagnostics (cell, {', '.join(columns)}) VALUES (?{', ?' * len(columns)})",
                [(result.cell, *(d[c] for c in columns)) for d in dumped],
            )
        _upsert(session, ROLE_METRICS, [{"cell": result.cell, "source": "train", **r.model_dump()} for r in result.roles])
        part = "train"
    elif isinstance(result, EvalResult):
        _upsert(session, EVALUATIONS, [result.model_dump(exclude={"roles", "pass_at"})])
        pass_rows = [{"role": "episode", "metric": f"pass@{j}", "value": v} for j, v in result.pass_at.items()]
        _upsert(
            session,
            ROLE_METRICS,
            [
                {"cell": result.cell, "source": "eval", **row, "step": result.step}
                for row in [*(r.model_dump(exclude={"step"}) for r in result.roles), *pass_rows]
            ],
        )
        part = f"eval/step_{result.step}"
    else:
        raise TypeError(f"expected a TrainResult or EvalResult, got {type(result).__name__}")
    _upsert(session, CELL_INPUTS, [{"cell": result.cell, "part": part, "digest": _digest(result)}])


def _known_files(results_dir: Path) -> dict[str, tuple[int, int]]:
    if not store_path(results_dir).exists():
        return {}
    engine = engine_for(results_dir)
    try:
        with Session(engine) as session:
            known = {row.path: (row.size, row.mtime_ns) for row in session.execute(select(INGESTED_FILES))}
            if known and session.execute(select(CELL_INPUTS.c.cell).limit(1)).first() is None:
                # A store written before per-cell digests existed: read every file once more
                # so each cell gets its digests (and incremental reports see it).
                return {}
            return known
    finally:
        engine.dispose()


def _changed_files(results_dir: Path) -> list[tuple[Path, str, object]]:
    known = _known_files(results_dir)
    found = []
    for pattern, kind in ((L.TRAIN_RESULTS, TrainResult), (L.EVAL_RESULTS, EvalResult)):
        for path in sorted(results_dir.glob(pattern)):
            rel = str(path.relative_to(results_dir))
            stat = path.stat()
            if known.get(rel) != (stat.st_size, stat.st_mtime_ns):
                found.append((path, rel, kind))
    return found


def ingest(results_dir: str | Path) -> int:
    """Upsert new or changed result files; returns how many files were read.

    Every file is read and validated before the store is opened for writing, so an
    unusable one raises ``ResultFileError`` with nothing written (not even a new,
    empty store).
    """
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        return 0
    pending = _changed_files(results_dir)
    parsed = [(path, rel, read_result(path, kind)) for path, rel, kind in pending]
    if not parsed:
        return 0
    engine = engine_for(results_dir)
    with Session(engine) as session, session.begin():
        for path, rel, result in parsed:
            _write_result(session, result)
            stat = path.stat()
            _upsert(session, INGESTED_FILES, [{"path": rel, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}])
    engine.dispose()
    return len(parsed)


def ingest_for_report(results_dir: str | Path) -> None:
    """``ingest`` before a report or a plot; ConfigError when there is nothing to read at all."""
    if not L.has_results(results_dir):
        raise ConfigError(f"{Path(results_dir)}: no results yet; run `matrixrl run` first")
    ingest(results_dir)


def read_table(results_dir: str | Path, table: str) -> pd.DataFrame:
    """One store table as a DataFrame (empty, with its columns, if nothing is stored)."""
    engine = engine_for(results_dir)
    try:
        with engine.connect() as conn:
            return pd.read_sql_table(table, conn)
    finally:
        engine.dispose()


# SQLite's limit on bound values also caps ``cell IN (...)`` lists.
_IN_CHUNK = 10_000


class Store:
    """One store file: per-cell reads, the results API, and the per-cell summary cache.

    ``Store(path)`` opens (or creates) the SQLite file at ``path``; use it as a
    context manager, or call :meth:`close`.
    """

    def __init__(self, db_file: str | Path):
        self.path = Path(db_file)
        self.engine = engine_at(self.path)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def add_results(self, results: Iterable[TrainResult | EvalResult]) -> int:
        """Store results as ``ingest`` would store their files (one transaction); returns how many."""
        count = 0
        with Session(self.engine) as session, session.begin():
            for result in results:
                _write_result(session, result)
                count += 1
        return count

    def rows(self, table: str, cells: Sequence[str], **equal: str | Sequence[str]) -> pd.DataFrame:
        """The rows of ``table`` for ``cells``; each keyword keeps rows whose column equals it (or is in it)."""
        sql_table = METADATA.tables[table]
        frames = []
        with self.engine.connect() as conn:
            for start in range(0, max(len(cells), 1), _IN_CHUNK):
                query = select(sql_table).where(sql_table.c.cell.in_(list(cells[start : start + _IN_CHUNK])))
                for column, wanted in equal.items():
                    values = [wanted] if isinstance(wanted, str) else list(wanted)
                    query = query.where(sql_table.c[column].in_(values))
                frames.append(pd.read_sql(query, conn))
        return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]

    def input_digests(self, cells: Sequence[str]) -> dict[str, list[tuple[str, str]]]:
        """Per cell, the sorted ``(part, digest)`` of every result stored for it; cells with none are absent."""
        found: dict[str, list[tuple[str, str]]] = {}
        for row in self.rows("cell_inputs", cells).sort_values(["cell", "part"]).itertuples(index=False):
            found.setdefault(row.cell, []).append((row.part, row.digest))
        return found

    def cached_summaries(self, cells: Sequence[str]) -> dict[str, tuple[str, dict]]:
        """Per cell, the cached ``(cache key, summary)``; cells never summarized are absent."""
        frame = self.rows("cell_summaries", cells)
        return {row.cell: (row.cache_key, json.loads(row.summary)) for row in frame.itertuples(index=False)}

    def save_summaries(self, summaries: Mapping[str, tuple[str, dict]]) -> None:
        """Cache ``{cell: (cache key, summary)}``, counting each cell's computations."""
        if not summaries:
            return
        now = time.time()
        rows = [(cell, key, json.dumps(summary, allow_nan=False), now) for cell, (key, summary) in summaries.items()]
        sql = (
            "INSERT INTO cell_summaries (cell, cache_key, summary, computations, computed_at) VALUES (?, ?, ?, 1, ?) "
            "ON CONFLICT (cell) DO UPDATE SET cache_key = excluded.cache_key, summary = excluded.summary, "
            "computed_at = excluded.computed_at, computations = cell_summaries.computations + 1"
        )
        with Session(self.engine) as session, session.begin():
            session.connection().exec_driver_sql(sql, rows)

    def computations(self) -> dict[str, int]:
        """How many times each cell's summary has been computed (it is cached in between)."""
        with self.engine.connect() as conn:
            return dict(conn.execute(select(CELL_SUMMARIES.c.cell, CELL_SUMMARIES.c.computations)).all())
