"""What one result puts in the store: its rows written or forgotten, its digest, its cell's keys."""

from __future__ import annotations

import functools
import hashlib
import json

from sqlalchemy import Table
from sqlalchemy.orm import Session

from matrixrl.layout import MEMORY_OWNER
from matrixrl.results import (
    BankResult,
    DiagnosticRow,
    DistilledResult,
    EvalResult,
    LabelsResult,
    MemoryEvalResult,
    TrainResult,
    TrajectoriesResult,
)
from matrixrl.store.schema import (
    CELL_INPUTS,
    CELLS,
    DISTILL_PROMPTS,
    EVALUATIONS,
    IN_CHUNK,
    JOB_COSTS,
    MEMORY_BUILDS,
    MEMORY_ENTRIES,
    MEMORY_EVALUATIONS,
    MEMORY_INPUTS,
    MEMORY_LABELS,
    MEMORY_ROLE_METRICS,
    RETRIEVALS,
    ROLE_METRICS,
    TRAIN_STEPS,
    TRAJECTORIES,
)


@functools.cache
def upsert_sql(table, columns: tuple[str, ...]) -> str:
    # Plain SQLite upsert text: SQLAlchemy cannot cache its compiled ON CONFLICT construct
    # and would recompile it for every result file.
    keys = [c.name for c in table.primary_key.columns]
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in keys)
    return (
        f"INSERT INTO {table.name} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))}) "
        f"ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {updates}"
    )


def upsert_rows(session: Session, table, rows: list[dict]) -> None:
    """Insert or update ``rows`` (dicts with the same keys) by primary key, as one executemany."""
    if rows:
        columns = tuple(rows[0])
        session.connection().exec_driver_sql(upsert_sql(table, columns), [tuple(r[c] for c in columns) for r in rows])


Result = TrainResult | EvalResult | MemoryEvalResult | TrajectoriesResult | LabelsResult | DistilledResult | BankResult
"""Every kind of result file the store holds."""


def result_digest(result: Result) -> str:
    return hashlib.sha256(result.model_dump_json().encode()).hexdigest()


def store_key(result: Result) -> tuple[str, str]:
    """The result's ``(cell, part)``: its cell (``memory:TASK`` for a memory-building result) and
    its key among that cell's results (``cell_inputs.part``, or ``memory_inputs.part``); the
    key :func:`matrixrl.layout.result_key` reads from its file's path (tests/test_layout.py),
    made from the result's fields (ten times cheaper than building the path)."""
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


def is_cell_part(cell: str, part: str) -> bool:
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


def forget_result(session: Session, cell: str, part: str) -> None:
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
    inputs = "cell_inputs" if is_cell_part(cell, part) else "memory_inputs"
    conn.exec_driver_sql(f"DELETE FROM {inputs} WHERE cell = :cell AND part = :part", {"cell": cell, "part": part})
    conn.exec_driver_sql("DELETE FROM job_costs WHERE cell = :cell AND part = :part", {"cell": cell, "part": part})


def _eval_metric_rows(result: EvalResult) -> list[dict]:
    """An evaluation's per-role metrics and pass@j (role ``episode``), without ``step``."""
    pass_rows = [{"role": "episode", "metric": f"pass@{j}", "value": v} for j, v in result.pass_at.items()]
    return [*(r.model_dump(exclude={"step"}) for r in result.roles), *pass_rows]


def write_result(session: Session, result: Result) -> tuple[str, str]:
    """Replace everything the store holds from this one result, and record its digests;
    returns its ``(cell, part)``."""
    cell, part = store_key(result)
    forget_result(session, cell, part)
    if isinstance(result, TrainResult):
        upsert_rows(session, CELLS, [{"cell": result.cell, **result.axes, "spec_digest": result.spec_digest}])
        upsert_rows(session, TRAIN_STEPS, [{"cell": result.cell, **m.model_dump()} for m in result.metrics])
        if result.diagnostics:
            # A long run logs hundreds of thousands of rows: straight to the driver's executemany,
            # which is an order of magnitude faster than building SQLAlchemy parameters per row.
            columns = tuple(DiagnosticRow.model_fields)
            dumped = result.model_dump(include={"diagnostics"})["diagnostics"]
            session.connection().exec_driver_sql(
                f"INSERT INTO diagnostics (cell, {', '.join(columns)}) VALUES (?{', ?' * len(columns)})",
                [(result.cell, *(d[c] for c in columns)) for d in dumped],
            )
        upsert_rows(session, ROLE_METRICS, [{"cell": result.cell, "source": "train", **r.model_dump()} for r in result.roles])
    elif isinstance(result, MemoryEvalResult):
        _write_memory_evaluation(session, result)
    elif isinstance(result, EvalResult):
        upsert_rows(session, EVALUATIONS, [result.model_dump(exclude={"roles", "pass_at", "cost"})])
        upsert_rows(
            session,
            ROLE_METRICS,
            [{"cell": result.cell, "source": "eval", **row, "step": result.step} for row in _eval_metric_rows(result)],
        )
    else:
        _write_memory_build(session, part, result)
    inputs = CELL_INPUTS if is_cell_part(cell, part) else MEMORY_INPUTS
    upsert_rows(session, inputs, [{"cell": cell, "part": part, "digest": result_digest(result), "spec_digest": result.spec_digest}])
    cost = getattr(result, "cost", None)
    if cost is not None:
        upsert_rows(session, JOB_COSTS, [{"cell": cell, "part": part, "rule": _rule_of(part), **cost.model_dump()}])
    return cell, part


def _rule_of(part: str) -> str:
    """The kind of job that wrote the result stored as ``part`` (matrixrl.dag's rule)."""
    kind = part.partition("/")[0]
    return {"eval": "evaluate", "memory": "evaluate_memory", "trajectories": "collect", "labels": "label"}.get(kind, kind)


def _write_memory_evaluation(session: Session, result: MemoryEvalResult) -> None:
    key = {"cell": result.cell, "memory": result.memory, "step": result.step}
    upsert_rows(session, MEMORY_EVALUATIONS, [result.model_dump(exclude={"roles", "pass_at", "retrievals", "cost"})])
    upsert_rows(session, MEMORY_ROLE_METRICS, [{**key, **row} for row in _eval_metric_rows(result)])
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
        from matrixrl.memcollab.data import Trajectory

        records = [Trajectory.from_dict(t) for t in result.trajectories]
        _insert_rows(
            session,
            TRAJECTORIES,
            [{"task": result.task, "scale": result.scale, "samples": result.samples, **t.to_dict()} for t in records],
        )
        build |= {"scale": result.scale, "samples": result.samples, "accuracy": result.accuracy, "seconds": result.seconds}
    elif isinstance(result, LabelsResult):
        from matrixrl.memcollab.data import Label

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
        from matrixrl.memcollab.data import Entry

        rows = []
        for i, entry in enumerate(Entry.from_dict(e) for e in result.entries):
            rows.append({
                "task": result.task, "bank": result.memory, "entry": i, "text": entry.text, "problem_id": entry.problem_id,
                "question": entry.question, "category": entry.label.category, "subcategory": entry.label.subcategory,
                "models": json.dumps(list(entry.models)), "mode": entry.mode, "distiller": entry.distiller,
            })  # fmt: skip
        _insert_rows(session, MEMORY_ENTRIES, rows)
        build |= {"bank": result.memory, "mode": result.mode, "entries": len(rows)}
    upsert_rows(session, MEMORY_BUILDS, [build])


def refresh_keys(session: Session, cells: set[str]) -> None:
    """Write ``cell_keys`` again for ``cells`` from their ``cell_inputs`` (after results were
    written or forgotten; a cell without any result has none): the SHA-256 of every (part,
    digest, spec digest) in order (docs/architecture.md, "Reports at scale").
    """
    listed = sorted(cells)
    conn = session.connection()  # its engine's connections have sha256_hex (engine_at)
    for start in range(0, len(listed), IN_CHUNK):
        chunk = tuple(listed[start : start + IN_CHUNK])
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


def stored_digests(session: Session, cells: set[str]) -> dict[tuple[str, str], str]:
    """The digest of every result stored for ``cells``, by ``(cell, part)``."""
    found: dict[tuple[str, str], str] = {}
    listed = sorted(cells)
    for start in range(0, len(listed), IN_CHUNK):
        chunk = listed[start : start + IN_CHUNK]
        marks = ", ".join("?" * len(chunk))
        sql = (
            f"SELECT cell, part, digest FROM cell_inputs WHERE cell IN ({marks}) "
            f"UNION ALL SELECT cell, part, digest FROM memory_inputs WHERE cell IN ({marks})"
        )
        rows = session.connection().exec_driver_sql(sql, (*chunk, *chunk))
        found.update(((cell, part), digest) for cell, part, digest in rows)
    return found
