"""The SQLite store: every checkpoint's accuracy and every step's training metrics.

Result files are the truth; the store is an index over them that makes tables
quick to regenerate. ``ingest`` upserts files that are new or changed since they
were last read (keyed by path, size and mtime), all in one transaction, after
validating every one of them — a corrupt file aborts the ingest with nothing
written. Only the submitting host writes the store (never a cluster job).

For incremental reports the store also keeps, per cell, a digest of every result
it holds for that cell (``cell_inputs``: one row per train or eval result) and the
cell's cached summary with the fingerprint it was computed from
(``cell_summaries``); see :class:`Store` and ``matrixrl.report.tables``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import pandas as pd
from sqlalchemy import Boolean, Float, Integer, String, Text, create_engine, event, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from matrixrl.grid import STORE_FILE
from matrixrl.results import EvalResult, TrainResult, read_result


class Base(DeclarativeBase):
    pass


class CellRow(Base):
    __tablename__ = "cells"
    cell: Mapped[str] = mapped_column(String, primary_key=True)
    workflow: Mapped[str] = mapped_column(String)
    task: Mapped[str] = mapped_column(String)
    scale: Mapped[str] = mapped_column(String)
    policy: Mapped[str] = mapped_column(String)
    seed: Mapped[int] = mapped_column(Integer)
    spec_digest: Mapped[str | None] = mapped_column(String, nullable=True)  # of the spec it was trained under


class EvaluationRow(Base):
    __tablename__ = "evaluations"
    cell: Mapped[str] = mapped_column(String, primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    accuracy: Mapped[float] = mapped_column(Float)  # mean pass@1
    n: Mapped[int] = mapped_column(Integer)  # problems
    n_correct: Mapped[int] = mapped_column(Integer)  # correct completions of n * samples
    seconds: Mapped[float] = mapped_column(Float)
    samples: Mapped[int] = mapped_column(Integer, default=1)
    se: Mapped[float | None] = mapped_column(Float, nullable=True)  # None: a file from before SEs were stored
    spec_digest: Mapped[str | None] = mapped_column(String, nullable=True)


class TrainStepRow(Base):
    __tablename__ = "train_steps"
    cell: Mapped[str] = mapped_column(String, primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    reward_mean: Mapped[float] = mapped_column(Float)
    reward_std: Mapped[float] = mapped_column(Float)
    loss: Mapped[float] = mapped_column(Float)
    entropy: Mapped[float] = mapped_column(Float)
    response_length: Mapped[float] = mapped_column(Float)
    grad_norm: Mapped[float] = mapped_column(Float)
    clip_fraction: Mapped[float] = mapped_column(Float)
    group_size: Mapped[int] = mapped_column(Integer)
    seconds: Mapped[float] = mapped_column(Float)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)


class DiagnosticRowTable(Base):
    __tablename__ = "diagnostics"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    cell: Mapped[str] = mapped_column(String, index=True)
    step: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String)
    role: Mapped[str | None] = mapped_column(String, nullable=True)
    agent: Mapped[str | None] = mapped_column(String, nullable=True)
    other: Mapped[str | None] = mapped_column(String, nullable=True)
    value: Mapped[float] = mapped_column(Float)


class RoleMetricRow(Base):
    """A role's own metric, per training step (``source='train'``) or checkpoint (``'eval'``)."""

    __tablename__ = "role_metrics"
    cell: Mapped[str] = mapped_column(String, primary_key=True)
    source: Mapped[str] = mapped_column(String, primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    role: Mapped[str] = mapped_column(String, primary_key=True)
    metric: Mapped[str] = mapped_column(String, primary_key=True)
    value: Mapped[float] = mapped_column(Float)


class CellInputRow(Base):
    """A digest of one result stored for a cell: ``part`` is ``train`` or ``eval/step_N``."""

    __tablename__ = "cell_inputs"
    cell: Mapped[str] = mapped_column(String, primary_key=True)
    part: Mapped[str] = mapped_column(String, primary_key=True)
    digest: Mapped[str] = mapped_column(String)


class CellSummaryRow(Base):
    """A cell's cached per-cell summary (JSON) and the fingerprint of what it was computed from."""

    __tablename__ = "cell_summaries"
    cell: Mapped[str] = mapped_column(String, primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String)
    summary: Mapped[str] = mapped_column(Text)
    computations: Mapped[int] = mapped_column(Integer, default=1)
    computed_at: Mapped[float] = mapped_column(Float)


class IngestedFile(Base):
    __tablename__ = "ingested_files"
    path: Mapped[str] = mapped_column(String, primary_key=True)
    size: Mapped[int] = mapped_column(Integer)
    mtime_ns: Mapped[int] = mapped_column(Integer)
    ok: Mapped[bool] = mapped_column(Boolean, default=True)


def store_path(results_dir: str | Path) -> Path:
    return Path(results_dir) / STORE_FILE


def engine_for(results_dir: str | Path):
    return engine_at(store_path(results_dir))


SCHEMA_VERSION = 2
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
            Base.metadata.create_all(conn)
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
        session.connection().exec_driver_sql(_upsert_sql(table.__table__, columns), [tuple(r[c] for c in columns) for r in rows])


def _digest(result: TrainResult | EvalResult) -> str:
    return hashlib.sha256(result.model_dump_json().encode()).hexdigest()


def _write_result(session: Session, result: TrainResult | EvalResult) -> None:
    """Replace everything the store holds from this one result, and record its digest."""
    if isinstance(result, TrainResult):
        _upsert(session, CellRow, [{"cell": result.cell, **result.axes, "spec_digest": result.spec_digest}])
        session.query(TrainStepRow).filter(TrainStepRow.cell == result.cell).delete()
        _upsert(session, TrainStepRow, [{"cell": result.cell, **m.model_dump()} for m in result.metrics])
        session.query(DiagnosticRowTable).filter(DiagnosticRowTable.cell == result.cell).delete()
        if result.diagnostics:
            # A long run logs hundreds of thousands of rows: straight to the driver's executemany,
            # which is an order of magnitude faster than building SQLAlchemy parameters per row.
            columns = ("step", "kind", "role", "agent", "other", "value")
            dumped = result.model_dump(include={"diagnostics"})["diagnostics"]
            session.connection().exec_driver_sql(
                f"INSERT INTO diagnostics (cell, {', '.join(columns)}) VALUES (?{', ?' * len(columns)})",
                [(result.cell, *(d[c] for c in columns)) for d in dumped],
            )
        _upsert(session, RoleMetricRow, [{"cell": result.cell, "source": "train", **r.model_dump()} for r in result.roles])
        part = "train"
    elif isinstance(result, EvalResult):
        _upsert(session, EvaluationRow, [result.model_dump(exclude={"roles", "pass_at"})])
        pass_rows = [{"role": "episode", "metric": f"pass@{j}", "value": v} for j, v in result.pass_at.items()]
        _upsert(
            session,
            RoleMetricRow,
            [
                {"cell": result.cell, "source": "eval", **row, "step": result.step}
                for row in [*(r.model_dump(exclude={"step"}) for r in result.roles), *pass_rows]
            ],
        )
        part = f"eval/step_{result.step}"
    else:
        raise TypeError(f"expected a TrainResult or EvalResult, got {type(result).__name__}")
    _upsert(session, CellInputRow, [{"cell": result.cell, "part": part, "digest": _digest(result)}])


def _known_files(results_dir: Path) -> dict[str, tuple[int, int]]:
    if not store_path(results_dir).exists():
        return {}
    engine = engine_for(results_dir)
    try:
        with Session(engine) as session:
            known = {row.path: (row.size, row.mtime_ns) for row in session.scalars(select(IngestedFile))}
            if known and session.scalars(select(CellInputRow.cell).limit(1)).first() is None:
                # A store written before per-cell digests existed: read every file once more
                # so each cell gets its digests (and incremental reports see it).
                return {}
            return known
    finally:
        engine.dispose()


def _changed_files(results_dir: Path) -> list[tuple[Path, str, object]]:
    known = _known_files(results_dir)
    found = []
    for pattern, kind in (("cells/*/train.json", TrainResult), ("cells/*/eval/step_*.json", EvalResult)):
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
            _upsert(session, IngestedFile, [{"path": rel, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "ok": True}])
    engine.dispose()
    return len(parsed)


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
        sql_table = Base.metadata.tables[table]
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
        """Per cell, the cached ``(fingerprint, summary)``; cells never summarized are absent."""
        frame = self.rows("cell_summaries", cells)
        return {row.cell: (row.fingerprint, json.loads(row.summary)) for row in frame.itertuples(index=False)}

    def save_summaries(self, summaries: Mapping[str, tuple[str, dict]]) -> None:
        """Cache ``{cell: (fingerprint, summary)}``, counting each cell's computations."""
        if not summaries:
            return
        now = time.time()
        rows = [(cell, fp, json.dumps(summary, allow_nan=False), now) for cell, (fp, summary) in summaries.items()]
        sql = (
            "INSERT INTO cell_summaries (cell, fingerprint, summary, computations, computed_at) VALUES (?, ?, ?, 1, ?) "
            "ON CONFLICT (cell) DO UPDATE SET fingerprint = excluded.fingerprint, summary = excluded.summary, "
            "computed_at = excluded.computed_at, computations = cell_summaries.computations + 1"
        )
        with Session(self.engine) as session, session.begin():
            session.connection().exec_driver_sql(sql, rows)

    def computations(self) -> dict[str, int]:
        """How many times each cell's summary has been computed (it is cached in between)."""
        with self.engine.connect() as conn:
            return dict(conn.execute(select(CellSummaryRow.cell, CellSummaryRow.computations)).all())
