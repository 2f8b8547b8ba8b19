"""Ingest: the store made to mirror the result files, and opened (rebuilt from them if unusable).

docs/faults.md, "The store".
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from matrixrl import layout as L
from matrixrl.config import AXES
from matrixrl.errors import ConfigError, ResultFileError, disk_errors_named
from matrixrl.layout import STORE_FILE, store_path
from matrixrl.results import (
    INT64_MAX,
    BankResult,
    DistilledResult,
    EvalResult,
    LabelsResult,
    MemoryEvalResult,
    TrainResult,
    TrajectoriesResult,
    read_result,
)
from matrixrl.store.repair import NEW_STORE, T, StoreProblem, create_store, inspect_store, repair_and_run, set_aside
from matrixrl.store.schema import CELL_INPUTS, CELL_SUMMARIES, CELL_TRAININGS, INGESTED_FILES, MEMORY_INPUTS, open_engine
from matrixrl.store.writes import (
    Result,
    forget_result,
    is_cell_part,
    refresh_keys,
    result_digest,
    store_key,
    stored_digests,
    upsert_rows,
    write_result,
)


def engine_at(db_file: str | Path):
    """An engine on the SQLite store ``db_file``, the one way the store is opened: a missing
    store is created, an unusable one moved aside with a note and rebuilt from its result files.
    """
    db_file = Path(db_file)
    with disk_errors_named(db_file, "the store"):
        state = inspect_store(db_file)
        if isinstance(state, StoreProblem):
            set_aside(db_file, state)
            _rebuild(db_file)
            state = NEW_STORE if not db_file.exists() else None
        if state == NEW_STORE:
            create_store(db_file)
    return open_engine(db_file)


def engine_for(results_dir: str | Path):
    return engine_at(store_path(results_dir))


def repairing(db_file: str | Path, action: Callable[[], T], *, rebuild: bool = True) -> T:
    """``action()`` (which opens and closes the store ``db_file``), run once more after moving a
    damaged store aside and (unless ``rebuild`` is false) rebuilding it. A full disk or a
    read-only folder is a :class:`DiskError` naming the store."""
    db_file = Path(db_file)
    with disk_errors_named(db_file, "the store"):
        return repair_and_run(db_file, action, _rebuild if rebuild else None)


def _rebuild(db_file: Path) -> None:
    """Fill a new store at ``db_file`` from the result files next to it (a results directory's store)."""
    if db_file.name == STORE_FILE:
        ingest(db_file.parent)


_FIX = "delete it and run `matrixrl run` to recompute it"


def _read(path: Path, kind: type) -> Result:
    """``read_result``, and for the memory's results the records in them checked too (a
    trajectory, label or entry the memory's own ``from_dict`` rejects; a repeated key): every
    file is validated before the store is written, so a corrupt one leaves it as it was."""
    result = read_result(path, kind)
    try:
        check_records(result)
    except (ValueError, TypeError, KeyError) as exc:
        raise ResultFileError(f"{path}: corrupt result file ({exc}); {_FIX}") from None
    return result


_RECORD_TYPES = {
    # The JSON types of the memory's records' fields (matrixrl.memcollab.data), checked with its
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


def check_records(result: Result) -> None:
    from matrixrl.memcollab.data import Entry, Label, Trajectory

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


def _changes(
    results_dir: Path, known: Mapping[str, tuple], again: bool
) -> tuple[list[tuple[Path, str, object, tuple[int, int, int]]], list[str], list[str]]:
    """The result files to read (new, changed, or backing a result a gone file held too),
    each with its ``(size, mtime_ns, inode)`` before it is read; the paths of known files
    that are gone; and those of known files once read as another result than their path's
    (forgotten as gone, then read again). A file is changed when any of the three differs,
    or when it had changed within :data:`RACY_NS` of its last reading.
    """
    found: dict[str, tuple[Path, object, tuple[int, int, int]]] = {}
    for pattern, kind in RESULT_FILES:
        for path in sorted(results_dir.glob(pattern)):
            stat = path.stat()
            found[str(path.relative_to(results_dir))] = (path, kind, (stat.st_size, stat.st_mtime_ns, stat.st_ino))
    gone = [rel for rel in known if rel not in found]
    misread = [rel for rel in known if rel in found and tuple(known[rel][4:]) != L.result_key(rel)]
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
    """Make the store mirror the result files in one transaction; returns how many files'
    results were new or changed. An unusable file raises ``ResultFileError``, writing nothing.
    """
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        return 0
    L.stand_in_store(results_dir, None)  # each ingest starts from the folder's own store
    return repairing(store_path(results_dir), lambda: _ingest(results_dir), rebuild=False)


def _ingest(results_dir: Path) -> int:
    db_file = store_path(results_dir)
    state = inspect_store(db_file)
    if isinstance(state, StoreProblem):
        set_aside(db_file, state)  # and read every file into a new store below
    began = time.time_ns()
    known, again = _known_files(results_dir)
    pending, gone, misread = _changes(results_dir, known, again)
    parsed = [(rel, _read(path, kind), signature) for path, rel, kind, signature in pending]
    for rel, result, _ in parsed:
        if store_key(result) != L.result_key(rel):  # read_result checks the fields that make the key: never
            raise ResultFileError(f"{results_dir / rel}: corrupt result file (holds {'/'.join(store_key(result))}); {_FIX}")
    if not parsed and not gone:
        return 0
    if not _writable(results_dir):
        _private_copy(results_dir)  # a read-only archive or shared copy: read into a copy of its store
    engine = engine_for(results_dir)
    written = 0
    try:
        with Session(engine) as session, session.begin():
            for rel in (*gone, *misread):
                forget_result(session, *known[rel][4:])
                session.execute(delete(INGESTED_FILES).where(INGESTED_FILES.c.path == rel))
            keys = [store_key(result) for _, result, _ in parsed]
            stored = stored_digests(session, {cell for cell, _ in keys}) if not again else {}
            for (rel, result, (size, mtime_ns, inode)), (cell, part) in zip(parsed, keys):
                if stored.get((cell, part)) != result_digest(result):
                    write_result(session, result)
                    written += 1
                # The file as it was before it was read: a change while it was read shows next time.
                row = {"path": rel, "size": size, "mtime_ns": mtime_ns, "inode": inode, "read_ns": began, "cell": cell, "part": part}
                upsert_rows(session, INGESTED_FILES, [row])
            # Only a cell's train and eval results are its summary's inputs: memory results leave
            # cell_keys, and so every cached summary, as they were.
            emptied = {known[rel][4] for rel in (*gone, *misread) if is_cell_part(*known[rel][4:])}
            refresh_keys(session, emptied | {cell for cell, part in keys if is_cell_part(cell, part)})
            if emptied:  # cells none of whose results are left: no cached summary either
                for cache in (CELL_SUMMARIES, CELL_TRAININGS):
                    session.execute(
                        delete(cache).where(cache.c.cell.in_(emptied), cache.c.cell.not_in(select(CELL_INPUTS.c.cell)))
                    )
    finally:
        engine.dispose()
    return written


def _writable(results_dir: Path) -> bool:
    """Whether this process may write ``results_dir``'s store (and its journal beside it):
    access(2) says no for a read-only file system as for a folder without write permission."""
    store = results_dir / STORE_FILE
    return os.access(results_dir, os.W_OK) and (not store.exists() or os.access(store, os.W_OK))


def _private_copy(results_dir: Path) -> Path:
    """A copy of ``results_dir``'s store in a temporary folder removed at exit, this process's
    store of ``results_dir`` until its next ingest (:func:`matrixrl.layout.stand_in_store`). Named
    apart from ``matrixrl.sqlite``: a rebuild would read the result files of the folder it is in."""
    folder = Path(tempfile.mkdtemp(prefix="matrixrl-store-"))
    atexit.register(shutil.rmtree, folder, True)
    copy = folder / "store-copy.sqlite"
    if (results_dir / STORE_FILE).exists():
        shutil.copyfile(results_dir / STORE_FILE, copy)
    L.stand_in_store(results_dir, copy)
    return copy


def ingest_for_report(results_dir: str | Path) -> int:
    """``ingest`` before a report or a plot (returns how many files were read); ConfigError
    when there is nothing to read at all."""
    if not L.has_results(results_dir):
        raise ConfigError(f"{Path(results_dir)}: no results yet; run `matrixrl run` first")
    return ingest(results_dir)
