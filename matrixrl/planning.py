"""A grid's plan: every job, done or pending and why, and what a run of it needs (``matrixrl plan``).

Reads the job graph and the result files only: no Snakemake, no model.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from matrixrl.config import Config

if TYPE_CHECKING:
    from matrixrl.analysis.design import ClaimDesign

EVALUATIONS = ("copy_base_eval", "evaluate")
MEMORY_EVALUATIONS = ("copy_base_memory_eval", "evaluate_memory")


@dataclass
class Plan:
    """The jobs of a grid as ``matrixrl plan`` shows them (docs/api.md, "Planning and running it")."""

    config: Config
    jobs: list[dict]
    cells: int
    sweeps: dict[str, dict] = field(default_factory=dict)  # each run's extra-axis values
    resources: dict[str, dict] | None = None  # rule → what it requests under the profile
    disk: str = ""  # the checkpoints' disk at the run's peak
    run_command: str = "matrixrl run"
    estimate: Estimate | None = None  # what the pending jobs will take (None: nothing pending)
    memory: list[str] = field(default_factory=list)  # GPU memory per GPU scale, and the GPU's (gpu_memory)
    refused: list[str] = field(default_factory=list)  # a pending job that would not fit its GPU, one line each
    design: list[ClaimDesign] = field(default_factory=list)  # what the claims table can decide on this grid (analysis.design)

    @property
    def pending(self) -> list[dict]:
        return [job for job in self.jobs if job["status"] == "pending"]

    @property
    def runs(self) -> int:
        return len({job["cell"] for job in self.jobs if job["cell"]})

    def rules(self) -> list[dict]:
        """Per rule, in the order the jobs come: jobs, done, pending (and resources under a profile)."""
        found: dict[str, dict] = {}
        for job in self.jobs:
            row = found.setdefault(job["rule"], {"rule": job["rule"], "jobs": 0, "done": 0, "pending": 0})
            row["jobs"] += 1
            row["done" if job["status"] == "done" else "pending"] += 1
        if self.resources is not None:
            for row in found.values():
                row["resources"] = self.resources[row["rule"]]
        return list(found.values())

    def per_cell(self) -> list[dict]:
        """Per run: its training's row, its evaluations done of all, and its memory evaluations'."""
        trains, evals, memory = {}, {}, {}
        for job in self.jobs:
            if job["rule"] == "train":
                trains[job["cell"]] = job
            elif job["rule"] in EVALUATIONS:
                evals.setdefault(job["cell"], []).append(job)
            elif job["rule"] in MEMORY_EVALUATIONS:
                memory.setdefault(job["cell"], []).append(job)
        return [
            {"cell": cell, "sweeps": self.sweeps.get(cell, {}), "train": train, "evaluations": evals.get(cell, []),
             "memory": memory.get(cell, [])}
            for cell, train in trains.items()
        ]  # fmt: skip

    def closing_line(self) -> str:
        """What to do next: nothing, or the command that runs the pending jobs."""
        n = len(self.pending)
        if not n:
            return "Nothing to run."
        return f"{n} {'job' if n == 1 else 'jobs'} pending: `{self.run_command}` runs them."


def run_command(path: Path | None, only: list[str], sets: list[str], default: Path = Path("experiments.yaml")) -> str:
    """``matrixrl run`` with the options a plan was made with, quoted for a shell."""
    words = ["matrixrl", "run"]
    if path is not None and Path(path) != default:
        words += ["-c", str(path)]
    for value in only:
        words += ["--only", value]
    for value in sets:
        words += ["--set", value]
    return " ".join(shlex.quote(word) for word in words)


def make_plan(config: Config, profile: Path | None = None, command: str = "matrixrl run", cores: int | None = None) -> Plan:
    """Every job of ``config``'s grid with its status (matrixrl.status), the resources each
    rule requests under ``profile``, the checkpoints' disk at the run's peak, and what the
    pending jobs will take on ``cores`` (default: this machine's) from the costs recorded."""
    from matrixrl import grid as G
    from matrixrl.dag import Graph
    from matrixrl.disk import disk_at_peak
    from matrixrl.snake.profiles import check_profile, rule_resources
    from matrixrl.status import job_statuses

    from matrixrl.analysis.design import grid_design
    from matrixrl.gpu_memory.budget import gpu_budget
    from matrixrl.gpu_memory.fits import job_memory, memory_lines, refusals

    if profile is not None:
        check_profile(profile)
    graph = Graph(config)
    costs: dict[str, dict] = {}
    jobs = job_statuses(config, graph.jobs, costs)
    cores = cores or os.cpu_count() or 1
    budget = gpu_budget(profile)
    for row, memory in zip(jobs, job_memory(config, budget, graph.jobs), strict=True):
        row["gpu_memory"] = memory
    resources = None
    if profile is not None:
        resources = rule_resources(profile, list(dict.fromkeys(job["rule"] for job in jobs)))
        for job in jobs:
            job["resources"] = resources[job["rule"]]
    return Plan(
        config=config,
        jobs=jobs,
        cells=len(G.cells(config)),
        sweeps={cell.id: cell.sweep_values() for cell in G.runs(config)},
        resources=resources,
        disk=disk_at_peak(config, jobs_at_once(profile)).line(),
        run_command=command,
        estimate=estimate(
            graph.jobs, jobs, costs, cores, last_overhead(config), recorded_elsewhere(config, costs)
        ) if any(job["status"] == "pending" for job in jobs) else None,
        memory=memory_lines(config, budget, jobs, with_refusals=False),
        refused=refusals(config, budget, jobs),
        design=grid_design(config),
    )


def jobs_at_once(profile: Path | None) -> int:
    """How many jobs may run at once, so how many cells may hold their whole set of checkpoints
    unpruned (``disk_at_peak``'s ``in_flight``): a profile's ``jobs``, else this machine's cores."""
    from matrixrl.snake.profiles import profile_config

    jobs = profile_config(profile).get("jobs") if profile is not None else None
    return jobs if isinstance(jobs, int) else os.cpu_count() or 1


def last_overhead(config: Config) -> float:
    """What the last run of this results folder took beyond its jobs (0 if none is recorded)."""
    import json

    from matrixrl import layout as L

    try:
        return max(0.0, float(json.loads((Path(config.results_dir) / L.LAST_RUN_FILE).read_text())["overhead"]))
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0


# --- what the pending jobs will cost ---------------------------------------------------------


@dataclass
class Estimate:
    """What the pending jobs of a plan will take, from the costs recorded by earlier jobs of the same kind
    and scale.

    ``wall_seconds`` schedules them on ``cores`` as Snakemake would; ``untimed``: (kind, scale) without
    history.
    """

    wall_seconds: float
    gpu_hours: float
    cores: int
    timed: int
    untimed: dict[tuple[str, str], int]
    overhead: float

    def line(self) -> str:
        from matrixrl.snake.events import format_duration

        if not self.timed:
            return (
                "estimate: no recorded job of these kinds and scales yet; run a pilot (one seed, fewer steps: "
                "--only seed=0 --set train.steps=10) and plan again"
            )
        gpu = f"; {self.gpu_hours:.1f} GPU-hours" if self.gpu_hours else ""
        missing = ""
        if self.untimed:
            kinds = ", ".join(f"{n} {rule} ({scale})" for (rule, scale), n in self.untimed.items())
            missing = f"; not counted, no history: {kinds}"
        cores = f"{self.cores} core" + ("s" if self.cores != 1 else "")
        return f"estimate: about {format_duration(self.wall_seconds)} on {cores}{gpu}, from recorded jobs{missing}"


# Jobs that run in Snakemake's process take a moment (a copy, a few deletions), not worth timing.
_UNTIMED_LOCAL = 0.0


def _what(job) -> tuple[str | None, str | None]:
    """A job's workflow and task, where its spec says them (jobs of a cell or its base evaluation)."""
    spec = job.spec
    cell = getattr(getattr(spec, "cell", None), "cell", None) or getattr(spec, "cell", None)
    return getattr(cell, "workflow", None), getattr(cell, "task", None)


def _history(jobs, costs: dict[str, dict], elsewhere: list[dict] = ()) -> dict[tuple, list[float]]:
    """Recorded durations by (kind, scale, workflow, task) and coarser keys; a training's per step.

    From ``costs``, then jobs the grid no longer has (``elsewhere``), such as a pilot's.
    """
    found: dict[tuple, list[float]] = {}

    def add(rule: str, scale: str, workflow: str | None, task: str | None, cost: dict) -> None:
        seconds = float(cost["seconds"])
        if rule == "train":
            if not cost.get("steps"):
                return  # a resumed training that ran no step tells nothing of one
            seconds /= cost["steps"]
        for key in ((rule, scale, workflow, task), (rule, scale, workflow), (rule, scale)):
            found.setdefault(key, []).append(seconds)

    for job in jobs:
        if (cost := costs.get(job.output)) is not None:
            add(job.rule, job.scale, *_what(job), cost)
    for record in elsewhere:
        add(record["rule"], record["scale"], record["workflow"], record["task"], record)
    return found


def recorded_elsewhere(config: Config, costs: dict[str, dict]) -> list[dict]:
    """The costs recorded in ``config``'s results folder other than ``costs``, the base evaluations' included."""
    from matrixrl import layout as L
    from matrixrl.status import recorded_cost
    from matrixrl.store import recorded_costs

    results = Path(config.results_dir)
    keys = set()
    for output in costs:
        try:
            keys.add(L.result_key(output))
        except ValueError:
            continue  # a result the store does not hold (a base model's, the analysis)
    found = [row for row in recorded_costs(results) if (row["cell"], row["part"]) not in keys]
    # The longest name first: a workflow or task whose name begins another's is not taken for it.
    names = sorted(
        ((f"{workflow}-{task}-", workflow, task) for workflow in config.grid.workflow for task in config.grid.task),
        key=lambda name: -len(name[0]),
    )
    for path in sorted(results.glob(L.base_eval_result("*", "*"))):
        output = path.relative_to(results).as_posix()
        if output in costs or (cost := recorded_cost(path)) is None:
            continue
        workflow, task = next(((w, t) for prefix, w, t in names if path.stem.startswith(prefix)), (None, None))
        found.append({"rule": "evaluate_base", "workflow": workflow, "task": task, **cost})
    return found


def _duration_of(job, history: dict[tuple, list[float]]) -> float | None:
    if not job.kind.forked:
        return _UNTIMED_LOCAL
    workflow, task = _what(job)
    for key in ((job.rule, job.scale, workflow, task), (job.rule, job.scale, workflow), (job.rule, job.scale)):
        if key in history:
            mean = sum(history[key]) / len(history[key])
            return mean * job.spec.train.steps if job.rule == "train" else mean
    return None


def makespan(jobs, durations: dict[str, float], cores: int) -> float:
    """How long ``jobs`` (each after the jobs of ``jobs`` whose outputs it reads) take on
    ``cores`` slots when each starts as soon as its inputs exist and a slot is free, the
    higher priority first, then in the graph's order: Snakemake's way, roughly."""
    import heapq

    outputs = {job.output for job in jobs}
    waiting = {job.output: {i for i in job.inputs if i in outputs} for job in jobs}
    order = {job.output: n for n, job in enumerate(jobs)}
    by_output = {job.output: job for job in jobs}
    ready = [(-job.kind.priority, order[job.output], job.output) for job in jobs if not waiting[job.output]]
    heapq.heapify(ready)
    running: list[tuple[float, str]] = []  # (end, output)
    now = 0.0
    readers: dict[str, list[str]] = {}
    for job in jobs:
        for i in waiting[job.output]:
            readers.setdefault(i, []).append(job.output)
    while ready or running:
        while ready and len(running) < cores:
            _, _, output = heapq.heappop(ready)
            heapq.heappush(running, (now + durations.get(output, 0.0), output))
        now, done = heapq.heappop(running)
        for reader in readers.get(done, []):
            waiting[reader].discard(done)
            if not waiting[reader]:
                job = by_output[reader]
                heapq.heappush(ready, (-job.kind.priority, order[reader], reader))
    return now


def estimate(
    jobs, rows: list[dict], costs: dict[str, dict], cores: int, overhead: float = 0.0, elsewhere: list[dict] = ()
) -> Estimate:
    """The :class:`Estimate` of the pending jobs among ``jobs`` (their statuses ``rows``), from
    ``costs`` and the costs of jobs the grid no longer has (``elsewhere``)."""
    history = _history(jobs, costs, elsewhere)
    pending = [job for job, row in zip(jobs, rows) if row["status"] == "pending"]
    durations, untimed = {}, {}
    for job in pending:
        seconds = _duration_of(job, history)
        if seconds is None:
            untimed[(job.rule, job.scale)] = untimed.get((job.rule, job.scale), 0) + 1
            continue
        durations[job.output] = seconds
    timed = sum(1 for job in pending if job.kind.forked and job.output in durations)
    gpu_seconds = sum(durations[job.output] for job in pending if job.gpus and job.output in durations)
    wall = makespan(pending, durations, cores) + (overhead if pending else 0.0)
    return Estimate(wall, gpu_seconds / 3600, cores, timed, untimed, overhead)
