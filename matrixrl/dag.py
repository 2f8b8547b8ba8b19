"""The job graph: every job of a grid as a record, and every kind of job, each defined once.

docs/architecture.md, "The job graph, defined once"; adding a kind: docs/extending.md.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from matrixrl import layout as L
from matrixrl.config import Config, science
from matrixrl.retention import retention_digest
from matrixrl.settings import settings_digest


@dataclass(frozen=True)
class Kind:
    """One kind of job: a Snakemake rule and the function its jobs run."""

    name: str
    output: str  # the output's pattern, relative to the results folder, over the job's wildcards
    entry: str  # "module:function", the job: function(spec, *args, log=...)
    spec: str  # "module:Model", the pydantic model of its spec (sent as JSON)
    forked: bool = True  # a child of the job server (else in Snakemake's process, a local rule)
    priority: int = 0  # Snakemake's: higher runs first among ready jobs
    append_log: bool = False  # a training resumed after a kill continues its log
    constraints: tuple[tuple[str, str], ...] = ()  # wildcard regexes of this rule alone

    @property
    def local(self) -> bool:
        """Runs on the submitting host, never through a cluster profile."""
        return not self.forked

    @property
    def log(self) -> str:
        return L.job_log(self.name)

    def function(self) -> Callable[..., Any]:
        return _named(self.entry)

    def spec_model(self) -> type:
        return _named(self.spec)


def _named(path: str):
    """The object ``module:name`` names (imported then: the registry stays light)."""
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


_STEP = (("step", r"[1-9]\d*"),)  # step 0 is the base model's evaluation, copied
_J, _G, _M = "matrixrl.jobs", "matrixrl.grid", "matrixrl.memcollab.specs"

KINDS: tuple[Kind, ...] = (
    Kind("prepare_base", L.base_result("{scale}"), f"{_J}.prepare_base:prepare_base", f"{_G}:BaseSpec"),
    Kind("evaluate_base", L.base_eval_result("{scale}", "{name}"), f"{_J}.evaluate:evaluate_base", f"{_G}:CellSpec"),
    Kind("train", L.train_result("{cell}"), f"{_J}.train:train", f"{_G}:CellSpec", append_log=True),
    Kind("copy_base_eval", L.eval_result("{cell}", 0), f"{_J}.evaluate:copy_base_eval", f"{_G}:CellSpec", forked=False),
    # Evaluations go before another training starts: a cell's checkpoints are pruned once all are evaluated.
    Kind("evaluate", L.eval_result("{cell}", "{step}"), f"{_J}.evaluate:evaluate", f"{_G}:CellSpec", priority=1, constraints=_STEP),
    Kind("collect", L.trajectories_result("{task}", "{scale}", "{samples}"), f"{_J}.memcollab:collect", f"{_M}:CollectSpec"),
    Kind("label", L.labels_result("{task}"), f"{_J}.memcollab:label", f"{_M}:LabelSpec"),
    Kind("distill", L.distilled_result("{task}", "{bank}"), f"{_J}.memcollab:distill", f"{_M}:DistillSpec"),
    Kind("bank", L.bank_result("{task}", "{bank}"), f"{_J}.memcollab:bank", f"{_M}:BankSpec", forked=False),
    Kind("evaluate_base_memory", L.base_memory_eval_result("{scale}", "{bank}", "{name}"), f"{_J}.evaluate:evaluate_base_memory", f"{_G}:MemoryEvalSpec"),
    Kind("copy_base_memory_eval", L.memory_eval_result("{cell}", "{mode}", 0), f"{_J}.evaluate:copy_base_memory_eval", f"{_G}:MemoryEvalSpec", forked=False),
    Kind("evaluate_memory", L.memory_eval_result("{cell}", "{mode}", "{step}"), f"{_J}.evaluate:evaluate_memory", f"{_G}:MemoryEvalSpec", priority=1, constraints=_STEP),
    # Once all of a cell's evaluations exist, the checkpoints it no longer needs go (matrixrl.retention).
    Kind("retain", L.retention_record("{cell}"), f"{_J}.retain:retain_job", f"{_G}:RetainSpec", forked=False, priority=2),
    Kind("analyse", L.SUMMARY_FILE, f"{_J}.analyse:analyse", f"{_G}:AnalyseSpec", forked=False),
)  # fmt: skip
"""Every kind of job, in the order ``plan`` lists them."""

KIND_OF = {kind.name: kind for kind in KINDS}
RULES = tuple(KIND_OF)
"""The Snakefile's rules, one per kind (and its target ``all``)."""
LOCAL_RULES = tuple(kind.name for kind in KINDS if kind.local)
"""Rules that run on the submitting host, never through a cluster profile (profiles read this)."""

WILDCARDS = {
    "cell": r"[^/]+", "scale": r"[^/]+", "name": r"[^/]+", "step": r"\d+", "task": r"[^/]+", "bank": r"[^/]+",
    "mode": r"own|transfer|self_contrast|memcollab", "samples": r"\d+",
}  # fmt: skip
"""The wildcards of every output pattern, and what each matches."""


@dataclass(frozen=True)
class Job:
    """One job of a grid: what it writes and reads, what it runs on, and the digests its
    output must record to be done (matrixrl.status)."""

    rule: str  # its kind's name
    output: str  # relative to the results folder, as the Snakefile names it
    inputs: tuple[str, ...] = ()
    digest: str | None = None  # the output's spec_digest when done
    base_eval: str | None = None  # a copy of a base evaluation: the base_eval it records when done
    params: str | None = None  # the science Snakemake recorded as params, for files from before digests
    resume: str | None = None  # a training: the resume digest its checkpoints carry
    cell: str | None = None
    scale: str | None = None
    step: int | None = None
    wildcards: dict = field(default_factory=dict)
    spec: Any = None  # what the job's function computes from (a pydantic model), sent as JSON
    args: tuple = ()  # the function's arguments after the spec: paths (as str), steps, lists of paths
    gpus: int = 0  # Snakemake's ``gpu`` resource: 1 for a job of a GPU scale
    title: str = ""  # the job's process title and log name: its cell, scale or task

    def row(self, status: str, reason: str | None) -> dict:
        return {
            "rule": self.rule, "cell": self.cell, "scale": self.scale, "step": self.step,
            "status": status, "reason": reason, "output": self.output,
        }

    @property
    def kind(self) -> Kind:
        return KIND_OF[self.rule]

    def argv(self) -> list[str]:
        """``python -m matrixrl.jobs`` 's arguments: the kind, the spec as JSON, the arguments as JSON."""
        return [self.rule, self.spec.model_dump_json(), json.dumps(list(self.args))]


def science_json(payload) -> str:
    """A job's science as its Snakemake params hold it."""
    return json.dumps(science(payload), sort_keys=True)


class Graph:
    """Every job of ``config``'s grid, each after the jobs whose outputs it reads, built once
    in the order plan lists them; nothing is serialised until a job runs.
    """

    def __init__(self, config: Config):
        from matrixrl import grid as G
        from matrixrl.grid import memory_evals, plan_memory
        from matrixrl.memcollab.specs import training_needs

        self.config = config
        self.runs = G.runs(config)  # a one-role workflow's isolated cell is its shared cell's run
        base_digests = {scale: G.base_digest(config, scale) for scale in config.grid.scale}
        self.specs = {cell.id: G.cell_spec(config, cell, base=base_digests[cell.scale]) for cell in self.runs}
        self.memory = plan_memory(config, training_needs(self.specs.values()))
        self.memory_evals = memory_evals(config, self.specs, self.memory) if self.memory.modes else {}
        self.base_of = {scale: G.base_scale(config, scale) for scale in config.grid.scale}
        self.base_eval_of = {c.id: G.base_eval_key(config, self.specs[c.id], self.base_of[c.scale]) for c in self.runs}
        self.jobs: list[Job] = []
        self.bases: dict[str, Job] = {}
        for scale in G.base_scales(config):
            self._prepare_base(scale)
        self._memory_building()
        self.base_evals: dict[tuple[str, str], Job] = {}
        evaluations: list[Job] = []
        for cell in self.runs:
            self._evaluate_base(cell)
        trains = {cell.id: self._train(cell) for cell in self.runs}
        for cell in self.runs:
            evaluations += self._evaluations(cell, trains[cell.id])
        memory_evaluations = self._memory_evaluations()
        evaluated: dict[str, list[str]] = {}
        for job in [*evaluations, *memory_evaluations]:
            if job.cell is not None:
                evaluated.setdefault(job.cell, []).append(job.output)
        for cell in self.runs:
            self._retain(cell, evaluated.get(cell.id, []))
        self._analyse()

    # --- lookups -------------------------------------------------------------------------

    @cached_property
    def by_output(self) -> dict[str, Job]:
        return {job.output: job for job in self.jobs}

    def job(self, rule: str, wildcards) -> Job:
        """The job of kind ``rule`` whose output the wildcards name (a Snakefile rule's lookup;
        ``wildcards``: a mapping, or Snakemake's named list of them)."""
        return self.by_output[KIND_OF[rule].output.format(**dict(wildcards.items()))]

    def targets(self) -> list[str]:
        """Every job's output: what a run makes exist (a deleted intermediate file is rebuilt too)."""
        return [job.output for job in self.jobs]

    def of_kind(self, rule: str) -> Iterator[Job]:
        return (job for job in self.jobs if job.rule == rule)

    # --- the jobs of each kind --------------------------------------------------------------

    def _add(self, job: Job) -> Job:
        self.jobs.append(job)
        return job

    def _prepare_base(self, scale: str) -> Job:
        from matrixrl import grid as G

        spec = G.base_spec(self.config, scale)
        self.bases[scale] = self._add(Job(
            "prepare_base", L.base_result(scale), digest=spec.digest(), params=science_json(spec), scale=scale,
            wildcards={"scale": scale}, spec=spec, args=(L.base_model_dir(scale), L.base_result(scale)), title=scale,
        ))  # fmt: skip
        return self.bases[scale]

    def _memory_building(self) -> None:
        """collect, label, distill and bank per task (matrixrl.memcollab.specs), after the base
        models of memory scales outside grid.scale."""
        from matrixrl import grid as G

        plan = self.memory
        models = [spec.model for spec in (*plan.collects.values(), *plan.labels.values(), *plan.distills.values())]
        for scale in dict.fromkeys(model.base_scale for model in models):
            if scale not in self.bases:
                self._prepare_base(scale)
        for output, spec in plan.collects.items():
            base = self.bases[spec.model.base_scale]
            self._add(Job(
                "collect", output, inputs=(base.output,), digest=spec.digest(),
                scale=spec.model.name,
                wildcards={"task": spec.task_name, "scale": spec.model.name, "samples": str(spec.samples)},
                spec=spec, args=(L.base_model_dir(spec.model.base_scale), output),
                gpus=G.job_gpus(spec.model.scale), title=f"{spec.model.name} on {spec.task_name}",
            ))  # fmt: skip
        for output, spec in plan.labels.items():
            base = self.bases[spec.model.base_scale]
            self._add(Job(
                "label", output, inputs=(base.output,), digest=spec.digest(),
                scale=spec.model.name, wildcards={"task": spec.task_name}, spec=spec,
                args=(L.base_model_dir(spec.model.base_scale), output), gpus=G.job_gpus(spec.model.scale),
                title=spec.task_name,
            ))  # fmt: skip
        for output, spec in plan.distills.items():
            base = self.bases[spec.model.base_scale]
            self._add(Job(
                "distill", output, inputs=(base.output, *spec.collections), digest=spec.digest(), scale=spec.model.name, wildcards={"task": spec.task_name, "bank": spec.bank},
                spec=spec, args=(L.base_model_dir(spec.model.base_scale), list(spec.collections), output),
                gpus=G.job_gpus(spec.model.scale), title=f"{spec.bank} on {spec.task_name}",
            ))  # fmt: skip
        for output, spec in plan.banks.items():
            reads = (L.distilled_result(spec.task_name, spec.bank), L.labels_result(spec.task_name))
            self._add(Job(
                "bank", output, inputs=reads, digest=spec.digest(),
                wildcards={"task": spec.task_name, "bank": spec.bank}, spec=spec, args=(*reads, output),
            ))  # fmt: skip

    def _evaluate_base(self, cell) -> None:
        """A (workflow, task, scale)'s base model, evaluated once: every cell's step 0."""
        from matrixrl import grid as G

        base, name = key = self.base_eval_of[cell.id]
        if key in self.base_evals:
            return
        spec = self.specs[cell.id]
        output = L.base_eval_result(base, name)
        self.base_evals[key] = self._add(Job(
            "evaluate_base", output, inputs=(self.bases[base].output,), digest=G.base_eval_digest(spec), scale=base, step=0,
            wildcards={"scale": base, "name": name}, spec=spec, args=(L.base_model_dir(base), output),
            gpus=G.job_gpus(spec.scale), title=f"{base} {name}",
        ))  # fmt: skip

    def _train(self, cell) -> Job:
        from matrixrl import grid as G

        spec = self.specs[cell.id]
        base = self.base_of[cell.scale]
        reads = (self.bases[base].output,)
        memory: list[str] = []
        if spec.memory is not None:  # trained with a memory: its bank, and the labeller's base model
            labeller = spec.memory.labeller.base_scale
            reads += (L.bank_result(cell.task, spec.memory.bank.bank), L.base_result(labeller))
            memory = [L.bank_result(cell.task, spec.memory.bank.bank), L.base_model_dir(labeller)]
        return self._add(Job(
            "train", L.train_result(cell.id), inputs=reads, digest=spec.train_digest(),
            params=science_json(spec.training()), cell=cell.id, scale=cell.scale, wildcards={"cell": cell.id},
            resume=spec.resume_digest(), spec=spec,
            args=(L.base_model_dir(base), L.cell_dir(cell.id), L.train_result(cell.id), memory or None),
            gpus=G.job_gpus(spec.scale), title=cell.id,
        ))  # fmt: skip

    def _evaluations(self, cell, train: Job) -> list[Job]:
        """A run's step 0 (a copy of its base model's evaluation) and its checkpoints' evaluations."""
        from matrixrl import grid as G

        spec = self.specs[cell.id]
        cell_dir, base = L.cell_dir(cell.id), self.base_of[cell.scale]
        shared = self.base_evals[self.base_eval_of[cell.id]]
        eval_digest = spec.eval_digest()  # once per cell: the science of a paper-sized spec is not free
        evaluations = [self._add(Job(
            "copy_base_eval", L.eval_result(cell.id, 0), inputs=(shared.output,), digest=eval_digest,
            base_eval=shared.digest, cell=cell.id, scale=cell.scale, step=0, wildcards={"cell": cell.id},
            spec=spec, args=(shared.output, L.eval_result(cell.id, 0)),
        ))]  # fmt: skip
        params = json.dumps(spec.science, sort_keys=True)
        for step in G.checkpoint_steps(spec.train)[1:]:  # step 0 is the base model's: shared above
            checkpoint = L.checkpoint_of(cell.id, step)
            evaluations.append(self._add(Job(
                "evaluate", L.eval_result(cell.id, step), inputs=(train.output,), digest=eval_digest, params=params,
                cell=cell.id, scale=cell.scale, step=step, wildcards={"cell": cell.id, "step": str(step)}, spec=spec,
                args=(step, checkpoint, L.base_model_dir(base), L.eval_result(cell.id, step)), gpus=train.gpus,
                title=f"{cell.id} step {step}",
            )))  # fmt: skip
        return evaluations

    def _memory_evaluations(self) -> list[Job]:
        """Each run's evaluations under each memory mode of grid.memory; step 0 once per base
        evaluation and bank."""
        from matrixrl import grid as G

        jobs: list[Job] = []
        shared: dict[str, Job] = {}
        for (cell_id, mode), spec in self.memory_evals.items():
            cell = spec.cell.cell
            bank = L.bank_result(cell.task, spec.bank.bank)
            labels = L.labels_result(cell.task)
            base, name = key = self.base_eval_of[cell_id]
            source = L.base_memory_eval_result(base, spec.bank.bank, name)
            gpus = G.job_gpus(spec.cell.scale)
            if source not in shared:
                shared[source] = self._add(Job(
                    "evaluate_base_memory", source, inputs=(self.base_evals[key].inputs[0], bank, labels),
                    digest=spec.base_digest(), scale=base, step=0,
                    wildcards={"scale": base, "bank": spec.bank.bank, "name": name}, spec=spec,
                    args=(L.base_model_dir(base), bank, labels, source), gpus=gpus,
                    title=f"{base} {name} with {spec.bank.bank}",
                ))  # fmt: skip
                jobs.append(shared[source])
            digest = spec.digest()
            output = L.memory_eval_result(cell_id, mode, 0)
            jobs.append(self._add(Job(
                "copy_base_memory_eval", output, inputs=(source,), digest=digest, base_eval=shared[source].digest,
                cell=cell_id, scale=cell.scale, step=0, wildcards={"cell": cell_id, "mode": mode}, spec=spec,
                args=(source, output),
            )))  # fmt: skip
            base_dir = L.base_model_dir(self.base_of[cell.scale])
            for step in G.checkpoint_steps(spec.cell.train)[1:]:
                output = L.memory_eval_result(cell_id, mode, step)
                checkpoint = L.checkpoint_of(cell_id, step)
                jobs.append(self._add(Job(
                    "evaluate_memory", output, inputs=(L.train_result(cell_id), bank, labels), digest=digest, cell=cell_id, scale=cell.scale, step=step,
                    wildcards={"cell": cell_id, "mode": mode, "step": str(step)}, spec=spec,
                    args=(step, checkpoint, base_dir, bank, labels, output), gpus=gpus,
                    title=f"{cell_id} step {step} with {mode}",
                )))  # fmt: skip
        return jobs

    def _retain(self, cell, evaluated: list[str]) -> None:
        """Once all of a cell's evaluations exist, the checkpoints it no longer needs go."""
        from matrixrl.grid import RetainSpec

        spec = self.specs[cell.id]
        keep = spec.train.keep_checkpoints
        evals = [L.eval_result(cell.id, step) for step in self._steps(cell.id)]
        retain = RetainSpec(cell=cell.id, keep=keep, analysis=self.config.analysis, resume_digest=spec.resume_digest())
        self._add(Job(
            "retain", L.retention_record(cell.id), inputs=(L.train_result(cell.id), *evaluated),
            digest=retention_digest(keep), params=keep, cell=cell.id, scale=cell.scale, wildcards={"cell": cell.id},
            spec=retain, args=(L.cell_dir(cell.id), evals),
        ))  # fmt: skip

    def _steps(self, cell_id: str) -> list[int]:
        from matrixrl import grid as G

        return G.checkpoint_steps(self.specs[cell_id].train)

    def _analyse(self) -> None:
        from matrixrl.grid import AnalyseSpec

        inputs = tuple(job.output for job in self.jobs if job.rule in ("train", "copy_base_eval", "evaluate"))
        spec = AnalyseSpec(
            cells=[{"cell": run.id, **run.axes(), **run.sweep_values()} for run in self.runs],
            analysis=self.config.analysis,
            eval_digests={run.id: self.specs[run.id].eval_digest() for run in self.runs},
            digest=analyse_digest(self.config, self.runs, self.specs, inputs),
        )
        self._add(Job("analyse", L.SUMMARY_FILE, inputs=inputs, digest=spec.digest, spec=spec, args=(L.SUMMARY_FILE,)))


def analyse_digest(config: Config, runs, specs, inputs) -> str:
    """What the summary is computed from: its cells, their current specs, the analysis
    settings and the result files it reads (the ``analyse`` job records it)."""
    return settings_digest({
        "cells": [{"cell": run.id, **run.axes(), **run.sweep_values()} for run in runs],
        "specs": {run.id: specs[run.id].eval_digest() for run in runs},
        "analysis": science(config.analysis),
        "inputs": list(inputs),
    })


def call(argv: list[str], log: Callable[[str], None]) -> Any:
    """Run ``KIND SPEC ARGS`` (a job's ``argv``): the kind's function with its spec validated
    from JSON and its arguments read from JSON, each text a path."""
    rule, spec, args = argv
    if rule not in KIND_OF:
        raise SystemExit(f"unknown job kind {rule!r}; the kinds are: {', '.join(RULES)}")
    kind = KIND_OF[rule]
    return kind.function()(kind.spec_model().model_validate_json(spec), *map(_as_path, json.loads(args)), log=log)


def _as_path(value):
    """A job argument as its function takes it: a text is a path; a list, of paths; a step, as it is."""
    from pathlib import Path

    if isinstance(value, str):
        return Path(value)
    if isinstance(value, list):
        return [_as_path(item) for item in value]
    return value
