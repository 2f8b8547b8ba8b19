"""Repair: a store that cannot be used is told, moved aside and created anew (docs/faults.md, "The store")."""

from __future__ import annotations

import os
import sqlite3
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pandas as pd
import sqlalchemy.exc
from sqlalchemy import create_engine

from matrixrl.errors import UserError
from matrixrl.store.schema import METADATA, SCHEMA_VERSION, expected_columns

_COMPANIONS = ("-journal", "-wal", "-shm")
"""The files SQLite keeps next to a database while it writes it."""


class StoreError(UserError):
    """A store that cannot be used and cannot be moved aside to be rebuilt."""


@dataclass(frozen=True)
class StoreProblem:
    """Why a store file cannot be used, as the note and the error say it."""

    was: str  # "was damaged (...)": the note, after it was moved aside
    now: str  # "is damaged (...)": the error, when it cannot be moved
    inode: int  # of the file inspected: another process may have replaced it since
    kind: str = "damaged"  # the moved file's suffix: NAME.KIND-YYYYmmdd-HHMMSS


def _damaged(reason: str, inode: int) -> StoreProblem:
    reason = " ".join(reason.split())  # one line
    return StoreProblem(f"was damaged ({reason})", f"is damaged ({reason})", inode)


NEW_STORE = "new"
"""What :func:`inspect_store` says of a missing or empty store file: create its tables."""


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


def inspect_store(db_file: Path, thorough: bool = False) -> StoreProblem | str | None:
    """What makes ``db_file`` unusable as a store of this version (a :class:`StoreProblem`);
    ``NEW_STORE`` if it is missing or an empty database; None if it is usable.

    Only reads; ``thorough`` adds ``PRAGMA quick_check`` (the whole file). Raises
    ``sqlite3.OperationalError`` (a lock held too long, say): not damage.
    """
    try:
        stat = db_file.stat()
    except FileNotFoundError:
        return NEW_STORE
    if stat.st_size == 0:
        return NEW_STORE  # SQLite's empty database: a store being created
    try:
        # mode=rw: never create a file that is gone by now
        conn = sqlite3.connect(f"{db_file.resolve().as_uri()}?mode=rw", uri=True, timeout=30)
    except sqlite3.OperationalError:
        if not db_file.exists():
            return NEW_STORE
        raise
    try:
        # One read transaction: what it reads is one committed state, never a writer's half-written one.
        conn.execute("BEGIN")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if version == 0 and not tables:
            return NEW_STORE
        if version != SCHEMA_VERSION:
            said = f"written by another version of matrixrl (store schema {version}, this one uses {SCHEMA_VERSION})"
            return StoreProblem(f"was {said}", f"was {said}", stat.st_ino, kind=f"schema-{version}")
        for table, expected in expected_columns().items():
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


def set_aside(db_file: Path, problem: StoreProblem) -> None:
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


def _fill(db_file: Path) -> None:
    engine = create_engine(f"sqlite:///{db_file}")
    try:
        with engine.begin() as conn:
            METADATA.create_all(conn)
            conn.exec_driver_sql(f"PRAGMA user_version = {SCHEMA_VERSION}")
    finally:
        engine.dispose()


def create_store(db_file: Path) -> None:
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


def repair_and_run(db_file: Path, action: Callable[[], T], rebuild: Callable[[Path], object] | None) -> T:
    """``repairing``'s work (see there): ``rebuild``, if any, fills the new store."""
    try:
        return action()
    except _DATABASE_ERRORS as exc:
        try:
            problem = inspect_store(db_file, thorough=True)
        except sqlite3.OperationalError:
            problem = None
        if not isinstance(problem, StoreProblem):
            raise
        cause = _sqlite_error(exc)
        if problem.was.startswith("was damaged") and cause is not None:
            # SQLite's own words for what failed ("database disk image is malformed"),
            # rather than quick_check's page-by-page account
            problem = _damaged(str(cause), problem.inode)
        error = exc
    set_aside(db_file, problem)
    if rebuild is not None:
        rebuild(db_file)
    try:
        return action()
    except _DATABASE_ERRORS as again:
        raise again from error
