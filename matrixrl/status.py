"""Which jobs of the grid are done, computed by matrixrl from its own result files.

matrixrl knows its rules, so it needs no Snakemake DAG to say what a run would do:
every result file records the digest of the spec it was computed from
(``spec_digest``), and a job is done when its output exists, records the digest of
the spec the job has now, and nothing it reads is being recomputed. That answer
costs a ``stat`` and a short read per job, so ``matrixrl plan`` of 10,000 jobs
takes about a second where a Snakemake dry-run takes half a minute.

``matrixrl run`` then hands Snakemake the answer, so that the two cannot disagree:
of Snakemake's own rerun triggers it keeps none that could fire (``--rerun-triggers
software-env``: there is no conda or container environment to change), and the
outputs found here to be stale are named with ``--forcerun``. Snakemake still runs a
job whose output is missing, or marked incomplete by a killed run, and everything
downstream of a job it runs, which is what this module computes too
(tests/test_status.py compares the two on every kind of change).

Why a job is pending, in the order checked (:data:`REASONS`):

- ``missing``: its output does not exist;
- ``incomplete``: Snakemake marked the output incomplete (its job was killed);
- ``unreadable``: the output is not a result file (corrupt, or cut short);
- ``changed``: the output was computed under other settings;
- ``rebuild``: a training whose output is current, but one of whose checkpoints that
  ``train.keep_checkpoints`` deleted is needed again, by an evaluation that must be
  recomputed (matrixrl.retention): it retrains, replaying the same steps;
- ``upstream``: a job whose output it reads is pending.

Files from before digests were recorded (``spec_digest`` null, or absent in a base
model's summary) are judged as Snakemake judged them: by the params it recorded
(the file ``.snakemake/metadata`` keeps of each output), and done where it kept none.
"""

from __future__ import annotations

import ast
import base64
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from matrixrl import layout as L
from matrixrl.config import Config, science
from matrixrl.retention import retention_digest
from matrixrl.settings import settings_digest

REASONS = ("missing", "incomplete", "unreadable", "changed", "rebuild", "upstream")
"""Why a job is pending, in the order they are checked."""

_STALE = {"incomplete", "unreadable", "changed", "rebuild"}  # the output exists, yet must be recomputed: --forcerun


@dataclass(frozen=True)
class Job:
    """One job of the grid: its rule, the file it writes, the files it reads, and
    the digests its output must record to be done."""

    rule: str
    output: str  # relative to the results directory, as the Snakefile names it
    inputs: tuple[str, ...] = ()
    digest: str | None = None  # the output's spec_digest when done
    base_eval: str | None = None  # a copy of a base evaluation: the base_eval it records when done
    params: str | None = None  # the science JSON Snakemake records as params (files without a digest)
    resume: str | None = None  # a training: the resume digest its checkpoints carry
    cell: str | None = None
    scale: str | None = None
    step: int | None = None
    wildcards: dict = field(default_factory=dict)

    def row(self, status: str, reason: str | None) -> dict:
        return {
            "rule": self.rule, "cell": self.cell, "scale": self.scale, "step": self.step,
            "status": status, "reason": reason, "output": self.output,
        }


def science_json(payload) -> str:
    """A job's science as its Snakemake params hold it (the Snakefile uses this too)."""
    return json.dumps(science(payload), sort_keys=True)


def grid_jobs(config: Config) -> list[Job]:
    """Every job of the grid, each after the jobs whose outputs it reads (the Snakefile's rules)."""
    from matrixrl import grid as G

    runs = G.runs(config)  # a one-role workflow's isolated cell is its shared cell's run
    specs = {cell.id: G.cell_spec(config, cell) for cell in runs}
    jobs: list[Job] = []
    bases = {}
    for scale in G.base_scales(config):
        spec = G.base_spec(config, scale)
        bases[scale] = Job(
            "prepare_base", L.base_result(scale), digest=spec.digest(), params=science_json(spec),
            scale=scale, wildcards={"scale": scale},
        )
    jobs += bases.values()
    from matrixrl.grid import plan_memory
    from matrixrl.memory.specs import training_needs

    memory = plan_memory(config, training_needs(specs.values()))
    jobs += _memory_building_jobs(config, memory, bases)  # before the trainings: one may read a bank
    base_evals = {}
    base_of = {scale: G.base_scale(config, scale) for scale in config.grid.scale}
    keys = {cell.id: G.base_eval_key(config, specs[cell.id], base_of[cell.scale]) for cell in runs}
    for cell in runs:
        base, name = key = keys[cell.id]
        if key not in base_evals:
            base_evals[key] = Job(
                "evaluate_base", L.base_eval_result(base, name), inputs=(bases[base].output,),
                digest=G.base_eval_digest(specs[cell.id]), scale=base, step=0, wildcards={"scale": base, "name": name},
            )
    jobs += base_evals.values()
    evaluations = []
    for cell in runs:
        spec = specs[cell.id]
        base = bases[base_of[cell.scale]]
        reads = (base.output,)
        if spec.memory is not None:  # trained with a memory: its bank, and the labeller's base model
            reads += (L.bank_result(cell.task, spec.memory.bank.bank), L.base_result(spec.memory.labeller.base_scale))
        train = Job(
            "train", L.train_result(cell.id), inputs=reads, digest=spec.train_digest(),
            params=science_json(spec.training()), cell=cell.id, scale=cell.scale, wildcards={"cell": cell.id},
            resume=spec.resume_digest(),
        )
        jobs.append(train)
        shared = base_evals[keys[cell.id]]
        eval_digest = spec.eval_digest()  # once per cell: the science of a paper-sized spec is not free
        evaluations.append(Job(
            "copy_base_eval", L.eval_result(cell.id, 0), inputs=(shared.output,), digest=eval_digest,
            base_eval=shared.digest, cell=cell.id, scale=cell.scale, step=0, wildcards={"cell": cell.id},
        ))
        params = json.dumps(spec.science, sort_keys=True)
        for step in G.checkpoint_steps(spec.train)[1:]:  # step 0 is the base model's: shared above
            evaluations.append(Job(
                "evaluate", L.eval_result(cell.id, step), inputs=(train.output,), digest=eval_digest,
                params=params, cell=cell.id, scale=cell.scale, step=step,
                wildcards={"cell": cell.id, "step": str(step)},
            ))
    jobs += evaluations
    memory_evaluations = _memory_eval_jobs(config, specs, memory, base_evals, keys)
    jobs += memory_evaluations
    evaluated = [*evaluations, *(job for job in memory_evaluations if job.cell is not None)]
    for cell in runs:  # once all of a cell's evaluations exist, the checkpoints it no longer needs go
        keep = specs[cell.id].train.keep_checkpoints
        jobs.append(Job(
            "retain", L.retention_record(cell.id),
            inputs=(L.train_result(cell.id), *(e.output for e in evaluated if e.cell == cell.id)),
            digest=retention_digest(keep), params=keep, cell=cell.id, scale=cell.scale, wildcards={"cell": cell.id},
        ))
    inputs = tuple(job.output for job in jobs if job.rule in ("train", "copy_base_eval", "evaluate"))
    jobs.append(Job("analyse", L.SUMMARY_FILE, inputs=inputs, digest=analyse_digest(config, runs, specs, inputs)))
    return jobs


def _memory_building_jobs(config: Config, plan, bases: dict[str, Job]) -> list[Job]:
    """collect, label, distill and bank per task (matrixrl.memory.specs), after the base models
    of memory scales outside grid.scale (added to ``bases``)."""
    from matrixrl import grid as G

    jobs: list[Job] = []
    models = [spec.model for spec in (*plan.collects.values(), *plan.labels.values(), *plan.distills.values())]
    for scale in dict.fromkeys(model.base_scale for model in models):
        if scale not in bases:
            spec = G.base_spec(config, scale)
            bases[scale] = Job(
                "prepare_base", L.base_result(scale), digest=spec.digest(), params=science_json(spec),
                scale=scale, wildcards={"scale": scale},
            )
            jobs.append(bases[scale])
    for output, spec in plan.collects.items():
        jobs.append(Job(
            "collect", output, inputs=(bases[spec.model.base_scale].output,), digest=spec.digest(),
            scale=spec.model.name,
            wildcards={"task": spec.task_name, "scale": spec.model.name, "samples": str(spec.samples)},
        ))
    for output, spec in plan.labels.items():
        jobs.append(Job(
            "label", output, inputs=(bases[spec.model.base_scale].output,), digest=spec.digest(),
            scale=spec.model.name, wildcards={"task": spec.task_name},
        ))
    for output, spec in plan.distills.items():
        jobs.append(Job(
            "distill", output, inputs=(bases[spec.model.base_scale].output, *spec.collections), digest=spec.digest(),
            scale=spec.model.name, wildcards={"task": spec.task_name, "bank": spec.bank},
        ))
    for output, spec in plan.banks.items():
        jobs.append(Job(
            "bank", output, inputs=(L.distilled_result(spec.task_name, spec.bank), L.labels_result(spec.task_name)),
            digest=spec.digest(), wildcards={"task": spec.task_name, "bank": spec.bank},
        ))
    return jobs


def _memory_eval_jobs(config: Config, specs, plan, base_evals: dict, keys: dict) -> list[Job]:
    """Each cell's evaluations under each memory mode of grid.memory; step 0 once per base evaluation and bank."""
    from matrixrl import grid as G
    from matrixrl.grid import memory_evals

    if not plan.modes:
        return []
    jobs: list[Job] = []
    shared: dict[str, Job] = {}
    for (cell_id, mode), spec in memory_evals(config, specs, plan).items():
        cell = spec.cell.cell
        bank = L.bank_result(cell.task, spec.bank.bank)
        labels = L.labels_result(cell.task)
        base, name = keys[cell_id]
        source = L.base_memory_eval_result(base, spec.bank.bank, name)
        if source not in shared:
            shared[source] = Job(
                "evaluate_base_memory", source, inputs=(base_evals[(base, name)].inputs[0], bank, labels),
                digest=spec.base_digest(), scale=base, step=0,
                wildcards={"scale": base, "bank": spec.bank.bank, "name": name},
            )
            jobs.append(shared[source])
        digest = spec.digest()
        jobs.append(Job(
            "copy_base_memory_eval", L.memory_eval_result(cell_id, mode, 0), inputs=(source,), digest=digest,
            base_eval=shared[source].digest, cell=cell_id, scale=cell.scale, step=0,
            wildcards={"cell": cell_id, "mode": mode},
        ))
        for step in G.checkpoint_steps(spec.cell.train)[1:]:
            jobs.append(Job(
                "evaluate_memory", L.memory_eval_result(cell_id, mode, step),
                inputs=(L.train_result(cell_id), bank, labels), digest=digest, cell=cell_id, scale=cell.scale,
                step=step, wildcards={"cell": cell_id, "mode": mode, "step": str(step)},
            ))
    return jobs


def analyse_digest(config: Config, runs, specs, inputs: Iterable[str]) -> str:
    """What the summary is computed from: its cells, their current specs, the analysis
    settings and the result files it reads (the ``analyse`` job records it)."""
    return settings_digest({
        "cells": [{"cell": run.id, **run.axes(), **run.sweep_values()} for run in runs],
        "specs": {run.id: specs[run.id].eval_digest() for run in runs},
        "analysis": science(config.analysis),
        "inputs": list(inputs),
    })


def job_statuses(config: Config, jobs: list[Job] | None = None) -> list[dict]:
    """Every job of the grid as a row: rule, cell, scale, step, status (done or pending),
    the reason it is pending (:data:`REASONS`) and its output."""
    jobs = grid_jobs(config) if jobs is None else jobs
    results = Path(config.results_dir)
    incomplete = _incomplete_outputs(results)
    own = {job.output: _own_reason(results, job, incomplete) for job in jobs}
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


def _own_reason(results: Path, job: Job, incomplete: set[str]) -> str | None:
    try:
        recorded = _recorded(results / job.output)
    except FileNotFoundError:
        return "missing"
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


def _recorded(path: Path) -> dict | list | None:
    """The digests a result file records (``{}`` if none), or None where it is no result file.

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
        return found
    try:
        data = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError):
        return None
    if isinstance(data, list):
        return data
    if not isinstance(data, dict):
        return None
    return {name: data.get(name) for name in ("spec_digest", "base_eval") if name in data}


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
