"""The SQLite store: every checkpoint's accuracy and every step's training metrics.

Result files are the truth; the store is an index over them that mirrors them
exactly and makes tables quick to regenerate. Only the submitting host writes the
store (never a cluster job). One module per concern:

- ``schema``: the tables (those of results derived from ``matrixrl.results``), the
  schema version, the engine's settings;
- ``repair``: telling a store that cannot be used, moving it aside, creating a new one;
- ``writes``: what one result puts in the store and takes out, its digest, its cell's keys;
- ``ingestion``: ``ingest``, the store made to mirror the result files (and so rebuilt),
  and the store opened (``engine_at``, ``repairing``);
- ``queries``: :class:`Store`, the reads and caches of reports, and ``read_table``;
- ``recorded_costs``: every job cost the store holds, read without SQLAlchemy (``plan``'s estimate).

The names below are imported on first use (PEP 562): ``plan`` reads the store's costs
without paying for SQLAlchemy and pandas, a second at start.
"""

from __future__ import annotations

import importlib

from matrixrl.layout import store_path  # light: where the store file lives

_HOMES = {
    "METADATA": "schema",
    "SCHEMA_VERSION": "schema",
    "RACY_NS": "ingestion",
    "RESULT_FILES": "ingestion",
    "engine_at": "ingestion",
    "engine_for": "ingestion",
    "ingest": "ingestion",
    "ingest_for_report": "ingestion",
    "repairing": "ingestion",
    "Store": "queries",
    "read_table": "queries",
    "recorded_costs": "recorded_costs",
    "StoreError": "repair",
    "Result": "writes",
}

__all__ = sorted([*_HOMES, "store_path"])


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'matrixrl.store' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"matrixrl.store.{_HOMES[name]}"), name)
    globals()[name] = value  # once
    return value
