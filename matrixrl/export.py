"""A study's results in experiment trackers: TensorBoard event files and W&B offline runs.

One run per cell, incremental (:data:`STATE_FILE`); docs/export.md.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import math
import os
import re
import secrets
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from matrixrl import atomic
from matrixrl.errors import UserError, did_you_mean

if TYPE_CHECKING:
    import pandas as pd

    from matrixrl.study import Study

TRACKERS = ("tensorboard", "wandb")
STATE_FILE = ".matrixrl-export.json"
STATE_VERSION = 1
DEFAULT_DIRS = {"tensorboard": "tensorboard", "wandb": "wandb"}
"""Each tracker's output folder under results_dir, unless ``--out`` says otherwise."""

TRAIN_NAMES = {"reward_mean": "reward"}
"""``train/NAME`` of a training metric whose name is not its own."""

DIAGNOSTIC_NAMES = {
    "role_norm": "grad_norm",
    "agent_norm": "grad_norm",
    "role_share": "grad_share",
    "role_tokens": "tokens",
    "agent_tokens": "tokens",
    "amplification": "amplification",
    "agent_cosine": "cosine",
    "role_cosine": "cosine",
    "role_total_cosine": "cosine_to_total",
}
"""The metric name of each gradient-diagnostic kind (matrixrl.train.diagnostics); another kind keeps its own."""

EPISODE = "episode"
"""The role of a role metric that belongs to the episode as a whole (``any_correct``, ``pass@J``)."""


class ExportError(UserError):
    """An export that cannot be done: a tracker's package missing, an output folder that is not an export."""


# --- the scalars ------------------------------------------------------------------------


def study_points(study: Study) -> pd.DataFrame:
    """Every scalar the export writes for ``study``'s selected cells, long format.

    Columns: ``cell``, ``part`` (``train`` or ``eval/step_N``: the results file it
    comes from), ``source`` (``train`` or ``eval``: the step axis), ``step``, ``tag``,
    ``value``; missing values are left out. Ingests new result files first.
    """
    import pandas as pd

    from matrixrl.results import StepMetrics

    frames = []
    training = study.training()
    metrics = [name for name in StepMetrics.model_fields if name != "step" and name in training.columns]
    steps = training.melt(id_vars=["cell", "step"], value_vars=metrics, var_name="name", value_name="value")
    frames.append(steps.assign(tag="train/" + steps["name"].map(lambda n: TRAIN_NAMES.get(n, n)), part="train", source="train"))

    diagnostics = study.diagnostics()
    kind = diagnostics["kind"].map(lambda k: DIAGNOSTIC_NAMES.get(k, k))
    agent = diagnostics["agent"].map(lambda a: f"/agents/{a}" if isinstance(a, str) else "")
    other = diagnostics["other"].map(lambda o: f"/{o}" if isinstance(o, str) else "")
    role = diagnostics["role"].map(lambda r: r if isinstance(r, str) else "all")
    frames.append(diagnostics.assign(tag="roles/" + role + agent + "/" + kind + other, part="train", source="train"))

    roles = study.role_metrics()
    episode = roles["role"] == EPISODE
    trained = roles["source"] == "train"
    tag = pd.Series("", index=roles.index, dtype=object)
    tag[trained & episode] = "train/" + roles["metric"]
    tag[trained & ~episode] = "roles/" + roles["role"] + "/" + roles["metric"]
    tag[~trained & episode] = "eval/" + roles["metric"]
    tag[~trained & ~episode] = "eval/" + roles["role"] + "/" + roles["metric"]
    part = roles["step"].map(lambda s: f"eval/step_{s}").where(~trained, "train")
    frames.append(roles.assign(tag=tag, part=part))

    curves = study.curves()
    checkpoints = curves.melt(id_vars=["cell", "step"], value_vars=["accuracy", "se"], var_name="name", value_name="value")
    frames.append(
        checkpoints.assign(tag="eval/" + checkpoints["name"], part=checkpoints["step"].map(lambda s: f"eval/step_{s}"), source="eval")
    )
    columns = ["cell", "part", "source", "step", "tag", "value"]
    points = pd.concat([frame[columns] for frame in frames], ignore_index=True)
    points = points[points["value"].notna()].astype({"step": "int64", "value": "float64"})
    return points.reset_index(drop=True)


def part_digests(points: pd.DataFrame) -> dict[str, dict[str, str]]:
    """Per cell, a digest of each part's scalars (``points`` of :func:`study_points`): what the state file compares."""
    import numpy as np
    import pandas as pd

    ordered = points.sort_values(["cell", "part", "tag", "step"], kind="stable")
    # One vectorised hash per row, then one digest per part over its rows' hashes.
    hashes = pd.util.hash_pandas_object(ordered[["step", "tag", "value"]], index=False).to_numpy()
    digests: dict[str, dict[str, str]] = {}
    keys = list(zip(ordered["cell"], ordered["part"]))
    bounds = [i for i in range(1, len(keys)) if keys[i] != keys[i - 1]]
    for start, end in zip([0, *bounds], [*bounds, len(keys)]):
        cell, part = keys[start]
        blob = np.ascontiguousarray(hashes[start:end]).tobytes()
        digests.setdefault(str(cell), {})[str(part)] = hashlib.sha256(blob).hexdigest()[:16]
    return digests


# --- the state file ---------------------------------------------------------------------


@dataclass
class CellState:
    """What an output folder holds of one cell."""

    parts: dict[str, str] = field(default_factory=dict)  # part -> digest of what was written
    files: list[str] = field(default_factory=list)  # paths relative to the output folder
    stamp: int = 0  # TensorBoard: the last event file's number; W&B: the last segment's start (s)
    generation: int = 0  # W&B: bumped when the run is rewritten (a new run id)
    next_step: int = 0  # W&B: the next history row's step

    def eval_steps(self) -> list[int]:
        return [int(part.removeprefix("eval/step_")) for part in self.parts if part.startswith("eval/")]


def read_state(out: Path, tracker: str) -> tuple[str, dict[str, CellState]] | None:
    """``(key, {cell: CellState})`` of the export in ``out``; None if ``out`` holds none yet.

    ExportError if ``out`` is a file, holds other files but no export, or another tracker's export.
    """
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out}: is a file; pass a folder for the {tracker} export")
    path = out / STATE_FILE
    if not path.exists():
        if out.exists() and any(out.iterdir()):
            raise ExportError(
                f"--out {out}: the folder has files but no {STATE_FILE}, so it is no matrixrl export; pass a new or empty folder"
            )
        return None
    try:
        if path.is_dir():
            raise ValueError("a folder, not a file")
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError(f"{_json_type(data)}, not an object")
        if data.get("version") != STATE_VERSION:
            raise ValueError(f"version {data.get('version')}")
        if not isinstance(data["cells"], dict):
            raise ValueError(f"cells: {_json_type(data['cells'])}, not an object")
        cells = {cell: _cell_state(cell, state) for cell, state in data["cells"].items()}
        key, written = str(data["key"]), data["tracker"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ExportError(
            f"{path}: unreadable export state ({exc}); delete the folder {out} and export again"
        ) from None
    if written != tracker:
        raise ExportError(f"--out {out}: holds a {written} export; pass another folder for {tracker}")
    return key, cells


_STATE_TYPES = {"parts": dict, "files": list, "stamp": int, "generation": int, "next_step": int}
"""The JSON type of each of a CellState's fields in the state file."""


def _json_type(value) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "true or false", int: "a whole number"}
    return "null" if value is None else names.get(type(value), "a number")


def _cell_state(cell: str, state) -> CellState:
    """A cell's CellState from the state file; ValueError naming a field that is not what export writes."""
    if not isinstance(state, dict):
        raise ValueError(f"cells.{cell}: {_json_type(state)}, not an object")
    for name, value in state.items():
        wanted = _STATE_TYPES.get(name)
        if wanted is not None and type(value) is not wanted:
            raise ValueError(f"cells.{cell}.{name}: {_json_type(value)}, not {_json_type(wanted())}")
    for part, digest in state.get("parts", {}).items():
        if part.startswith("eval/") and not re.fullmatch(r"eval/step_[0-9]+", part):
            raise ValueError(f"cells.{cell}.parts: {part!r} is no evaluation's part (eval/step_N)")
        if not isinstance(digest, str):
            raise ValueError(f"cells.{cell}.parts.{part}: {_json_type(digest)}, not a string")
    if not all(isinstance(file, str) for file in state.get("files", [])):
        raise ValueError(f"cells.{cell}.files: not a list of paths (strings)")
    return CellState(**state)  # TypeError for a field it has not


def write_state(out: Path, tracker: str, key: str, cells: Mapping[str, CellState]) -> None:
    data = {"version": STATE_VERSION, "tracker": tracker, "key": key, "cells": {c: vars(s) for c, s in cells.items()}}
    atomic.write_text(out / STATE_FILE, json.dumps(data, indent=1, sort_keys=True) + "\n")


# --- the export -------------------------------------------------------------------------


@dataclass
class ExportSummary:
    """What one export did."""

    tracker: str
    out: Path
    written: list[str] = field(default_factory=list)  # cells with new scalars
    rewritten: list[str] = field(default_factory=list)  # of those, cells whose run was written anew
    unchanged: int = 0
    values: int = 0  # scalars written
    removed: list[str] = field(default_factory=list)  # leftover files of an interrupted export, removed

    def line(self) -> str:
        """What the export did, in one line."""
        if not self.written:
            return f"Nothing new to export: {_cells(self.unchanged)} unchanged in {self.out}."
        rewritten = f" ({len(self.rewritten)} rewritten whole)" if self.rewritten else ""
        return (
            f"Exported {self.values:,} values of {_cells(len(self.written))}{rewritten} to {self.out}; "
            f"{_cells(self.unchanged)} unchanged."
        )


def _cells(n: int) -> str:
    return f"{n} cell" if n == 1 else f"{n} cells"


def export_study(
    study: Study,
    tracker: str,
    out: Path | None = None,
    *,
    project: str = "matrixrl",
    group: str | None = None,
) -> ExportSummary:
    """Export ``study``'s selected cells to ``tracker`` (``tensorboard`` or ``wandb``) in ``out``
    (default: ``RESULTS/tensorboard`` or ``RESULTS/wandb``), incrementally; ``project`` and
    ``group``: W&B's. Raises ExportError when the tracker's package is missing or ``out`` is
    not an export folder, ConfigError when the study has no results yet.
    """
    if tracker not in TRACKERS:
        raise ExportError(f"unknown tracker {tracker!r}; {did_you_mean(tracker, TRACKERS)}")
    out = Path(out) if out is not None else study.results_dir / DEFAULT_DIRS[tracker]
    state = read_state(out, tracker)
    writer_class = TensorBoardRuns if tracker == "tensorboard" else WandbRuns
    writer_class.check_installed()
    points = study_points(study)
    if points.empty:  # before anything is written: nothing of this grid at these settings to export
        from matrixrl.report.rows import nothing_stored

        raise nothing_stored(study.results_dir)
    key, cells = state if state is not None else (secrets.token_hex(4), {})
    summary = ExportSummary(tracker, out)
    if state is None:
        out.mkdir(parents=True, exist_ok=True)
        write_state(out, tracker, key, cells)  # first: marks the folder as an export before anything is in it
    writer = writer_class(out, key, study, project=project, group=group)
    summary.removed = writer.remove_leftovers(cells)
    by_cell = dict(tuple(points.groupby("cell", sort=False)))
    all_digests = part_digests(points)
    try:
        for cell in study.cells()["cell"]:
            rows = by_cell.get(cell)
            if rows is None:
                continue
            digests = all_digests[cell]
            before = cells.get(cell, CellState())
            if before.parts == digests:
                summary.unchanged += 1
                continue
            new_parts = {part for part, digest in digests.items() if part not in before.parts}
            changed = any(digests.get(part) != digest for part, digest in before.parts.items())
            new_evals = [int(p.removeprefix("eval/step_")) for p in new_parts if p.startswith("eval/")]
            out_of_order = bool(new_evals) and min(new_evals) <= max(before.eval_steps(), default=-1)
            whole = changed or out_of_order
            if whole:
                writer.remove(before)
                after = CellState(stamp=before.stamp, generation=before.generation + (1 if before.parts else 0))
                written = rows
            else:
                after = CellState(**{**vars(before), "parts": dict(before.parts), "files": list(before.files)})
                written = rows[rows["part"].isin(new_parts)]
            writer.write(cell, written, after)
            after.parts = digests
            cells[cell] = after
            write_state(out, tracker, key, cells)
            summary.written.append(cell)
            if whole and before.parts:
                summary.rewritten.append(cell)
            summary.values += len(written)
    finally:
        writer.close()
    return summary


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported (found without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing; a module set to None in sys.modules
        return False


def _missing(package: str, tracker: str) -> ExportError:
    return ExportError(
        f"matrixrl export {tracker} needs the {package} package, which is not installed; run: pip install 'matrixrl[{tracker}]'"
    )


class TensorBoardRuns:
    """One TensorBoard run (a folder of event files) per cell: ``OUT/CELL/events.out.tfevents.N.matrixrl``,
    one more file, numbered after the last, per export with something new (docs/export.md).
    """

    def __init__(self, out: Path, key: str, study: Study, **_: Any):
        self.out = out

    @staticmethod
    def check_installed() -> None:
        if not _installed("tensorboard"):
            raise _missing("tensorboard", "tensorboard")

    def remove_leftovers(self, cells: Mapping[str, CellState]) -> list[str]:
        """Event files in a run folder that the state does not record (an interrupted export)."""
        recorded = {f for state in cells.values() for f in state.files}
        removed = []
        for run in sorted(p for p in self.out.iterdir() if p.is_dir()):
            for path in sorted(run.iterdir()):
                relative = str(path.relative_to(self.out))
                if path.is_file() and ("tfevents" in path.name or path.name.startswith(".partial")) and relative not in recorded:
                    path.unlink()
                    removed.append(relative)
        return removed

    def remove(self, state: CellState) -> None:
        for relative in state.files:
            (self.out / relative).unlink(missing_ok=True)

    def write(self, cell: str, points: pd.DataFrame, state: CellState) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.record_writer import RecordWriter

        now = time.time()
        buffer = io.BytesIO()
        records = RecordWriter(buffer)
        records.write(Event(wall_time=now, file_version="brain.Event:2").SerializeToString())
        ordered = points.sort_values(["source", "step", "tag"], kind="stable")
        for (_, step), rows in ordered.groupby(["source", "step"], sort=False):
            values = [Summary.Value(tag=tag, simple_value=value) for tag, value in zip(rows["tag"], rows["value"])]
            records.write(Event(wall_time=now, step=int(step), summary=Summary(value=values)).SerializeToString())
        # Named by a number that only grows, so the files sort in the order they were written.
        state.stamp = max(int(now), state.stamp + 1)
        run = self.out / cell
        relative = f"{cell}/events.out.tfevents.{state.stamp:010d}.matrixrl"
        partial = run / ".partial.export"  # no "tfevents" in it: TensorBoard does not read it half-written
        atomic.write_bytes(partial, buffer.getvalue())
        os.replace(partial, self.out / relative)
        state.files.append(relative)

    def close(self) -> None:
        pass


class WandbRuns:
    """One W&B offline run per cell (``OUT/wandb/offline-run-*-ID``), in offline mode only: one more
    run folder with the same run id, resumed, per export with something new (docs/export.md).
    """

    def __init__(self, out: Path, key: str, study: Study, *, project: str = "matrixrl", group: str | None = None):
        self.out = out
        self.key = key
        self.project = project
        self.group = group or study.name
        self.config = study.cells().drop(columns="run").set_index("cell")
        self._mode = os.environ.get("WANDB_MODE")
        os.environ["WANDB_MODE"] = "offline"  # and mode="offline" below: never the network

    @staticmethod
    def check_installed() -> None:
        if not _installed("wandb"):
            raise _missing("wandb", "wandb")

    def run_id(self, cell: str, generation: int) -> str:
        """A W&B run id (letters, digits, -) unique to this export folder, the cell and its generation."""
        return f"{self.key}-{hashlib.sha256(cell.encode()).hexdigest()[:12]}-{generation}"

    def remove_leftovers(self, cells: Mapping[str, CellState]) -> list[str]:
        """Offline run folders that the state does not record (an interrupted export)."""
        recorded = {f for state in cells.values() for f in state.files}
        runs = self.out / "wandb"
        removed = []
        if runs.is_dir():
            for path in sorted(runs.glob("offline-run-*")):
                relative = str(path.relative_to(self.out))
                if path.is_dir() and not path.is_symlink() and relative not in recorded:
                    shutil.rmtree(path)
                    removed.append(relative)
        return removed

    def remove(self, state: CellState) -> None:
        for relative in state.files:
            shutil.rmtree(self.out / relative, ignore_errors=True)

    def write(self, cell: str, points: pd.DataFrame, state: CellState) -> None:
        import wandb  # here, not at start: an export with nothing new need not load it

        # A folder's name has the start time in seconds: a second one of the same run must start later.
        while int(time.time()) <= state.stamp:
            time.sleep(0.05)
        state.stamp = int(time.time())
        if not state.files:
            state.next_step = 0
        resumed = bool(state.files)
        axes = {k: _plain(v) for k, v in self.config.loc[cell].items() if _plain(v) is not None}
        settings = wandb.Settings(
            console="off", silent=True, save_code=False, disable_git=True, disable_job_creation=True,
            x_disable_stats=True, x_disable_meta=True, x_disable_machine_info=True,
        )  # fmt: skip
        run = wandb.init(
            mode="offline", dir=str(self.out), project=self.project, group=self.group, name=cell, job_type="cell",
            id=self.run_id(cell, state.generation), resume="allow" if resumed else None, config=axes,
            settings=settings,
        )  # fmt: skip
        try:
            state.files.append(os.path.relpath(Path(run.dir).parent, self.out))
            for source in ("train", "eval"):
                run.define_metric(f"{source}/step")
            for prefix, source in (("train/*", "train"), ("roles/*", "train"), ("eval/*", "eval")):
                run.define_metric(prefix, step_metric=f"{source}/step")
            ordered = points.sort_values(["source", "step", "tag"], kind="stable")
            for (source, step), rows in ordered.groupby(["source", "step"], sort=False):
                row = dict(zip(rows["tag"], rows["value"].astype(float)))
                row[f"{source}/step"] = int(step)
                run.log(row, step=state.next_step)
                state.next_step += 1
        finally:
            run.finish()

    def close(self) -> None:
        if self._mode is None:
            os.environ.pop("WANDB_MODE", None)
        else:
            os.environ["WANDB_MODE"] = self._mode


def _plain(value):
    """An axis value for a W&B config: a Python scalar, None where the axis leaves the cell alone."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value.item() if hasattr(value, "item") else value
