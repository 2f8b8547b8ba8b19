"""The SQLite store: every checkpoint's accuracy and every step's training metrics.

An index over the result files; names imported on first use, so ``plan`` imports no SQLAlchemy or pandas.
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
