"""The SQLite store: every checkpoint's accuracy and every step's training metrics.

Result files are the truth; the store is an index over them that mirrors them
exactly and makes tables quick to regenerate. ``ingest`` upserts files that are
new or changed since they were last read (keyed by path, size, mtime and inode;
a file that changed within two seconds of its reading is read once more next
time, and only a result whose digest differs is written) and deletes the rows of
files that are gone, all in one transaction, after validating every file it
reads — a corrupt file aborts the ingest with nothing written. Only the
submitting host writes the store (never a cluster job).

Besides the cells' training and evaluation files it holds the memory's (MemCollab,
docs/memory.md): each checkpoint's evaluation under a memory mode
(``memory_evaluations``, ``memory_role_metrics``) and what each of its problems was
shown (``retrievals``), and what the memory was built from: trajectories, labels, the
distiller's prompts and replies (``distill_prompts``) and every memory's entries with
their provenance (``memory_entries``), one row per such file in ``memory_builds``.
A memory-building result belongs to no cell: ``ingested_files`` names it by
``memory:TASK`` and its part (``trajectories/SCALE-kN``, ``labels``, ``distilled/BANK``,
``bank/BANK``), and a memory evaluation by its cell and ``memory/MODE/step_N``. Their
digests are kept in ``memory_inputs``, apart from ``cell_inputs``, so that a memory
result never changes a cell's summary cache key.

For incremental reports the store also keeps, per cell, a digest of every result
it holds for that cell and the spec digest it was computed under (``cell_inputs``:
one row per train or eval result; ``cell_keys``: the SHA-256 of all of them in one
row per cell, rewritten with every write), and caches, each entry with the cache key
of what it was computed from: the cell's summary (``cell_summaries``), what the
summary takes from its training alone (``cell_trainings``), and the HTML page's drawn
figures (``figures``); see :class:`Store`, ``matrixrl.report.tables`` and ``.html``.

A store that cannot be used — not a SQLite file, truncated or malformed, a table
missing or with other columns than these, written by another schema version — is
moved aside (``matrixrl.sqlite.damaged-YYYYmmdd-HHMMSS``, with its journal if
any), said so in one line on stderr, and rebuilt from the result files. Every
open (:func:`engine_at`) checks what is cheap to check: the header, the schema
version, every table's columns. ``PRAGMA quick_check`` reads the whole file (about
75 ms for a 35 MB store, 0.6 s for the 210 MB one of ``bench/report.py``), so it
runs only when an operation on the store fails (:func:`repairing`), to tell a
damaged file from any other error. A store that cannot be moved aside is a
:class:`StoreError` naming the fix.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import sqlite3
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, TypeVar, get_args, get_origin

import pandas as pd
import sqlalchemy.exc
from pydantic import BaseModel
from sqlalchemy import Boolean, Column, Float, Integer, LargeBinary, MetaData, String, Table, Text, create_engine, delete, event, select
from sqlalchemy.orm import Session

from matrixrl import layout as L
from matrixrl.config import AXES
from matrixrl.errors import ConfigError, DiskError, ResultFileError, UserError, disk_errors_named
from matrixrl.layout import STORE_FILE, store_path
from matrixrl.results import (
    INT64_MAX,
    BankResult,
    DiagnosticRow,
    DistilledResult,
    EvalResult,
    LabelsResult,
    MemoryEvalResult,
    RoleMetric,
    StepMetrics,
    TrainResult,
    TrajectoriesResult,
    read_result,
)


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
# A digest of each result stored for a cell (part: "train" or "eval/step_N"), and of the
# spec it was computed under (None in files written before spec digests).
CELL_INPUTS = _table("cell_inputs", {"cell": String, "part": String}, {"digest": String}, {"spec_digest": String})
# Per cell, its cell_inputs in one text ("part digest spec_digest ..." by part, "-" for no spec digest),
# the spec digest of its training ("-": none written) and those of its evaluations (comma-separated):
# what a report's cache keys are made of, kept up to date by every write of cell_inputs.
CELL_KEYS = _table("cell_keys", {"cell": String}, {"inputs": Text}, {"train_spec": String, "eval_specs": String})
# A cell's cached per-cell summary (JSON), the cache key of what it was computed from, how often it was.
CELL_SUMMARIES = _table(
    "cell_summaries", {"cell": String}, {"cache_key": String, "summary": Text, "computations": Integer, "computed_at": Float}
)
# What a cell's summary takes from its training alone (JSON, see analysis.cell.training_part) and
# the cache key of what it was computed from: kept while the cell's evaluations come in.
CELL_TRAININGS = _table("cell_trainings", {"cell": String}, {"cache_key": String, "training": Text})
# The report's figures as drawn (PNG), by name, and the cache key of what each was drawn from.
FIGURES = _table("figures", {"name": String}, {"cache_key": String, "png": LargeBinary})
# Every result file read, by its path relative to the results directory, as it was then, when
# it was read (read_ns, see RACY_NS), and the result it holds (its cell_inputs key): what to
# delete when the file is gone.
INGESTED_FILES = _table(
    "ingested_files",
    {"path": String},
    {"size": Integer, "mtime_ns": Integer, "inode": Integer, "read_ns": Integer, "cell": String, "part": String},
)


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
        # A bounded type (matrixrl.results.Count, ...) is its plain type annotated with its bounds.
        scalar = [get_args(m)[0] if get_origin(m) is Annotated else m for m in members if m is not type(None)]
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

# --- MemCollab's memory (docs/memory.md) ---------------------------------------------------------
# A checkpoint's evaluation under a memory mode (``memory``: own, transfer, ...; ``bank``: the
# memory it read): the columns of ``evaluations`` and the memory's. Its per-role metrics and
# pass@j are in memory_role_metrics, as role_metrics holds an evaluation's.
MEMORY_EVALUATIONS = Table(
    "memory_evaluations",
    METADATA,
    *_result_columns(MemoryEvalResult, keys=("cell", "memory", "step"), exclude=("roles", "pass_at", "retrievals")),
)
MEMORY_ROLE_METRICS = _table(
    "memory_role_metrics",
    {"cell": String, "memory": String, "step": Integer, "role": String, "metric": String},
    {"value": Float},
)
# What each evaluation problem was shown: one row per entry, ``rank`` its place in the prompt,
# ``entry`` its index among the bank's entries (memory_entries.entry of the evaluation's bank);
# a problem shown nothing has one row of rank 0 and no entry (its label is still the query's).
RETRIEVALS = _table(
    "retrievals",
    {"cell": String, "memory": String, "step": Integer, "problem_id": String, "rank": Integer},
    {"bank": String, "label": String},
    {"entry": Integer},
)
# One model's trajectories on a task's memory-building problems (a TrajectoriesResult per
# (task, scale, samples)): matrixrl.memory.Trajectory's fields.
TRAJECTORIES = _table(
    "trajectories",
    {"task": String, "scale": String, "samples": Integer, "problem_id": String, "sample": Integer},
    {"question": Text, "model": String, "completion": Text, "answer": Text, "correct": Boolean, "tokens": Integer},
)
# A task's problem labels (building and evaluation problems) and the labeller's replies.
MEMORY_LABELS = _table(
    "memory_labels",
    {"task": String, "problem_id": String},
    {"labeller": String},
    {"category": String, "subcategory": String, "reply": Text},
)
# A memory's entries, ready for retrieval (a BankResult), with their provenance: the source
# problem, its label, the models whose trajectories they came from (a JSON list), the mode that
# built them and the digest of the distiller's prompt (distill_prompts.digest).
MEMORY_ENTRIES = _table(
    "memory_entries",
    {"task": String, "bank": String, "entry": Integer},
    {
        "text": Text, "problem_id": String, "question": Text, "category": String, "subcategory": String,
        "models": String, "mode": String, "distiller": String,
    },
)  # fmt: skip
# Every distiller call of a memory (a DistilledResult): its prompt, its reply, how many
# constraints were kept and how many candidate lines dropped, by reason (JSON).
DISTILL_PROMPTS = _table(
    "distill_prompts",
    {"task": String, "bank": String, "prompt": Integer},
    {"problem_id": String, "digest": String, "system": Text, "user": Text, "reply": Text, "kept": Integer, "dropped": Text},
)
# One row per memory-building result (``part``: trajectories/SCALE-kN, labels, distilled/BANK,
# bank/BANK) with its scalar fields; ``dropped`` (JSON) for a distillation.
MEMORY_BUILDS = _table(
    "memory_builds",
    {"task": String, "part": String},
    {"kind": String},
    {
        "bank": String, "mode": String, "scale": String, "samples": Integer, "distiller": String,
        "labeller": String, "pairs": Integer, "entries": Integer, "accuracy": Float, "seconds": Float,
        "dropped": Text, "spec_digest": String,
    },
)  # fmt: skip
# A digest of each memory result stored (as cell_inputs of a cell's train and eval results):
# a memory evaluation by its cell (part: memory/MODE/step_N), a memory-building result by
# ``memory:TASK`` (part as memory_builds'). Apart from cell_inputs, so that the per-cell summary
# caches, keyed by a cell's cell_inputs, are not invalidated by memory results.
MEMORY_INPUTS = _table("memory_inputs", {"cell": String, "part": String}, {"digest": String}, {"spec_digest": String})


def engine_for(results_dir: str | Path):
    return engine_at(store_path(results_dir))


SCHEMA_VERSION = 7
"""SQLite's ``user_version`` of a store with these tables. A store of another version
is an index of another layout: it is moved aside and rebuilt from the result files,
which are the truth (like a damaged one)."""

_COMPANIONS = ("-journal", "-wal", "-shm")
"""The files SQLite keeps next to a database while it writes it."""


class StoreError(UserError):
    """A store that cannot be used and cannot be moved aside to be rebuilt."""


@dataclass(frozen=True)
class _Problem:
    """Why a store file cannot be used, as the note and the error say it."""

    was: str  # "was damaged (...)": the note, after it was moved aside
    now: str  # "is damaged (...)": the error, when it cannot be moved
    inode: int  # of the file inspected: another process may have replaced it since
    kind: str = "damaged"  # the moved file's suffix: NAME.KIND-YYYYmmdd-HHMMSS


def _damaged(reason: str, inode: int) -> _Problem:
    reason = " ".join(reason.split())  # one line
    return _Problem(f"was damaged ({reason})", f"is damaged ({reason})", inode)


_NEW = "new"
"""What :func:`_inspect` says of a missing or empty store file: create its tables."""


@functools.cache
def _expected_columns() -> dict[str, list[tuple]]:
    """``PRAGMA table_info`` of every table, as this module creates them."""
    engine = create_engine("sqlite://")
    try:
        with engine.begin() as conn:
            METADATA.create_all(conn)
            return {
                name: [tuple(row) for row in conn.exec_driver_sql(f'PRAGMA table_info("{name}")')]
                for name in METADATA.tables
            }
    finally:
        engine.dispose()


def _column_difference(table: str, found: list[tuple], expected: list[tuple]) -> str:
    names, wanted = [row[1] for row in found], [row[1] for row in expected]
    missing = [n for n in wanted if n not in names]
    extra = [n for n in names if n not in wanted]
    said = []
    if missing:
        said.append(f"has no column {', '.join(missing)}")
    if extra:
        said.append(f"has an unexpected column {', '.join(extra)}")
    return f"table {table} " + (" and ".join(said) or "has other column types or keys than expected")


def _inspect(db_file: Path, thorough: bool = False) -> _Problem | str | None:
    """What makes ``db_file`` unusable as a store of this version (a :class:`_Problem`);
    ``_NEW`` if it is missing or an empty database; None if it is usable.

    Only reads. Cheap: the header, the version and each table's columns (a
    millisecond); ``thorough`` adds ``PRAGMA quick_check``, which reads the whole file.
    Raises ``sqlite3.OperationalError`` (a lock held too long, say): not damage.
    """
    try:
        stat = db_file.stat()
    except FileNotFoundError:
        return _NEW
    if stat.st_size == 0:
        return _NEW  # SQLite's empty database: a store being created
    try:
        # mode=rw: never create a file that is gone by now
        conn = sqlite3.connect(f"{db_file.resolve().as_uri()}?mode=rw", uri=True, timeout=30)
    except sqlite3.OperationalError:
        if not db_file.exists():
            return _NEW
        raise
    try:
        # One read transaction: what it reads is one committed state, never a writer's half-written one.
        conn.execute("BEGIN")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if version == 0 and not tables:
            return _NEW
        if version != SCHEMA_VERSION:
            said = f"written by another version of matrixrl (store schema {version}, this one uses {SCHEMA_VERSION})"
            return _Problem(f"was {said}", f"was {said}", stat.st_ino, kind=f"schema-{version}")
        for table, expected in _expected_columns().items():
            if table not in tables:
                return _damaged(f"table {table} is missing", stat.st_ino)
            found = [tuple(row) for row in conn.execute(f'PRAGMA table_info("{table}")')]
            if found != expected:
                return _damaged(_column_difference(table, found, expected), stat.st_ino)
        if thorough:
            verdict = conn.execute("PRAGMA quick_check(1)").fetchone()[0]
            if verdict != "ok":
                return _damaged(verdict, stat.st_ino)
        return None
    except sqlite3.OperationalError:
        raise
    except sqlite3.DatabaseError as exc:  # "file is not a database", "database disk image is malformed"
        return _damaged(str(exc), stat.st_ino)
    finally:
        conn.close()


def _set_aside(db_file: Path, problem: _Problem) -> None:
    """Move the unusable store (and its journal) to ``NAME.damaged-YYYYmmdd-HHMMSS`` next to it
    (``NAME.schema-N-…`` for another version's store, which an older matrixrl can still read),
    and say so in one line on stderr; StoreError (how to fix it) if it cannot be moved."""
    try:
        if db_file.stat().st_ino != problem.inode:
            return  # another process has moved it aside already and started a new store
    except FileNotFoundError:
        return
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = db_file.with_name(f"{db_file.name}.{problem.kind}-{stamp}")
    n = 1
    while any(Path(f"{aside}{suffix}").exists() for suffix in ("", *_COMPANIONS)):
        aside = db_file.with_name(f"{db_file.name}.{problem.kind}-{stamp}-{n}")
        n += 1
    try:
        os.rename(db_file, aside)
        for suffix in _COMPANIONS:
            if Path(f"{db_file}{suffix}").exists():
                # A journal left next to a new store would be played back into it.
                os.rename(f"{db_file}{suffix}", f"{aside}{suffix}")
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StoreError(
            f"{db_file} {problem.now} and cannot be moved aside ({exc.strerror or exc}); "
            f"make {db_file.parent} writable or delete the file, then run the command again "
            f"to rebuild the store from the result files"
        ) from None
    print(f"note: {db_file} {problem.was}; moved it to {aside}, rebuilding the store from the result files", file=sys.stderr)


def _rebuild(db_file: Path) -> None:
    """Fill a new store at ``db_file`` from the result files next to it (a results directory's store)."""
    if db_file.name == STORE_FILE:
        ingest(db_file.parent)


def _fill(db_file: Path) -> None:
    engine = create_engine(f"sqlite:///{db_file}")
    try:
        with engine.begin() as conn:
            METADATA.create_all(conn)
            conn.exec_driver_sql(f"PRAGMA user_version = {SCHEMA_VERSION}")
    finally:
        engine.dispose()


def _create(db_file: Path) -> None:
    """A new store with every table, created whole: no other process sees one half made."""
    if db_file.exists():  # SQLite's empty database: fill it where it is
        _fill(db_file)
        return
    new = db_file.with_name(f".{db_file.name}.new-{os.getpid()}")
    try:
        _fill(new)
        try:
            os.link(new, db_file)  # fails if another process created one meanwhile: keep that one
        except FileExistsError:
            pass
        except OSError:  # a file system without hard links
            if not db_file.exists():
                os.replace(new, db_file)
    finally:
        new.unlink(missing_ok=True)


def engine_at(db_file: str | Path):
    """An engine on the SQLite store ``db_file``, the one way the store is opened.

    A missing store is created with every table. An unusable one (damaged, or of
    another schema version; see :func:`_inspect`) is moved aside with a one-line
    note on stderr and, if it is a results directory's store, rebuilt from its
    result files first.
    """
    db_file = Path(db_file)
    with disk_errors_named(db_file, "the store"):
        state = _inspect(db_file)
        if isinstance(state, _Problem):
            _set_aside(db_file, state)
            _rebuild(db_file)
            state = _NEW if not db_file.exists() else None
        if state == _NEW:
            _create(db_file)
    engine = create_engine(f"sqlite:///{db_file}")

    @event.listens_for(engine, "connect")
    def _pragmas(conn, _):
        # Concurrent readers (report) wait for the one writer rather than failing.
        conn.execute("PRAGMA busy_timeout = 30000")
        conn.create_function("sha256_hex", 1, _sha256_hex, deterministic=True)  # _refresh_keys's cell keys

    return engine


def _sqlite_error(exc: BaseException) -> sqlite3.DatabaseError | None:
    """The SQLite error of damage (not a lock or a query's own error) behind ``exc``, if any."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError):
            return exc
        exc = getattr(exc, "orig", None) or exc.__cause__ or exc.__context__
    return None


T = TypeVar("T")
_DATABASE_ERRORS = (sqlalchemy.exc.DatabaseError, sqlite3.DatabaseError, pd.errors.DatabaseError)


def repairing(db_file: str | Path, action: Callable[[], T], *, rebuild: bool = True) -> T:
    """``action()`` (which opens the store ``db_file`` itself, and closes it); if it fails
    because the file is damaged (``PRAGMA quick_check`` says so), the store is moved aside
    with a note, rebuilt from the result files (unless ``rebuild`` is false: ``action``
    reads them itself), and ``action`` runs once more. A full disk or a read-only
    folder is a :class:`DiskError` naming the store; any other error is raised as it is."""
    db_file = Path(db_file)
    with disk_errors_named(db_file, "the store"):
        return _repairing(db_file, action, rebuild)


def _repairing(db_file: Path, action: Callable[[], T], rebuild: bool) -> T:
    try:
        return action()
    except _DATABASE_ERRORS as exc:
        try:
            problem = _inspect(db_file, thorough=True)
        except sqlite3.OperationalError:
            problem = None
        if not isinstance(problem, _Problem):
            raise
        cause = _sqlite_error(exc)
        if problem.was.startswith("was damaged") and cause is not None:
            # SQLite's own words for what failed ("database disk image is malformed"),
            # rather than quick_check's page-by-page account
            problem = _damaged(str(cause), problem.inode)
        error = exc
    _set_aside(db_file, problem)
    if rebuild:
        _rebuild(db_file)
    try:
        return action()
    except _DATABASE_ERRORS as again:
        raise again from error


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


Result = TrainResult | EvalResult | MemoryEvalResult | TrajectoriesResult | LabelsResult | DistilledResult | BankResult
"""Every kind of result file the store holds."""

MEMORY_KINDS = (MemoryEvalResult, TrajectoriesResult, LabelsResult, DistilledResult, BankResult)
"""The memory's results: their digests are in memory_inputs, not cell_inputs (see MEMORY_INPUTS)."""

MEMORY_OWNER = "memory:"
"""A memory-building result's ``cell`` in ingested_files and memory_inputs: ``memory:TASK``
(no cell id has a colon)."""


def _digest(result: Result) -> str:
    return hashlib.sha256(result.model_dump_json().encode()).hexdigest()


def _key(result: Result) -> tuple[str, str]:
    """The result's ``(cell, part)``: its cell (``memory:TASK`` for a memory-building result) and
    its key among that cell's results (``cell_inputs.part``, or ``memory_inputs.part``)."""
    if isinstance(result, TrainResult):
        return result.cell, "train"
    if isinstance(result, MemoryEvalResult):  # before EvalResult: it is one
        return result.cell, f"memory/{result.memory}/step_{result.step}"
    if isinstance(result, EvalResult):
        return result.cell, f"eval/step_{result.step}"
    owner = f"{MEMORY_OWNER}{result.task}"
    if isinstance(result, TrajectoriesResult):
        return owner, f"trajectories/{result.scale}-k{result.samples}"
    if isinstance(result, LabelsResult):
        return owner, "labels"
    if isinstance(result, DistilledResult):
        return owner, f"distilled/{result.memory}"
    if isinstance(result, BankResult):
        return owner, f"bank/{result.memory}"
    raise TypeError(f"expected a result (matrixrl.results), got {type(result).__name__}")


def _part(result: Result) -> str:
    """The result's key among its cell's results (``cell_inputs.part``)."""
    return _key(result)[1]


def _is_cell_part(cell: str, part: str) -> bool:
    """Whether ``(cell, part)`` is a cell's train or eval result, the inputs of its summary (in cell_inputs)."""
    return part == "train" or part.startswith("eval/")


_FORGET = {
    # What one result put in the store, by its part: plain SQL (an ingest runs these for every file).
    "train": [
        "DELETE FROM cells WHERE cell = :cell",
        "DELETE FROM train_steps WHERE cell = :cell",
        "DELETE FROM diagnostics WHERE cell = :cell",
        "DELETE FROM role_metrics WHERE cell = :cell AND source = 'train'",
    ],
    "eval": [
        "DELETE FROM evaluations WHERE cell = :cell AND step = :step",
        "DELETE FROM role_metrics WHERE cell = :cell AND source = 'eval' AND step = :step",
    ],
    "memory": [
        "DELETE FROM memory_evaluations WHERE cell = :cell AND memory = :memory AND step = :step",
        "DELETE FROM memory_role_metrics WHERE cell = :cell AND memory = :memory AND step = :step",
        "DELETE FROM retrievals WHERE cell = :cell AND memory = :memory AND step = :step",
    ],
    "trajectories": ["DELETE FROM trajectories WHERE task = :task AND scale = :scale AND samples = :samples"],
    "labels": ["DELETE FROM memory_labels WHERE task = :task"],
    "distilled": ["DELETE FROM distill_prompts WHERE task = :task AND bank = :bank"],
    "bank": ["DELETE FROM memory_entries WHERE task = :task AND bank = :bank"],
}


def _forget(session: Session, cell: str, part: str) -> None:
    """Delete every row the store holds from one result (``part`` of ``cell``)."""
    conn = session.connection()
    kind, _, rest = part.partition("/")
    if part == "train":
        values = {"cell": cell}
    elif kind == "eval":
        values = {"cell": cell, "step": int(part.removeprefix("eval/step_"))}
    elif kind == "memory":
        memory, _, step = rest.rpartition("/step_")
        values = {"cell": cell, "memory": memory, "step": int(step)}
    else:
        task = cell.removeprefix(MEMORY_OWNER)
        values = {"task": task}
        if kind == "trajectories":
            scale, _, samples = rest.rpartition("-k")
            values |= {"scale": scale, "samples": int(samples)}
        elif kind in ("distilled", "bank"):
            values["bank"] = rest
        conn.exec_driver_sql("DELETE FROM memory_builds WHERE task = :task AND part = :part", {"task": task, "part": part})
    for sql in _FORGET[kind]:
        conn.exec_driver_sql(sql, values)
    inputs = "cell_inputs" if _is_cell_part(cell, part) else "memory_inputs"
    conn.exec_driver_sql(f"DELETE FROM {inputs} WHERE cell = :cell AND part = :part", {"cell": cell, "part": part})


def _eval_metric_rows(result: EvalResult) -> list[dict]:
    """An evaluation's per-role metrics and pass@j (role ``episode``), without ``step``."""
    pass_rows = [{"role": "episode", "metric": f"pass@{j}", "value": v} for j, v in result.pass_at.items()]
    return [*(r.model_dump(exclude={"step"}) for r in result.roles), *pass_rows]


def _write_result(session: Session, result: Result) -> tuple[str, str]:
    """Replace everything the store holds from this one result, and record its digests;
    returns its ``(cell, part)``."""
    cell, part = _key(result)
    _forget(session, cell, part)
    if isinstance(result, TrainResult):
        _upsert(session, CELLS, [{"cell": result.cell, **result.axes, "spec_digest": result.spec_digest}])
        _upsert(session, TRAIN_STEPS, [{"cell": result.cell, **m.model_dump()} for m in result.metrics])
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
    elif isinstance(result, MemoryEvalResult):
        _write_memory_evaluation(session, result)
    elif isinstance(result, EvalResult):
        _upsert(session, EVALUATIONS, [result.model_dump(exclude={"roles", "pass_at"})])
        _upsert(
            session,
            ROLE_METRICS,
            [{"cell": result.cell, "source": "eval", **row, "step": result.step} for row in _eval_metric_rows(result)],
        )
    else:
        _write_memory_build(session, part, result)
    inputs = CELL_INPUTS if _is_cell_part(cell, part) else MEMORY_INPUTS
    _upsert(session, inputs, [{"cell": cell, "part": part, "digest": _digest(result), "spec_digest": result.spec_digest}])
    return cell, part


def _write_memory_evaluation(session: Session, result: MemoryEvalResult) -> None:
    key = {"cell": result.cell, "memory": result.memory, "step": result.step}
    _upsert(session, MEMORY_EVALUATIONS, [result.model_dump(exclude={"roles", "pass_at", "retrievals"})])
    _upsert(session, MEMORY_ROLE_METRICS, [{**key, **row} for row in _eval_metric_rows(result)])
    rows = []
    for shown in result.retrievals:
        query = {**key, "problem_id": shown.problem_id, "bank": result.bank, "label": shown.label}
        if not shown.entries:
            rows.append({**query, "rank": 0, "entry": None})
        rows += [{**query, "rank": rank, "entry": entry} for rank, entry in enumerate(shown.entries)]
    _insert_rows(session, RETRIEVALS, rows)


def _insert_rows(session: Session, table: Table, rows: list[dict]) -> None:
    """Plain inserts of ``rows`` (dicts with the same keys), as one executemany: the rows of one
    result, whose keys are unique within it (a repeated key is a corrupt file, caught on reading)."""
    if rows:
        columns = tuple(rows[0])
        sql = f"INSERT INTO {table.name} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
        session.connection().exec_driver_sql(sql, [tuple(r[c] for c in columns) for r in rows])


def _write_memory_build(session: Session, part: str, result: Result) -> None:
    """A memory-building result's rows, and its row in memory_builds."""
    kind = part.partition("/")[0]
    build = {"task": result.task, "part": part, "kind": kind, "spec_digest": result.spec_digest}
    if isinstance(result, TrajectoriesResult):
        from matrixrl.memory.data import Trajectory

        records = [Trajectory.from_dict(t) for t in result.trajectories]
        _insert_rows(
            session,
            TRAJECTORIES,
            [{"task": result.task, "scale": result.scale, "samples": result.samples, **t.to_dict()} for t in records],
        )
        build |= {"scale": result.scale, "samples": result.samples, "accuracy": result.accuracy, "seconds": result.seconds}
    elif isinstance(result, LabelsResult):
        from matrixrl.memory.data import Label

        labels = {problem: Label.from_dict(label) for problem, label in result.labels.items()}
        rows = []
        for problem in dict.fromkeys([*result.labels, *result.replies]):
            label = labels.get(problem)
            rows.append({
                "task": result.task, "problem_id": problem, "labeller": result.labeller,
                "category": label.category if label else None, "subcategory": label.subcategory if label else None,
                "reply": result.replies.get(problem),
            })  # fmt: skip
        _insert_rows(session, MEMORY_LABELS, rows)
        build |= {"labeller": result.labeller, "seconds": result.seconds}
    elif isinstance(result, DistilledResult):
        rows = [
            {"task": result.task, "bank": result.memory, "prompt": i, **p.model_dump(exclude={"dropped"}),
             "dropped": json.dumps(p.dropped, sort_keys=True)}
            for i, p in enumerate(result.prompts)
        ]  # fmt: skip
        _insert_rows(session, DISTILL_PROMPTS, rows)
        build |= {
            "bank": result.memory, "mode": result.mode, "distiller": result.distiller, "pairs": result.pairs,
            "entries": len(result.entries), "seconds": result.seconds, "dropped": json.dumps(result.dropped, sort_keys=True),
        }  # fmt: skip
    else:  # BankResult
        from matrixrl.memory.data import Entry

        rows = []
        for i, entry in enumerate(Entry.from_dict(e) for e in result.entries):
            rows.append({
                "task": result.task, "bank": result.memory, "entry": i, "text": entry.text, "problem_id": entry.problem_id,
                "question": entry.question, "category": entry.label.category, "subcategory": entry.label.subcategory,
                "models": json.dumps(list(entry.models)), "mode": entry.mode, "distiller": entry.distiller,
            })  # fmt: skip
        _insert_rows(session, MEMORY_ENTRIES, rows)
        build |= {"bank": result.memory, "mode": result.mode, "entries": len(rows)}
    _upsert(session, MEMORY_BUILDS, [build])


_FIX = "delete it and run `matrixrl run` to recompute it"


def _read(path: Path, kind: type) -> Result:
    """``read_result``, and for the memory's results the records in them checked too (a
    trajectory, label or entry the memory's own ``from_dict`` rejects; a repeated key): every
    file is validated before the store is written, so a corrupt one leaves it as it was."""
    result = read_result(path, kind)
    try:
        _check_records(result)
    except (ValueError, TypeError, KeyError) as exc:
        raise ResultFileError(f"{path}: corrupt result file ({exc}); {_FIX}") from None
    return result


_RECORD_TYPES = {
    # The JSON types of the memory's records' fields (matrixrl.memory.data), checked with its
    # from_dict (which checks the keys): a value of another type is a corrupt file.
    "Trajectory": {"problem_id": str, "question": str, "model": str, "completion": str, "answer": str,
                   "correct": bool, "tokens": int, "sample": int},
    "Label": {"category": str, "subcategory": str},
    "Entry": {"text": str, "problem_id": str, "question": str, "label": dict, "models": list, "mode": str, "distiller": str},
}  # fmt: skip


def _record(kind, data, where: str):
    """``kind.from_dict(data)`` with its fields' types checked; ValueError saying ``where``."""
    try:
        record = kind.from_dict(data)
        for field, wanted in _RECORD_TYPES[kind.__name__].items():
            value = data.get(field)
            if field in data and (not isinstance(value, wanted) or (wanted is int and isinstance(value, bool))):
                raise ValueError(f"{field} must be a {wanted.__name__}, not {type(value).__name__}")
            if wanted is int and field in data and not 0 <= value <= INT64_MAX:
                raise ValueError(f"{field} must be within [0, {INT64_MAX}], not {value}")
        return record
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"{where}: {exc}") from None


def _check_records(result: Result) -> None:
    from matrixrl.memory.data import Entry, Label, Trajectory

    def unique(keys: list, what: str) -> None:
        seen = set()
        for key in keys:
            if key in seen:
                raise ValueError(f"{what} {key!r} given twice")
            seen.add(key)

    if isinstance(result, TrainResult):
        _check_axes(result)
    elif isinstance(result, MemoryEvalResult):
        unique([r.problem_id for r in result.retrievals], "retrievals: problem")
        for r in result.retrievals:
            if any(e < 0 for e in r.entries):
                raise ValueError(f"retrievals: problem {r.problem_id!r} has a negative entry index")
    elif isinstance(result, TrajectoriesResult):
        records = [_record(Trajectory, data, f"trajectories.{i}") for i, data in enumerate(result.trajectories)]
        unique([(t.problem_id, t.sample) for t in records], "trajectories: (problem, sample)")
    elif isinstance(result, LabelsResult):
        for problem, data in result.labels.items():
            _record(Label, data, f"labels.{problem}")
    elif isinstance(result, BankResult):
        for i, data in enumerate(result.entries):
            _record(Entry, data, f"entries.{i}")
            _record(Label, data["label"], f"entries.{i}.label")
            if not all(isinstance(m, str) for m in data["models"]):
                raise ValueError(f"entries.{i}: models must be names (text)")


def _check_axes(result: TrainResult) -> None:
    """A training's axes are the five of a cell (``cells``' columns), of its cell's id."""
    axes = result.axes
    if sorted(axes) != sorted(AXES):
        raise ValueError(f"axes: {', '.join(axes) or 'none'}, not the axes {', '.join(AXES)}")
    for axis, value in axes.items():
        if isinstance(value, int) != (axis == "seed") or (axis == "seed" and not 0 <= value <= INT64_MAX):
            wanted = f"a whole number within [0, {INT64_MAX}]" if axis == "seed" else "a name"
            raise ValueError(f"axes.{axis}: {json.dumps(value)}, not {wanted}")
    named = "{workflow}-{task}-{scale}-{policy}-s{seed}".format(**axes)
    if result.cell != named and not result.cell.startswith(f"{named}-"):  # the id of a swept cell goes on: -KEY=VALUE
        raise ValueError(f"axes: those of cell {json.dumps(named)}, not of {json.dumps(result.cell)}")


def _known_files(results_dir: Path) -> tuple[dict[str, tuple[int, int, int, int, str, str]], bool]:
    """Every file the store has read: path → (size, mtime_ns, inode, read_ns, cell, part); and
    whether every file must be read again (a store without per-cell digests)."""
    if not store_path(results_dir).exists():
        return {}, True
    engine = engine_for(results_dir)
    try:
        with Session(engine) as session:
            rows = session.execute(select(INGESTED_FILES)).all()
            known = {row.path: (row.size, row.mtime_ns, row.inode, row.read_ns, row.cell, row.part) for row in rows}
            # A store that lost its per-cell digests: read every file once more so each
            # cell gets its digests (and incremental reports see it).
            again = bool(known) and all(
                session.execute(select(inputs.c.cell).limit(1)).first() is None for inputs in (CELL_INPUTS, MEMORY_INPUTS)
            )
            return known, again
    finally:
        engine.dispose()


def _path_key(rel: str) -> tuple[str, str]:
    """The ``(cell, part)`` a result file's path (relative to the results folder, one of
    :data:`RESULT_FILES`) says it holds: a result file holds no other (``read_result``)."""
    path = Path(rel)
    parts, stem = path.parts, path.stem
    if parts[0] == "cells":
        if parts[2] == "eval":
            return parts[1], f"eval/{stem}"
        if parts[2] == "memory":
            return parts[1], f"memory/{parts[3]}/{stem}"
        return parts[1], "train"
    owner = f"{MEMORY_OWNER}{parts[1]}"
    if parts[2] == "labels.json":
        return owner, "labels"
    return owner, f"{'bank' if parts[2] == 'banks' else parts[2]}/{stem}"


def _changes(
    results_dir: Path, known: Mapping[str, tuple], again: bool
) -> tuple[list[tuple[Path, str, object, tuple[int, int, int]]], list[str], list[str]]:
    """The result files to read (new, changed, or backing a result a gone file held too),
    each with its ``(size, mtime_ns, inode)`` before it is read; the paths of known files
    that are gone; and those of known files that were read as another result than their
    path's (``"step": 7`` in ``eval/step_1.json``, which a store written before
    ``read_result`` checked it took as step 7): their rows are forgotten as a gone file's
    and they are read again, with every file that backs the result they held.

    A file is changed when any of the three differs (a job writes its result to a new
    file renamed over the old one: a new inode, whatever the size and time say), and
    is read again when it had changed within :data:`RACY_NS` of its last reading.
    """
    found: dict[str, tuple[Path, object, tuple[int, int, int]]] = {}
    for pattern, kind in RESULT_FILES:
        for path in sorted(results_dir.glob(pattern)):
            stat = path.stat()
            found[str(path.relative_to(results_dir))] = (path, kind, (stat.st_size, stat.st_mtime_ns, stat.st_ino))
    gone = [rel for rel in known if rel not in found]
    misread = [rel for rel in known if rel in found and tuple(known[rel][4:]) != _path_key(rel)]
    forgotten = {known[rel][4:] for rel in (*gone, *misread)}
    pending = [
        (path, rel, kind, signature)
        for rel, (path, kind, signature) in found.items()
        if again
        or rel not in known
        or known[rel][:3] != signature
        or known[rel][1] > known[rel][3] - RACY_NS  # it had changed just before it was read
        or known[rel][4:] in forgotten
    ]
    return pending, gone, misread


RESULT_FILES = (
    (L.TRAIN_RESULTS, TrainResult),
    (L.EVAL_RESULTS, EvalResult),
    (L.MEMORY_EVAL_RESULTS, MemoryEvalResult),
    (L.TRAJECTORY_RESULTS, TrajectoriesResult),
    (L.LABEL_RESULTS, LabelsResult),
    (L.DISTILLED_RESULTS, DistilledResult),
    (L.BANK_RESULTS, BankResult),
)
"""Every kind of result file the store reads: the glob of its files and its model."""

RACY_NS = 2_000_000_000
"""How recently before its reading a file may have changed for its time to tell nothing
later: a file system keeps times to the second or two (FAT, some network ones), so a file
written again that soon could keep its size and time. Such a file is read again at the
next ingest, and its result's digest tells whether it changed (as git's "racily clean")."""


def ingest(results_dir: str | Path) -> int:
    """Make the store mirror the result files; returns how many files' results were new
    or changed (and so written into the store).

    A file is read when it is new, or its size, modification time or inode differ from
    when it was last read, or it changed within :data:`RACY_NS` of its last reading; a
    result it holds is written only if its digest differs from the stored one. New and
    changed results are upserted, the rows of files that are gone deleted, in one
    transaction. Every file is read and validated before the store is opened for
    writing, so an unusable one raises ``ResultFileError`` with nothing written (not
    even a new, empty store). An unusable store is moved aside (one note on stderr) and
    every file read into a new one.
    """
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        return 0
    return repairing(store_path(results_dir), lambda: _ingest(results_dir), rebuild=False)


def _ingest(results_dir: Path) -> int:
    db_file = store_path(results_dir)
    state = _inspect(db_file)
    if isinstance(state, _Problem):
        _set_aside(db_file, state)  # and read every file into a new store below
    began = time.time_ns()
    known, again = _known_files(results_dir)
    pending, gone, misread = _changes(results_dir, known, again)
    parsed = [(rel, _read(path, kind), signature) for path, rel, kind, signature in pending]
    for rel, result, _ in parsed:
        if _key(result) != _path_key(rel):  # read_result checks the fields that make the key: never
            raise ResultFileError(f"{results_dir / rel}: corrupt result file (holds {'/'.join(_key(result))}); {_FIX}")
    if not parsed and not gone:
        return 0
    engine = engine_for(results_dir)
    written = 0
    try:
        with Session(engine) as session, session.begin():
            for rel in (*gone, *misread):
                _forget(session, *known[rel][4:])
                session.execute(delete(INGESTED_FILES).where(INGESTED_FILES.c.path == rel))
            keys = [_key(result) for _, result, _ in parsed]
            stored = _stored_digests(session, {cell for cell, _ in keys}) if not again else {}
            for (rel, result, (size, mtime_ns, inode)), (cell, part) in zip(parsed, keys):
                if stored.get((cell, part)) != _digest(result):
                    _write_result(session, result)
                    written += 1
                # The file as it was before it was read: a change while it was read shows next time.
                row = {"path": rel, "size": size, "mtime_ns": mtime_ns, "inode": inode, "read_ns": began, "cell": cell, "part": part}
                _upsert(session, INGESTED_FILES, [row])
            # Only a cell's train and eval results are its summary's inputs: memory results leave
            # cell_keys, and so every cached summary, as they were.
            emptied = {known[rel][4] for rel in (*gone, *misread) if _is_cell_part(*known[rel][4:])}
            _refresh_keys(session, emptied | {cell for cell, part in keys if _is_cell_part(cell, part)})
            if emptied:  # cells none of whose results are left: no cached summary either
                for cache in (CELL_SUMMARIES, CELL_TRAININGS):
                    session.execute(
                        delete(cache).where(cache.c.cell.in_(emptied), cache.c.cell.not_in(select(CELL_INPUTS.c.cell)))
                    )
    finally:
        engine.dispose()
    return written


def _sha256_hex(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode()).hexdigest()


def _refresh_keys(session: Session, cells: set[str]) -> None:
    """Write ``cell_keys`` again for ``cells`` from their ``cell_inputs`` (after results were
    written or forgotten; a cell without any result has none).

    ``inputs`` is the SHA-256 of every (part, digest, spec digest) in order, not their text
    (15 kB for a cell of 100 checkpoints): a report reads and hashes every cell's, and the
    text made up most of an incremental report's reading (docs/performance.md). A store
    written before keeps its texts until a cell's next write: a different key, so that
    cell's record is computed once more."""
    listed = sorted(cells)
    conn = session.connection()  # its engine's connections have sha256_hex (engine_at)
    for start in range(0, len(listed), _IN_CHUNK):
        chunk = tuple(listed[start : start + _IN_CHUNK])
        marks = ", ".join("?" * len(chunk))
        conn.exec_driver_sql(f"DELETE FROM cell_keys WHERE cell IN ({marks})", chunk)
        conn.exec_driver_sql(
            "INSERT INTO cell_keys (cell, inputs, train_spec, eval_specs) "
            "SELECT cell, sha256_hex(group_concat(part || ' ' || digest || ' ' || ifnull(spec_digest, '-'), ' ')), "
            "max(CASE WHEN part = 'train' THEN ifnull(spec_digest, '-') END), "
            "group_concat(DISTINCT CASE WHEN part != 'train' THEN ifnull(spec_digest, '-') END) "
            f"FROM (SELECT * FROM cell_inputs WHERE cell IN ({marks}) ORDER BY cell, part) GROUP BY cell",
            chunk,
        )


def _stored_digests(session: Session, cells: set[str]) -> dict[tuple[str, str], str]:
    """The digest of every result stored for ``cells``, by ``(cell, part)``."""
    found: dict[tuple[str, str], str] = {}
    listed = sorted(cells)
    for start in range(0, len(listed), _IN_CHUNK):
        chunk = listed[start : start + _IN_CHUNK]
        marks = ", ".join("?" * len(chunk))
        sql = (
            f"SELECT cell, part, digest FROM cell_inputs WHERE cell IN ({marks}) "
            f"UNION ALL SELECT cell, part, digest FROM memory_inputs WHERE cell IN ({marks})"
        )
        rows = session.connection().exec_driver_sql(sql, (*chunk, *chunk))
        found.update(((cell, part), digest) for cell, part, digest in rows)
    return found


def ingest_for_report(results_dir: str | Path) -> int:
    """``ingest`` before a report or a plot (returns how many files were read); ConfigError
    when there is nothing to read at all."""
    if not L.has_results(results_dir):
        raise ConfigError(f"{Path(results_dir)}: no results yet; run `matrixrl run` first")
    return ingest(results_dir)


def read_table(results_dir: str | Path, table: str) -> pd.DataFrame:
    """One store table as a DataFrame (empty, with its columns, if nothing is stored)."""

    def read() -> pd.DataFrame:
        engine = engine_for(results_dir)
        try:
            with engine.connect() as conn:
                return pd.read_sql_table(table, conn)
        finally:
            engine.dispose()

    return repairing(store_path(results_dir), read)


# SQLite's limit on bound values also caps ``cell IN (...)`` lists.
_IN_CHUNK = 10_000  # (a query that binds two lists binds twice as many: SQLite's limit is 32,766)


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

    def add_results(self, results: Iterable[Result]) -> int:
        """Store results as ``ingest`` would store their files (one transaction); returns how many."""
        keys: list[tuple[str, str]] = []
        with Session(self.engine) as session, session.begin():
            for result in results:
                _check_records(result)
                keys.append(_write_result(session, result))
            _refresh_keys(session, {cell for cell, part in keys if _is_cell_part(cell, part)})
        return len(keys)

    def rows(self, table: str, cells: Sequence[str], **equal: str | Sequence[str]) -> pd.DataFrame:
        """The rows of ``table`` for ``cells``; each keyword keeps rows whose column equals it (or is in it)."""
        sql_table = METADATA.tables[table]
        columns = ", ".join(f'"{column.name}"' for column in sql_table.columns)
        frames = []
        with self.engine.connect() as conn:
            # The query as text on sqlite3's own connection: pandas reads it the same way, without
            # SQLAlchemy compiling it and wrapping every row (most of the time of a small read).
            driver = conn.connection.driver_connection
            for start in range(0, max(len(cells), 1), _IN_CHUNK):
                chunk = list(cells[start : start + _IN_CHUNK])
                where, params = [f"cell IN ({', '.join('?' * len(chunk))})"], chunk
                for column, wanted in equal.items():
                    values = [wanted] if isinstance(wanted, str) else list(wanted)
                    where.append(f'"{sql_table.c[column].name}" IN ({", ".join("?" * len(values))})')
                    params = [*params, *values]
                frames.append(pd.read_sql(f"SELECT {columns} FROM {table} WHERE {' AND '.join(where)}", driver, params=params))
        return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]

    def _select(self, sql: str, cells: Sequence[str]) -> list[tuple]:
        """The rows of ``sql`` (whose one ``{cells}`` placeholder is a ``cell IN (...)`` list) for ``cells``.

        Plain driver rows, for the few small tables a report reads on every run: a
        DataFrame and SQLAlchemy's row objects cost more than the query itself.
        """
        found: list[tuple] = []
        with self.engine.connect() as conn:
            driver = conn.connection.driver_connection  # sqlite3's own: rows as plain tuples
            for start in range(0, len(cells), _IN_CHUNK):
                chunk = list(cells[start : start + _IN_CHUNK])
                found += driver.execute(sql.format(cells=", ".join("?" * len(chunk))), chunk).fetchall()
        return found

    def input_digests(
        self, cells: Sequence[str], current: Mapping[str, tuple[str, str]] | None = None
    ) -> dict[str, list[tuple[str, str]]]:
        """Per cell, the sorted ``(part, digest)`` of every result stored for it; cells with none are absent.

        ``current``: ``{cell: (train digest, eval digest)}`` of the specs the cells have
        now; results computed under another spec are left out (a result without a spec
        digest, from a file written before them, is kept).
        """
        rows = self._select("SELECT cell, part, digest, spec_digest FROM cell_inputs WHERE cell IN ({cells})", cells)
        found: dict[str, list[tuple[str, str]]] = {}
        for cell, part, digest, spec_digest in sorted(rows):
            if current is not None and spec_digest is not None and cell in current:
                if spec_digest != current[cell][0 if part == "train" else 1]:
                    continue
            found.setdefault(cell, []).append((part, digest))
        return found

    def input_keys(self, cells: Sequence[str], current: Mapping[str, tuple[str, str]] | None = None) -> dict[str, str]:
        """Per cell, a text that names exactly its :meth:`input_digests` (``current`` as there):
        what a cache key of the cell's results is made of; cells with none are absent.

        Read from ``cell_keys``, one row per cell (a report reads them all each time, and a
        row per result took most of a report with every record cached); only a cell with a
        result computed under another spec than its current one reads its results' digests.
        """
        found: dict[str, str] = {}
        filtered = []
        rows = self._select("SELECT cell, inputs, train_spec, eval_specs FROM cell_keys WHERE cell IN ({cells})", cells)
        for cell, inputs, train_spec, eval_specs in rows:
            wanted = None if current is None else current.get(cell)
            if wanted is None or (
                train_spec in (None, "-", wanted[0]) and all(spec in ("-", wanted[1]) for spec in (eval_specs or "").split(",") if spec)
            ):
                found[cell] = f"every {inputs}"
            else:
                filtered.append(cell)
        for cell, parts in self.input_digests(filtered, current).items():
            found[cell] = "kept " + " ".join(f"{part} {digest}" for part, digest in parts)
        return found

    def cached_summaries(self, cells: Sequence[str]) -> dict[str, tuple[str, dict]]:
        """Per cell, the cached ``(cache key, summary)``; cells never summarized are absent."""
        rows = self._select("SELECT cell, cache_key, summary FROM cell_summaries WHERE cell IN ({cells})", cells)
        return {cell: (key, json.loads(summary)) for cell, key, summary in rows}

    def cached_trainings(self, cells: Sequence[str]) -> dict[str, tuple[str, dict]]:
        """Per cell, the cached ``(cache key, training part)`` of its summary (``analysis.cell.training_part``)."""
        rows = self._select("SELECT cell, cache_key, training FROM cell_trainings WHERE cell IN ({cells})", cells)
        return {cell: (key, json.loads(training)) for cell, key, training in rows}

    def save_summaries(
        self, summaries: Mapping[str, tuple[str, dict]], trainings: Mapping[str, tuple[str, dict]] | None = None
    ) -> None:
        """Cache ``{cell: (cache key, summary)}``, counting each cell's computations, and
        ``trainings``, ``{cell: (cache key, training part)}``, in one transaction.

        Only a cache: a store that cannot be written (a read-only results folder,
        an archive) keeps its old entries, and the report is computed all the same.
        """
        if not summaries and not trainings:
            return
        try:
            self._save_summaries(summaries, trainings or {})
        except DiskError:
            pass

    def _save_summaries(self, summaries: Mapping[str, tuple[str, dict]], trainings: Mapping[str, tuple[str, dict]]) -> None:
        now = time.time()
        rows = [(cell, key, json.dumps(summary, allow_nan=False), now) for cell, (key, summary) in summaries.items()]
        sql = (
            "INSERT INTO cell_summaries (cell, cache_key, summary, computations, computed_at) VALUES (?, ?, ?, 1, ?) "
            "ON CONFLICT (cell) DO UPDATE SET cache_key = excluded.cache_key, summary = excluded.summary, "
            "computed_at = excluded.computed_at, computations = cell_summaries.computations + 1"
        )
        # NaN and infinities stay as they were (JSON's extension): a signal may have them at some update.
        parts = [(cell, key, json.dumps(training)) for cell, (key, training) in trainings.items()]
        with self._caching() as driver:
            if rows:
                driver.executemany(sql, rows)
            if parts:
                driver.executemany(_upsert_sql(CELL_TRAININGS, ("cell", "cache_key", "training")), parts)

    @contextlib.contextmanager
    def _caching(self):
        """One transaction on sqlite3's connection that writes the caches only, committed
        without waiting for the disk (``synchronous = OFF``; the ingest's transactions do):
        the wait was most of a report with nothing new to compute. A crash of the machine
        amid it loses cache entries, at worst damages the file, which the store then
        moves aside and rebuilds from the result files (see the module docstring)."""
        with disk_errors_named(self.path, "the store"), self.engine.connect() as conn:
            driver = conn.connection.driver_connection
            (synchronous,) = driver.execute("PRAGMA synchronous").fetchone()
            driver.execute("PRAGMA synchronous = OFF")
            try:
                driver.execute("BEGIN")
                try:
                    yield driver
                except BaseException:
                    driver.rollback()
                    raise
                driver.commit()
            finally:
                driver.execute(f"PRAGMA synchronous = {int(synchronous)}")

    def cached_figures(self, names: Sequence[str]) -> dict[str, tuple[str, bytes]]:
        """Per figure name, the cached ``(cache key, PNG)``; figures never drawn are absent."""
        found: dict[str, tuple[str, bytes]] = {}
        with self.engine.connect() as conn:
            driver = conn.connection.driver_connection
            for start in range(0, len(names), _IN_CHUNK):
                chunk = list(names[start : start + _IN_CHUNK])
                sql = f"SELECT name, cache_key, png FROM figures WHERE name IN ({', '.join('?' * len(chunk))})"
                found.update((name, (key, bytes(png))) for name, key, png in driver.execute(sql, chunk).fetchall())
        return found

    def save_figures(self, figures: Mapping[str, tuple[str, bytes]]) -> None:
        """Cache ``{name: (cache key, PNG)}``; like :meth:`save_summaries`, only a cache (a store
        that cannot be written keeps its old entries)."""
        if not figures:
            return
        rows = [(name, key, png) for name, (key, png) in figures.items()]
        try:
            with self._caching() as driver:
                driver.executemany(_upsert_sql(FIGURES, ("name", "cache_key", "png")), rows)
        except DiskError:
            pass

    def computations(self) -> dict[str, int]:
        """How many times each cell's summary has been computed (it is cached in between)."""
        with self.engine.connect() as conn:
            return dict(conn.execute(select(CELL_SUMMARIES.c.cell, CELL_SUMMARIES.c.computations)).all())
