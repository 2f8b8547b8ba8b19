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
- ``queries``: :class:`Store`, the reads and caches of reports, and ``read_table``.
"""

from matrixrl.layout import store_path
from matrixrl.store.ingestion import RACY_NS, RESULT_FILES, engine_at, engine_for, ingest, ingest_for_report, repairing
from matrixrl.store.queries import Store, read_table
from matrixrl.store.repair import StoreError
from matrixrl.store.schema import METADATA, SCHEMA_VERSION
from matrixrl.store.writes import Result

__all__ = [
    "METADATA",
    "RACY_NS",
    "RESULT_FILES",
    "SCHEMA_VERSION",
    "Result",
    "Store",
    "StoreError",
    "engine_at",
    "engine_for",
    "ingest",
    "ingest_for_report",
    "read_table",
    "repairing",
    "store_path",
]
