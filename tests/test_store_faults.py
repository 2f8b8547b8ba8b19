"""Faults of the store: it mirrors the result files exactly, and a damaged one rebuilds itself.

- A result file that is gone takes its rows with it; a result computed under
  another spec than the cell's current one (an old schedule's checkpoint left on
  disk) is never reported.
- A store damaged any way (truncated, overwritten, a table dropped, a column
  missing, another schema version) is moved aside with one note on stderr and
  rebuilt from the result files: ``report`` and ``plot`` exit 0 with the tables of
  an undamaged store.

States are built by writing result files directly (no training).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import sqlite3
import time
from pathlib import Path

import pytest

from matrixrl.config import load_config
from matrixrl.grid import Cell, cell_spec, runs
from matrixrl.layout import STORE_FILE, eval_result, train_result
from matrixrl.report.plots import load_study
from matrixrl.report.rows import current_specs
from matrixrl.report.tables import build_tables
from matrixrl.results import DiagnosticRow, EvalResult, RoleMetric, StepMetrics, TrainResult, write_result
from matrixrl.store import SCHEMA_VERSION, Store, ingest

from conftest import run_cli
from test_cli_errors import assert_user_error

SINGLE = Cell(workflow="single", task="arith", scale="tiny-s", policy="shared", seed=0)
VOTING = Cell(workflow="voting", task="arith", scale="tiny-s", policy="shared", seed=0)
STUDY = (SINGLE, VOTING)
ONLY = ("--only", "workflow=single,voting", "--only", "task=arith", "--only", "scale=tiny-s", "--only", "policy=shared")
CURVES = {SINGLE.id: (0.25, 0.5, 0.375), VOTING.id: (0.25, 0.625, 0.125)}
N = 256
REBUILDING = "rebuilding the store from the result files"


def config_of(experiment: Path, sets=()):
    return load_config(experiment, sets=list(sets), only=[o for o in ONLY[1::2]])


def train_file(results: Path, config, cell: Cell, steps: int, digest: str | None = "current") -> None:
    metrics = [
        StepMetrics(step=s, reward_mean=0.5, reward_std=0.1, loss=0.2, entropy=1.0, response_length=2.0,
                    grad_norm=0.3, clip_fraction=0.0, group_size=8, seconds=0.1)  # fmt: skip
        for s in range(1, steps + 1)
    ]
    diagnostics = [
        DiagnosticRow(step=s, kind=kind, role="generator", agent=None, other=None, value=value)
        for s in range(1, steps + 1)
        for kind, value in (("role_norm", 0.1 * s), ("role_share", 1.0))
    ]
    roles = [RoleMetric(step=s, role="generator", metric="answer_acc", value=0.5) for s in range(1, steps + 1)]
    spec = cell_spec(config, cell).train_digest() if digest == "current" else digest
    result = TrainResult(cell=cell.id, axes=cell.axes(), steps=steps, spec_digest=spec, metrics=metrics,
                         diagnostics=diagnostics, roles=roles)  # fmt: skip
    write_result(results / train_result(cell.id), result)


def eval_file(results: Path, config, cell: Cell, step: int, accuracy: float, digest: str | None = "current") -> None:
    spec = cell_spec(config, cell).eval_digest() if digest == "current" else digest
    correct = round(accuracy * N)
    roles = [RoleMetric(role="generator", metric="answer_acc", value=accuracy)]
    result = EvalResult(cell=cell.id, step=step, accuracy=correct / N, n=N, n_correct=correct, seconds=0.1,
                        roles=roles, pass_at={"1": accuracy}, spec_digest=spec)  # fmt: skip
    write_result(results / eval_result(cell.id, step), result)


def write_study(results: Path, config) -> None:
    """Both cells trained 20 steps and evaluated at 0, 10 and 20, under ``config``'s specs."""
    for cell in STUDY:
        train_file(results, config, cell, 20)
        for step, accuracy in zip((0, 10, 20), CURVES[cell.id]):
            eval_file(results, config, cell, step, accuracy)


def report(experiment: Path, *args: str, table: str = "summary"):
    return run_cli("report", "-c", experiment, *ONLY, "--table", table, "--format", "json", *args)


def rows(result) -> list[dict]:
    assert result.exit_code == 0, (result.output, result.exception)
    return json.loads(result.stdout)


def stored(db: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


DATA = {
    "cells": "select * from cells order by cell",
    "evaluations": "select * from evaluations order by cell, step",
    "train_steps": "select * from train_steps order by cell, step",
    "diagnostics": "select cell, step, kind, role, agent, other, value from diagnostics order by cell, step, kind, role",
    "role_metrics": "select * from role_metrics order by cell, source, step, role, metric",
    "cell_inputs": "select * from cell_inputs order by cell, part",
    "ingested_files": "select path, size, mtime_ns, inode, cell, part from ingested_files order by path",  # not read_ns: when, not what
}


def contents(db: Path) -> dict[str, list[tuple]]:
    """Everything the store holds from the result files."""
    return {table: stored(db, sql) for table, sql in DATA.items()}


@pytest.fixture
def study(experiment: Path):
    """(experiment, results, store) of a two-cell study, reported once (so its store exists)."""
    results = experiment.parent / "results"
    write_study(results, config_of(experiment))
    assert len(rows(report(experiment))) == 2
    return experiment, results, results / STORE_FILE


# --- a damaged store -------------------------------------------------------------------------


def _sql(statement: str):
    def damage(db: Path) -> None:
        with sqlite3.connect(db) as conn:
            conn.execute(statement)

    return damage


def _truncate(db: Path) -> None:
    os.truncate(db, db.stat().st_size // 2)


def _garbage(db: Path) -> None:
    db.write_bytes(b"not a database, just bytes. " * (db.stat().st_size // 28))


DAMAGE = {
    "truncated": (_truncate, "was damaged (database disk image is malformed)"),
    "garbage": (_garbage, "was damaged (file is not a database)"),
    "table-dropped": (_sql("drop table evaluations"), "was damaged (table evaluations is missing)"),
    "column-missing": (_sql("alter table evaluations drop column se"), "was damaged (table evaluations has no column se)"),
    "column-added": (_sql("alter table cells add column colour text"), "was damaged (table cells has an unexpected column colour)"),
    "older-version": (
        _sql("pragma user_version = 1"),
        f"was written by another version of matrixrl (store schema 1, this one uses {SCHEMA_VERSION})",
    ),
}


def moved_aside(db: Path, kind: str = "damaged") -> Path:
    """The one file the unusable store was moved to (``NAME.KIND-YYYYmmdd-HHMMSS``)."""
    aside = sorted(db.parent.glob(f"{db.name}.*-*"))
    assert len(aside) == 1, aside
    assert re.fullmatch(rf"{re.escape(db.name)}\.{kind}-\d{{8}}-\d{{6}}", aside[0].name), aside[0].name
    return aside[0]


def store_notes(result) -> str:
    """A report's stderr without its note on the cells not finished, which the result files
    written here by hand (no retention records, no summary) never are."""
    return "".join(line for line in result.stderr.splitlines(keepends=True) if "cells are not finished" not in line)


def note(db: Path, problem: str, aside: Path) -> str:
    return f"note: {db} {problem}; moved it to {aside}, {REBUILDING}\n"


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_store_is_moved_aside_and_rebuilt_from_the_result_files(study, case: str) -> None:
    experiment, results, db = study
    tables = {name: rows(report(experiment, table=name)) for name in ("summary", "diagnostics")}
    undamaged = contents(db)
    damage, problem = DAMAGE[case]
    damage(db)
    damaged = db.read_bytes()

    result = report(experiment)
    assert result.exit_code == 0, (result.output, result.exception)
    aside = moved_aside(db, "schema-1" if case == "older-version" else "damaged")
    assert store_notes(result) == note(db, problem, aside)
    assert json.loads(result.stdout) == tables["summary"]
    assert aside.read_bytes() == damaged  # kept as it was, next to the new store
    assert stored(db, "pragma user_version") == [(SCHEMA_VERSION,)]
    assert contents(db) == undamaged

    # The new store is sound: no note, the same tables.
    for name, expected in tables.items():
        again = report(experiment, table=name)
        assert store_notes(again) == ""
        assert rows(again) == expected
    assert moved_aside(db, "schema-1" if case == "older-version" else "damaged") == aside


def test_plot_on_a_damaged_store(study) -> None:
    experiment, results, db = study
    _garbage(db)
    result = run_cli("plot", "-c", experiment, *ONLY)
    assert result.exit_code == 0, (result.output, result.exception)
    aside = moved_aside(db)
    assert store_notes(result) == note(db, "was damaged (file is not a database)", aside)
    assert result.stdout == f"{results / 'plots' / 'curves-arith.png'}\n"
    assert stored(db, "select cell, step from evaluations order by cell, step") == [
        (c.id, s) for c in sorted(STUDY, key=lambda c: c.id) for s in (0, 10, 20)
    ]


def _overwrite_table(db: Path, table: str) -> None:
    """Damage inside the file: the table's root page overwritten; header and schema intact."""
    with sqlite3.connect(db) as conn:
        root = conn.execute("select rootpage from sqlite_master where name = ?", (table,)).fetchone()[0]
        page = conn.execute("pragma page_size").fetchone()[0]
    with open(db, "r+b") as f:
        f.seek((root - 1) * page)
        f.write(b"\xff" * page)


@pytest.mark.parametrize("table", ["cell_inputs", "ingested_files"])
def test_damage_found_when_reading_the_store_fails_is_repaired_too(study, table: str) -> None:
    """The cheap checks at opening pass; the read that fails is retried on a rebuilt store."""
    experiment, results, db = study
    expected = rows(report(experiment))
    undamaged = contents(db)
    _overwrite_table(db, table)
    result = report(experiment)
    assert result.exit_code == 0, (result.output, result.exception)
    assert store_notes(result) == note(db, "was damaged (database disk image is malformed)", moved_aside(db))
    assert json.loads(result.stdout) == expected
    assert contents(db) == undamaged


def test_a_damaged_store_that_cannot_be_moved_aside_is_one_line(study, monkeypatch) -> None:
    experiment, results, db = study
    _garbage(db)
    damaged = db.read_bytes()

    def read_only(src, dst, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(src))

    monkeypatch.setattr(os, "rename", read_only)
    assert_user_error(
        report(experiment),
        f"{db} is damaged (file is not a database) and cannot be moved aside (Permission denied); "
        f"make {results} writable or delete the file, then run the command again to rebuild the store from the result files",
    )
    assert db.read_bytes() == damaged
    assert not list(results.glob(f"{STORE_FILE}.damaged-*"))


@pytest.mark.parametrize("companion", ["-journal", "-wal"])
def test_no_journal_of_the_damaged_store_is_left_next_to_the_new_one(study, companion: str) -> None:
    """Left there, SQLite would play it back into the new store. (SQLite plays back or
    discards one itself when it first reads the damaged file; what is left is moved with it.)"""
    experiment, results, db = study
    _garbage(db)
    Path(f"{db}{companion}").write_bytes(b"the journal of the damaged store")
    result = report(experiment)
    assert result.exit_code == 0, (result.output, result.exception)
    aside = moved_aside(db)
    assert sorted(p.name for p in results.iterdir() if p.name.startswith(STORE_FILE)) in (
        [STORE_FILE, aside.name], [STORE_FILE, aside.name, f"{aside.name}{companion}"]
    )
    assert len(rows(report(experiment))) == 2


def test_ingest_reads_every_file_into_the_new_store(study, capsys) -> None:
    experiment, results, db = study
    _truncate(db)
    assert ingest(results) == 8  # 2 train + 6 evaluation files
    assert capsys.readouterr().err.startswith(f"note: {db} was damaged (database disk image is malformed); moved it to ")
    assert ingest(results) == 0
    assert capsys.readouterr().err == ""


def test_a_store_opened_directly_is_rebuilt_too(study, capsys) -> None:
    """``build_tables`` (no ingest first) on a damaged store: the same tables."""
    experiment, results, db = study
    config = config_of(experiment)
    expected = build_tables(db, config, ["summary"])["summary"]
    _sql("drop table cell_summaries")(db)
    rebuilt = build_tables(db, config, ["summary"])["summary"]
    assert capsys.readouterr().err == note(db, "was damaged (table cell_summaries is missing)", moved_aside(db))
    assert rebuilt.equals(expected)


# --- the store mirrors the files -------------------------------------------------------------


def test_a_deleted_evaluation_file_takes_its_rows_with_it(study) -> None:
    experiment, results, db = study
    with Store(db) as store:
        before = store.computations()
    (results / eval_result(VOTING.id, 20)).unlink()

    single, voting = rows(report(experiment))
    assert (voting["workflow"], voting["n_checkpoints"], voting["final"], voting["cliff"]) == ("voting", 2, 0.625, False)
    assert single["n_checkpoints"] == 3
    assert stored(db, f"select step from evaluations where cell = '{VOTING.id}'") == [(0,), (10,)]
    assert stored(db, f"select distinct step from role_metrics where cell = '{VOTING.id}' and source = 'eval'") == [(0,), (10,)]
    assert stored(db, f"select part from cell_inputs where cell = '{VOTING.id}' order by part") == [
        ("eval/step_0",), ("eval/step_10",), ("train",)
    ]
    assert (eval_result(VOTING.id, 20),) not in stored(db, "select path from ingested_files")
    # Its cached summary was refreshed (its inputs changed), the other cell's was not.
    with Store(db) as store:
        assert store.computations() == {**before, VOTING.id: before[VOTING.id] + 1}


def test_a_deleted_train_file_takes_its_rows_with_it(study) -> None:
    experiment, results, db = study
    assert [r["workflow"] for r in rows(report(experiment, table="diagnostics"))] == ["single", "voting"]
    (results / train_result(VOTING.id)).unlink()
    assert [r["workflow"] for r in rows(report(experiment, table="diagnostics"))] == ["single"]
    for table in ("cells", "train_steps", "diagnostics"):
        assert stored(db, f"select count(*) from {table} where cell = '{VOTING.id}'") == [(0,)], table
    assert stored(db, f"select count(*) from role_metrics where cell = '{VOTING.id}' and source = 'train'") == [(0,)]
    assert stored(db, f"select count(*) from role_metrics where cell = '{VOTING.id}' and source = 'eval'") == [(6,)]
    assert stored(db, f"select part from cell_inputs where cell = '{VOTING.id}' and part = 'train'") == []
    assert [r["n_checkpoints"] for r in rows(report(experiment))] == [3, 3]  # its evaluations stay


def test_a_cell_whose_files_are_all_gone_leaves_the_store_and_the_report(study) -> None:
    experiment, results, db = study
    shutil.rmtree(results / "cells" / VOTING.id)
    assert [r["workflow"] for r in rows(report(experiment))] == ["single"]
    for table in DATA:
        column = "path" if table == "ingested_files" else "cell"
        assert stored(db, f"select count(*) from {table} where {column} like '%{VOTING.id}%'") == [(0,)], table
    assert stored(db, "select cell from cell_summaries") == [(SINGLE.id,)]
    assert stored(db, "select cell from cell_trainings") == [(SINGLE.id,)]


def test_deletions_wait_for_every_file_to_be_valid(study) -> None:
    """One transaction: a corrupt new file aborts the ingest, deletions included."""
    experiment, results, db = study
    store_bytes = db.read_bytes()
    (results / eval_result(VOTING.id, 20)).unlink()
    bad = results / eval_result(SINGLE.id, 30)
    bad.write_text("{not json")
    assert_user_error(report(experiment), f"{bad}: corrupt result file (not valid JSON); delete it and run `matrixrl run` to recompute it")
    assert db.read_bytes() == store_bytes
    bad.unlink()
    assert [r["n_checkpoints"] for r in rows(report(experiment))] == [3, 2]


def test_a_file_rewritten_for_another_cell_replaces_the_rows_of_the_old_one(study) -> None:
    """A file's rows are keyed by the result it held: what it holds now replaces them."""
    experiment, results, db = study
    config = config_of(experiment)
    eval_file(results, config, VOTING, 20, 0.5)
    assert rows(report(experiment))[1]["final"] == 0.5
    assert stored(db, f"select accuracy from evaluations where cell = '{VOTING.id}' and step = 20") == [(0.5,)]


# --- only the current spec's results ---------------------------------------------------------

FIRST = ("--set", "train.steps=4", "--set", "train.eval_every=2")  # evaluations at 0, 2, 4
SECOND = ("--set", "train.steps=4", "--set", "train.eval_every=4")  # evaluations at 0, 4


def sets(args: tuple[str, ...]) -> list[str]:
    return list(args[1::2])


def run_schedule(results: Path, config, steps: tuple[int, ...], curve: tuple[float, ...]) -> None:
    """What a run of SINGLE under ``config`` writes: its train.json and an evaluation per checkpoint."""
    train_file(results, config, SINGLE, 4)
    for step, accuracy in zip(steps, curve):
        eval_file(results, config, SINGLE, step, accuracy)


def test_an_old_schedules_checkpoint_left_on_disk_is_not_reported(experiment: Path) -> None:
    results = experiment.parent / "results"
    first, second = config_of(experiment, sets(FIRST)), config_of(experiment, sets(SECOND))
    assert cell_spec(first, SINGLE).eval_digest() != cell_spec(second, SINGLE).eval_digest()
    run_schedule(results, first, (0, 2, 4), (0.25, 0.75, 0.5))
    ingest(results)
    summary = build_tables(results / STORE_FILE, first, ["summary"])["summary"]
    assert summary.loc[summary["cell"] == SINGLE.id, "n_checkpoints"].tolist() == [3]

    # The rerun under the second schedule rewrites train.json, step_0 and step_4; step_2 stays on disk.
    run_schedule(results, second, (0, 4), (0.25, 0.375))
    assert (results / eval_result(SINGLE.id, 2)).is_file()
    ingest(results)
    summary = build_tables(results / STORE_FILE, second, ["summary"])["summary"]
    row = summary[summary["cell"] == SINGLE.id].iloc[0]
    assert (row["n_checkpoints"], row["peak"], row["peak_step"], row["final"]) == (2, 0.375, 4, 0.375)
    study = load_study(second)
    assert study.evals.loc[study.evals["cell"] == SINGLE.id, "step"].tolist() == [0, 4]
    assert set(study.diagnostics["cell"]) == {SINGLE.id}  # trained under the second spec


def test_a_training_of_another_spec_is_not_reported(experiment: Path) -> None:
    """Evaluations of the current spec but a train.json of an older one: no diagnostics from it."""
    results = experiment.parent / "results"
    first, second = config_of(experiment, sets(FIRST)), config_of(experiment, sets(SECOND))
    train_file(results, first, SINGLE, 4)
    for step, accuracy in zip((0, 4), (0.25, 0.375)):
        eval_file(results, second, SINGLE, step, accuracy)
    ingest(results)
    tables = build_tables(results / STORE_FILE, second, ["summary", "diagnostics"])
    summary, diagnostics = tables["summary"], tables["diagnostics"]
    assert summary.loc[summary["cell"] == SINGLE.id, "n_checkpoints"].tolist() == [2]
    assert SINGLE.id not in diagnostics["cell"].tolist()
    assert load_study(second).diagnostics.empty
    # Under the first spec it is the training that counts, and its evaluations that do not.
    tables = build_tables(results / STORE_FILE, first, ["summary", "diagnostics"])
    assert SINGLE.id in tables["diagnostics"]["cell"].tolist()
    assert SINGLE.id not in tables["summary"]["cell"].tolist()  # no evaluation of that spec


def test_results_without_spec_digests_are_kept(experiment: Path) -> None:
    """Files written before spec digests existed are reported whatever the spec."""
    results = experiment.parent / "results"
    second = config_of(experiment, sets(SECOND))
    train_file(results, second, SINGLE, 4, digest=None)
    for step, accuracy in zip((0, 2, 4), (0.25, 0.75, 0.5)):
        eval_file(results, second, SINGLE, step, accuracy, digest=None)
    ingest(results)
    tables = build_tables(results / STORE_FILE, second, ["summary", "diagnostics"])
    assert tables["summary"].loc[tables["summary"]["cell"] == SINGLE.id, "n_checkpoints"].tolist() == [3]
    assert SINGLE.id in tables["diagnostics"]["cell"].tolist()
    assert load_study(second).evals["step"].tolist() == [0, 2, 4]


def test_the_report_shows_the_current_schedules_checkpoints_through_the_cli(experiment: Path) -> None:
    results = experiment.parent / "results"
    only = ("--only", "workflow=single", "--only", "task=arith", "--only", "scale=tiny-s", "--only", "policy=shared")
    first, second = config_of(experiment, sets(FIRST)), config_of(experiment, sets(SECOND))
    run_schedule(results, first, (0, 2, 4), (0.25, 0.75, 0.5))
    result = run_cli("report", "-c", experiment, *only, *FIRST, "--format", "json")
    assert [(r["n_checkpoints"], r["peak"]) for r in rows(result)] == [(3, 0.75)]

    run_schedule(results, second, (0, 4), (0.25, 0.375))
    result = run_cli("report", "-c", experiment, *only, *SECOND, "--format", "json")
    assert store_notes(result) == ""
    assert [(r["n_checkpoints"], r["peak"], r["final"]) for r in rows(result)] == [(2, 0.375, 0.375)]


def test_current_specs_are_the_cells_spec_digests(experiment: Path) -> None:
    config = load_config(experiment)
    digests = current_specs(config)
    assert list(digests) == [run.id for run in runs(config)]
    for run in runs(config):
        spec = cell_spec(config, run)
        assert digests[run.id] == (spec.train_digest(), spec.eval_digest())


def test_the_schema_version_changes_with_the_tables() -> None:
    """A store whose tables differ from this matrixrl's must carry another version, so it is
    moved aside as another schema's (sound, readable by the matrixrl that wrote it), not as damaged."""
    import hashlib

    from matrixrl.store.schema import SCHEMA_VERSION, expected_columns

    tables = hashlib.sha256(json.dumps(expected_columns(), sort_keys=True).encode()).hexdigest()[:12]
    assert (SCHEMA_VERSION, tables) == (8, "4c4e74c03a3d"), (
        "the store's tables changed: bump matrixrl.store.SCHEMA_VERSION, then update this pair"
    )


# --- telling a changed result file by its size, time and inode ------------------------------


def test_a_result_file_changed_behind_its_size_and_time_is_still_read(tmp_path: Path, monkeypatch) -> None:
    """The store reads a file again when its size, time or inode changed, or when it changed
    just before its last reading (a coarse clock could hide a second write then); a file
    that did not, it does not read at all."""
    import matrixrl.store.ingestion as ingestion

    results = tmp_path / "results"
    c = Cell("single", "arith", "tiny-s", "shared", 0)
    path = results / eval_result(c.id, 0)

    def evaluation(seconds: float) -> EvalResult:
        return EvalResult(cell=c.id, step=0, accuracy=0.25, n=256, n_correct=64, seconds=seconds)

    def set_time(ns: int) -> None:
        os.utime(path, ns=(ns, ns))

    def stored_seconds() -> list[tuple]:
        return stored(results / STORE_FILE, "select seconds from evaluations")

    write_result(path, evaluation(0.1))
    an_hour_ago = time.time_ns() - 3600 * 10**9
    set_time(an_hour_ago)
    assert ingest(results) == 1

    # Replaced by a new file of the same size, its time set back: its new inode tells.
    write_result(path, evaluation(0.2))
    set_time(an_hour_ago)
    assert ingest(results) == 1 and stored_seconds() == [(0.2,)]

    # Unchanged: not even read.
    reads = []
    real = ingestion.read_result
    monkeypatch.setattr(ingestion, "read_result", lambda *args: reads.append(args[0]) or real(*args))
    assert ingest(results) == 0 and reads == []

    # Written over in place (same inode, same size) just before it is read, then once more
    # with its time kept, as a file system that keeps seconds would: read again, and noticed.
    just_now = time.time_ns()
    path.write_text(path.read_text().replace('"seconds": 0.2', '"seconds": 0.3'))
    set_time(just_now)
    assert ingest(results) == 1 and stored_seconds() == [(0.3,)]
    path.write_text(path.read_text().replace('"seconds": 0.3', '"seconds": 0.4'))
    set_time(just_now)
    assert ingest(results) == 1 and stored_seconds() == [(0.4,)]
    # Read again while it is that recent, but nothing written when its result is the same.
    assert ingest(results) == 0 and reads == [path, path, path]
