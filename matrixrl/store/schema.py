"""The store's schema: its tables (the result tables derived from matrixrl.results), version and engine.

What a row of each table is: docs/architecture.md, "The store's tables".
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, get_args, get_origin

from pydantic import BaseModel
from sqlalchemy import Boolean, Column, Float, Integer, LargeBinary, MetaData, String, Table, Text, create_engine, event

from matrixrl.config import AXES
from matrixrl.results import Cost, DiagnosticRow, EvalResult, MemoryEvalResult, RoleMetric, StepMetrics


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


CELLS = _table("cells", {"cell": String}, {axis: Integer if axis == "seed" else String for axis in AXES}, {"spec_digest": String})
CELL_INPUTS = _table("cell_inputs", {"cell": String, "part": String}, {"digest": String}, {"spec_digest": String})
CELL_KEYS = _table("cell_keys", {"cell": String}, {"inputs": Text}, {"train_spec": String, "eval_specs": String})
CELL_SUMMARIES = _table(
    "cell_summaries", {"cell": String}, {"cache_key": String, "summary": Text, "computations": Integer, "computed_at": Float}
)
CELL_TRAININGS = _table("cell_trainings", {"cell": String}, {"cache_key": String, "training": Text})
FIGURES = _table("figures", {"name": String}, {"cache_key": String, "png": LargeBinary})
INGESTED_FILES = _table(
    "ingested_files",
    {"path": String},
    {"size": Integer, "mtime_ns": Integer, "inode": Integer, "read_ns": Integer, "cell": String, "part": String},
)


# The result models' scalar fields are columns of the same name (docs/architecture.md).
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
    "evaluations", METADATA, *_result_columns(EvalResult, keys=("cell", "step"), exclude=("roles", "pass_at", "cost"))
)
JOB_COSTS = Table(
    "job_costs",
    METADATA,
    Column("cell", String, primary_key=True),
    Column("part", String, primary_key=True),
    Column("rule", String, nullable=False),
    *_result_columns(Cost),
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
    Column("source", String, primary_key=True),
    *_result_columns(RoleMetric, keys=("step", "role", "metric")),
)

# --- MemCollab's memory (docs/memcollab.md) ---------------------------------------------------------
MEMORY_EVALUATIONS = Table(
    "memory_evaluations",
    METADATA,
    *_result_columns(MemoryEvalResult, keys=("cell", "memory", "step"), exclude=("roles", "pass_at", "retrievals", "cost")),
)
MEMORY_ROLE_METRICS = _table(
    "memory_role_metrics",
    {"cell": String, "memory": String, "step": Integer, "role": String, "metric": String},
    {"value": Float},
)
RETRIEVALS = _table(
    "retrievals",
    {"cell": String, "memory": String, "step": Integer, "problem_id": String, "rank": Integer},
    {"bank": String, "label": String},
    {"entry": Integer},
)
TRAJECTORIES = _table(
    "trajectories",
    {"task": String, "scale": String, "samples": Integer, "problem_id": String, "sample": Integer},
    {"question": Text, "model": String, "completion": Text, "answer": Text, "correct": Boolean, "tokens": Integer},
)
MEMORY_LABELS = _table(
    "memory_labels",
    {"task": String, "problem_id": String},
    {"labeller": String},
    {"category": String, "subcategory": String, "reply": Text},
)
MEMORY_ENTRIES = _table(
    "memory_entries",
    {"task": String, "bank": String, "entry": Integer},
    {
        "text": Text, "problem_id": String, "question": Text, "category": String, "subcategory": String,
        "models": String, "mode": String, "distiller": String,
    },
)  # fmt: skip
DISTILL_PROMPTS = _table(
    "distill_prompts",
    {"task": String, "bank": String, "prompt": Integer},
    {"problem_id": String, "digest": String, "system": Text, "user": Text, "reply": Text, "kept": Integer, "dropped": Text},
)
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
MEMORY_INPUTS = _table("memory_inputs", {"cell": String, "part": String}, {"digest": String}, {"spec_digest": String})


SCHEMA_VERSION = 8
"""SQLite's ``user_version`` of a store with these tables; a store of another is rebuilt."""


@functools.cache
def expected_columns() -> dict[str, list[tuple]]:
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


def open_engine(db_file: Path):
    """An engine on the store file ``db_file`` as it is, with the store's settings on every
    connection (``engine_at`` checks the file, and creates or repairs it, first)."""
    engine = create_engine(f"sqlite:///{db_file}")

    @event.listens_for(engine, "connect")
    def _pragmas(conn, _):
        # Concurrent readers (report) wait for the one writer rather than failing.
        conn.execute("PRAGMA busy_timeout = 30000")
        conn.create_function("sha256_hex", 1, _sha256_hex, deterministic=True)  # writes.refresh_keys's cell keys

    return engine


def _sha256_hex(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode()).hexdigest()


# SQLite's limit on bound values also caps ``cell IN (...)`` lists.
IN_CHUNK = 10_000  # (a query that binds two lists binds twice as many: SQLite's limit is 32,766)
