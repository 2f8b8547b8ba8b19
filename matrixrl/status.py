"""Which jobs of the grid are done, computed by matrixrl from its own result files.

Why a job is pending: :data:`REASONS`. docs/architecture.md, "Planning".
"""

from __future__ import annotations

import ast
import base64
import json
import os
import re
from pathlib import Path

from matrixrl import layout as L
from matrixrl.config import Config
from matrixrl.dag import Graph, Job

REASONS = ("missing", "incomplete", "unreadable", "changed", "rebuild", "upstream")
"""Why a job is pending, in the order they are checked."""

_STALE = {"incomplete", "unreadable", "changed", "rebuild"}  # the output exists, yet must be recomputed: --forcerun


def job_statuses(config: Config, jobs: list[Job] | None = None, costs: dict[str, dict] | None = None) -> list[dict]:
    """Every job of the grid (matrixrl.dag) as a row: rule, cell, scale, step, status (done
    or pending), the reason it is pending (:data:`REASONS`) and its output.

    ``costs``: filled with the ``cost`` each existing output records (matrixrl.results.Cost,
    as a dict), by output, done or not: what plan's estimate learns from."""
    jobs = Graph(config).jobs if jobs is None else jobs
    results = Path(config.results_dir)
    incomplete = _incomplete_outputs(results)
    costs = {} if costs is None else costs
    own = {job.output: _own_reason(results, job, incomplete, costs) for job in jobs}
    rebuilds = _rebuilds(results, jobs, own)
    pending: set[str] = set()
    rows = []
    for job in jobs:
        reason = own[job.output] or ("rebuild" if job.output in rebuilds else None)
        if reason is None and any(path in pending for path in job.inputs):
            reason = "upstream"
        if reason is not None:
            pending.add(job.output)
        rows.append(job.row("pending" if reason else "done", reason))
    return rows


def _rebuilds(results: Path, jobs: list[Job], own: dict[str, str | None]) -> set[str]:
    """Current trainings to rerun: an evaluation that must be recomputed needs a checkpoint
    that retention deleted (step 0 needs none: it is the base model's evaluation, copied)."""
    from matrixrl.retention import pruned_steps

    needed: dict[str, set[int]] = {}
    for job in jobs:
        if job.rule in ("evaluate", "evaluate_memory") and own[job.output] is not None:
            needed.setdefault(job.cell, set()).add(job.step)
    found = set()
    for job in jobs:
        if job.rule == "train" and own[job.output] is None and job.cell in needed:
            cell_dir = results / L.cell_dir(job.cell)
            if (cell_dir / L.RETENTION_FILE).exists() and pruned_steps(cell_dir, job.resume) & needed[job.cell]:
                found.add(job.output)
    return found


def rebuild_targets(config: Config) -> list[str]:
    """The training outputs that rerun to rebuild deleted checkpoints (reason ``rebuild``)."""
    return [row["output"] for row in job_statuses(config) if row["reason"] == "rebuild"]


def stale_outputs(rows: list[dict]) -> list[str]:
    """Outputs that exist but must be recomputed: what ``matrixrl run`` names with ``--forcerun``."""
    return [row["output"] for row in rows if row["reason"] in _STALE]


def _own_reason(results: Path, job: Job, incomplete: set[str], costs: dict[str, dict]) -> str | None:
    try:
        recorded = _recorded(results / job.output)
    except FileNotFoundError:
        return "missing"
    if isinstance(recorded, dict) and isinstance(recorded.get("cost"), dict):
        costs[job.output] = recorded["cost"]
    if job.output in incomplete:
        return "incomplete"
    if job.rule == "analyse" and isinstance(recorded, list):
        return "changed"  # a summary from before it recorded what it was computed from
    if not isinstance(recorded, dict):  # not JSON, or JSON but not an object (``[]``): no result file
        return "unreadable"
    digest = recorded.get("spec_digest")
    if digest is None:
        return None if _params_unchanged(results, job) else "changed"
    if digest != job.digest or (job.base_eval is not None and recorded.get("base_eval") != job.base_eval):
        return "changed"
    return None


# A result file's digests, read from its first bytes: the fields of a training's large
# file come before its per-step metrics, and evaluations are small.
_HEAD_BYTES = 1 << 16
_FIELD = re.compile(rb'"(spec_digest|base_eval)": (null|"[^"]*")')
_COST = re.compile(rb'"cost": (null|\{[^{}]*\})')  # matrixrl.results.Cost: flat, near the top


def _recorded(path: Path) -> dict | list | None:
    """The digests a result file records (``{}`` if none) and its ``cost``, or None where it is
    no result file.

    Every result file is written whole and renamed into place (matrixrl.atomic), so a
    file that ends as JSON does and names its digest is one; anything else is parsed."""
    with open(path, "rb") as file:
        head = file.read(_HEAD_BYTES)
        if len(head) == _HEAD_BYTES:
            file.seek(-64, os.SEEK_END)
            tail = file.read()
        else:
            tail = head
    found = {name.decode(): json.loads(value) for name, value in _FIELD.findall(head)}
    if "spec_digest" in found and tail.rstrip().endswith(b"}"):
        if cost := _COST.search(head):
            found["cost"] = json.loads(cost.group(1))
        return found
    try:
        data = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError):
        return None
    if isinstance(data, list):
        return data
    if not isinstance(data, dict):
        return None
    return {name: data.get(name) for name in ("spec_digest", "base_eval", "cost") if name in data}


def recorded_cost(path: Path) -> dict | None:
    """The ``cost`` the result file at ``path`` records (matrixrl.results.Cost), read as plan reads
    digests; None if it records none or is no result file."""
    try:
        recorded = _recorded(path)
    except OSError:
        return None
    cost = recorded.get("cost") if isinstance(recorded, dict) else None
    return cost if isinstance(cost, dict) else None


def _snakemake_key(subject: Path, output: str) -> Path:
    """Where Snakemake's file persistence keeps a record about ``output`` under ``subject``:
    its path in URL-safe base64, split into folders of the file system's longest name."""
    encoded = base64.urlsafe_b64encode(output.encode()).decode()
    limit = 255 - 1
    parts = [encoded[i : i + limit] for i in range(0, len(encoded), limit)]
    return subject.joinpath(*["@" + part for part in parts[:-1]], parts[-1])


def _incomplete_outputs(results: Path) -> set[str]:
    """Outputs Snakemake marked incomplete: their job started and never finished."""
    root = results / ".snakemake" / "incomplete"
    if not root.is_dir():
        return set()
    found = set()
    for folder, _, files in os.walk(root):
        prefix = "".join(part[1:] for part in Path(folder).relative_to(root).parts)
        for name in files:
            try:
                found.add(base64.urlsafe_b64decode(prefix + name).decode())
            except (ValueError, UnicodeDecodeError):
                continue  # Snakemake's own markers (migration_underway)
    return found


def _params_unchanged(results: Path, job: Job) -> bool:
    """For a file that records no digest: do the params Snakemake recorded hold the job's science now?"""
    record = _snakemake_key(results / ".snakemake" / "metadata", job.output)
    try:
        values = {ast.literal_eval(value) for value in json.loads(record.read_text())["params"]}
    except (OSError, ValueError, KeyError, TypeError, SyntaxError):
        return True  # no record: Snakemake would not rerun it either
    return job.params is None or job.params in values
