"""The SQLite store: every checkpoint's accuracy and every step's training metrics.

Result files are the truth; the store is an index over them that makes tables
quick to regenerate. ``ingest`` upserts files that are new or changed since they
were last read (keyed by path, size and mtime), all in one transaction, after
validating every one of them — a corrupt file aborts the ingest with nothing
written. Only the submitting host writes the store (never a cluster job).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from sqlalchemy import Boolean, Float, Integer, String, create_engine, event, select
from sqlalchemy.dialects.sqlite import insert
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


class EvaluationRow(Base):
    __tablename__ = "evaluations"
    cell: Mapped[str] = mapped_column(String, primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    accuracy: Mapped[float] = mapped_column(Float)
    n: Mapped[int] = mapped_column(Integer)
    n_correct: Mapped[int] = mapped_column(Integer)
    seconds: Mapped[float] = mapped_column(Float)


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


class IngestedFile(Base):
    __tablename__ = "ingested_files"
    path: Mapped[str] = mapped_column(String, primary_key=True)
    size: Mapped[int] = mapped_column(Integer)
    mtime_ns: Mapped[int] = mapped_column(Integer)
    ok: Mapped[bool] = mapped_column(Boolean, default=True)


def store_path(results_dir: str | Path) -> Path:
    return Path(results_dir) / STORE_FILE


def engine_for(results_dir: str | Path):
    engine = create_engine(f"sqlite:///{store_path(results_dir)}")

    @event.listens_for(engine, "connect")
    def _pragmas(conn, _):
        # Concurrent readers (report) wait for the one writer rather than failing.
        conn.execute("PRAGMA busy_timeout = 30000")

    Base.metadata.create_all(engine)
    return engine


def _upsert(session: Session, table, rows: list[dict]) -> None:
    if not rows:
        return
    keys = [c.name for c in table.__table__.primary_key.columns]
    stmt = insert(table.__table__).values(rows)
    updates = {c: stmt.excluded[c] for c in rows[0] if c not in keys}
    session.execute(stmt.on_conflict_do_update(index_elements=keys, set_=updates))


def _known_files(results_dir: Path) -> dict[str, tuple[int, int]]:
    if not store_path(results_dir).exists():
        return {}
    engine = engine_for(results_dir)
    try:
        with Session(engine) as session:
            return {row.path: (row.size, row.mtime_ns) for row in session.scalars(select(IngestedFile))}
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
            if isinstance(result, TrainResult):
                _upsert(session, CellRow, [{"cell": result.cell, **result.axes}])
                session.query(TrainStepRow).filter(TrainStepRow.cell == result.cell).delete()
                _upsert(session, TrainStepRow, [{"cell": result.cell, **m.model_dump()} for m in result.metrics])
                session.query(DiagnosticRowTable).filter(DiagnosticRowTable.cell == result.cell).delete()
                rows = [{"cell": result.cell, **d.model_dump()} for d in result.diagnostics]
                if rows:
                    session.execute(DiagnosticRowTable.__table__.insert(), rows)
                _upsert(session, RoleMetricRow, [{"cell": result.cell, "source": "train", **r.model_dump()} for r in result.roles])
            else:
                _upsert(session, EvaluationRow, [result.model_dump(exclude={"roles"})])
                _upsert(
                    session,
                    RoleMetricRow,
                    [{"cell": result.cell, "source": "eval", **r.model_dump(), "step": result.step} for r in result.roles],
                )
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
