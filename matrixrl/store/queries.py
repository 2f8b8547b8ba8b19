"""Queries: the Store's reads for reports, its caches (summaries, trainings, figures), and read_table.

docs/architecture.md, "Reports at scale".
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import pandas as pd
from sqlalchemy import select
from sqlalchemy.orm import Session

from matrixrl.errors import DiskError, disk_errors_named
from matrixrl.layout import store_path
from matrixrl.store.ingestion import check_records, engine_at, engine_for, repairing
from matrixrl.store.schema import CELL_SUMMARIES, CELL_TRAININGS, FIGURES, IN_CHUNK, METADATA
from matrixrl.store.writes import Result, is_cell_part, refresh_keys, upsert_sql, write_result


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
                check_records(result)
                keys.append(write_result(session, result))
            refresh_keys(session, {cell for cell, part in keys if is_cell_part(cell, part)})
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
            for start in range(0, max(len(cells), 1), IN_CHUNK):
                chunk = list(cells[start : start + IN_CHUNK])
                where, params = [f"cell IN ({', '.join('?' * len(chunk))})"], chunk
                for column, wanted in equal.items():
                    values = [wanted] if isinstance(wanted, str) else list(wanted)
                    where.append(f'"{sql_table.c[column].name}" IN ({", ".join("?" * len(values))})')
                    params = [*params, *values]
                frames.append(pd.read_sql(f"SELECT {columns} FROM {table} WHERE {' AND '.join(where)}", driver, params=params))
        return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]

    def _select(self, sql: str, cells: Sequence[str]) -> list[tuple]:
        """The rows of ``sql`` (whose one ``{cells}`` placeholder is a ``cell IN (...)`` list) for ``cells``.

        Plain driver rows: a DataFrame would cost more than the query.
        """
        found: list[tuple] = []
        with self.engine.connect() as conn:
            driver = conn.connection.driver_connection  # sqlite3's own: rows as plain tuples
            for start in range(0, len(cells), IN_CHUNK):
                chunk = list(cells[start : start + IN_CHUNK])
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
        what a cache key of the cell's results is made of; cells with none are absent. Read
        from ``cell_keys``, but for a cell with a result of another spec than its current one.
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
        """Per cell, the cached ``(cache key, training part)`` of its summary (``analysis.cell_record.training_part``)."""
        rows = self._select("SELECT cell, cache_key, training FROM cell_trainings WHERE cell IN ({cells})", cells)
        return {cell: (key, json.loads(training)) for cell, key, training in rows}

    def save_summaries(
        self, summaries: Mapping[str, tuple[str, dict]], trainings: Mapping[str, tuple[str, dict]] | None = None
    ) -> None:
        """Cache ``{cell: (cache key, summary)}``, counting each cell's computations, and
        ``trainings``, ``{cell: (cache key, training part)}``, in one transaction; a store that
        cannot be written keeps its old entries.
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
                driver.executemany(upsert_sql(CELL_TRAININGS, ("cell", "cache_key", "training")), parts)

    @contextlib.contextmanager
    def _caching(self):
        """One transaction on sqlite3's connection that writes the caches only, committed without
        waiting for the disk (docs/architecture.md, "Reports at scale")."""
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
            for start in range(0, len(names), IN_CHUNK):
                chunk = list(names[start : start + IN_CHUNK])
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
                driver.executemany(upsert_sql(FIGURES, ("name", "cache_key", "png")), rows)
        except DiskError:
            pass

    def computations(self) -> dict[str, int]:
        """How many times each cell's summary has been computed (it is cached in between)."""
        with self.engine.connect() as conn:
            return dict(conn.execute(select(CELL_SUMMARIES.c.cell, CELL_SUMMARIES.c.computations)).all())
