"""The per-cell records every table is built from, cached in the store under their inputs' key.

docs/architecture.md, "Reports at scale".
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence

import pandas as pd

from matrixrl.analysis.cell_record import ROLE_METRICS, TRAINING_METRICS, record_of, training_part
from matrixrl.config import Config
from matrixrl.store import Store

RECORD_VERSION = "12"
"""Part of every record's cache key: bump it when a record's computation changes, so caches refresh."""

DIAGNOSTIC_KINDS = ("role_share", "amplification", "role_norm")
"""The gradient-diagnostic kinds a record reads (the store holds more)."""


def record_cache_key(inputs: str, settings: Mapping) -> str:
    """What a cell's record is computed from: its results' digests (``Store.input_keys``), the
    settings, the record version."""
    blob = json.dumps({"inputs": inputs, "analysis": dict(settings), "version": RECORD_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _jsonable(record: dict) -> dict:
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in record.items()}


def compute_records(
    store: Store,
    cells: Mapping[str, str],
    config: Config,
    parts: Mapping[str, Sequence[tuple[str, str]]] | None = None,
    trainings: dict[str, dict] | None = None,
) -> dict[str, dict]:
    """Fresh records of ``cells`` (``{cell: policy}``) from the stored rows ``parts`` names; adds to ``trainings``."""
    trainings = {} if trainings is None else trainings
    ids = list(cells)
    untrained = [cell for cell in ids if cell not in trainings]
    frames = {
        "evals": store.rows("evaluations", ids),
        "roles": store.rows("role_metrics", ids, source="eval", metric=ROLE_METRICS),
    }
    if untrained:
        frames["train_roles"] = store.rows("role_metrics", untrained, source="train", metric=TRAINING_METRICS)
        frames["diagnostics"] = store.rows("diagnostics", untrained, kind=DIAGNOSTIC_KINDS)
    if len(ids) == 1:  # a new evaluation's cell: its rows as they are
        by_cell = {name: {ids[0]: frame} for name, frame in frames.items()}
    else:
        by_cell = {name: dict(tuple(frame.groupby("cell", sort=False))) for name, frame in frames.items()}
    records = {}
    for cell, policy in cells.items():
        rows = {name: by_cell[name].get(cell, frame.iloc[0:0]) for name, frame in frames.items()}
        kept = {part for part, _ in parts.get(cell, ())} if parts is not None else None
        if kept is not None:
            steps = {int(part.removeprefix("eval/step_")) for part in kept if part != "train"}
            rows["evals"] = rows["evals"][rows["evals"]["step"].isin(steps)]
            rows["roles"] = rows["roles"][rows["roles"]["step"].isin(steps)]
        try:
            if cell not in trainings:
                if kept is not None and "train" not in kept:
                    rows["diagnostics"] = rows["diagnostics"].iloc[0:0]
                    rows["train_roles"] = rows["train_roles"].iloc[0:0]
                trainings[cell] = training_part(policy, rows["diagnostics"], rows["train_roles"])
            record = record_of(trainings[cell], rows["evals"], rows["roles"], config.analysis)
        except ValueError as exc:
            raise ValueError(f"cell {cell!r}: {exc}") from exc
        records[cell] = _jsonable(record)
    return records


def training_cache_key(parts: Sequence[tuple[str, str]], policy: str, settings: Mapping) -> str:
    """What a cell's training part is computed from: its training's digest (if any), its policy
    mode, the settings and the record version."""
    train = [list(part) for part in parts if part[0] == "train"]
    blob = json.dumps({"train": train, "policy": policy, "analysis": dict(settings), "version": RECORD_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def cell_records(
    store: Store, cells: pd.DataFrame, config: Config, current: Mapping[str, tuple[str, str]] | None = None
) -> dict[str, dict]:
    """The records of every cell of ``cells`` with stored results, cached ones reused while their key matches."""
    inputs = store.input_keys(cells["cell"].tolist(), current)
    # Every analysis setting a record depends on (the interval level only enters the aggregates).
    settings = config.analysis.model_dump(exclude={"confidence"})
    keys = {cell: record_cache_key(text, settings) for cell, text in inputs.items()}
    cached = store.cached_summaries(list(keys))
    stale = [cell for cell, key in keys.items() if cached.get(cell, (None,))[0] != key]
    if not stale:
        return {cell: cached[cell][1] for cell in keys}
    digests = store.input_digests(stale, current)
    policies = dict(zip(cells["cell"], cells["policy"]))
    training_keys = {cell: training_cache_key(digests[cell], policies[cell], settings) for cell in stale}
    trainings = {
        cell: training
        for cell, (key, training) in store.cached_trainings(stale).items()
        if key == training_keys[cell]
    }
    known = set(trainings)
    fresh = compute_records(store, {cell: policies[cell] for cell in stale}, config, digests, trainings)
    store.save_summaries(
        {cell: (keys[cell], fresh[cell]) for cell in stale},
        {cell: (training_keys[cell], trainings[cell]) for cell in stale if cell not in known},
    )
    return {cell: fresh[cell] if cell in fresh else cached[cell][1] for cell in keys}
