"""A grid's plan: every job, done or pending and why, and what a run of it needs (``matrixrl plan``).

:func:`make_plan` reads the job graph (matrixrl.dag) and the result files
(matrixrl.status) and nothing else: no Snakemake, no model. ``Study.plan()`` returns
the :class:`Plan`; the CLI prints it.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from matrixrl.config import Config

EVALUATIONS = ("copy_base_eval", "evaluate")
MEMORY_EVALUATIONS = ("copy_base_memory_eval", "evaluate_memory")


@dataclass
class Plan:
    """The jobs of a grid as ``matrixrl plan`` shows them.

    ``jobs``: one row per job (rule, cell, scale, step, status, reason, output; and
    ``resources`` under a profile). ``cells``: how many cells the grid has (a one-role
    workflow's isolated cell is its shared cell's run). ``run_command``: the command
    that runs the pending jobs, with the options this plan was made with.
    """

    config: Config
    jobs: list[dict]
    cells: int
    sweeps: dict[str, dict] = field(default_factory=dict)  # each run's extra-axis values
    resources: dict[str, dict] | None = None  # rule → what it requests under the profile
    disk: str = ""  # the checkpoints' disk at the run's peak
    run_command: str = "matrixrl run"

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


def make_plan(config: Config, profile: Path | None = None, command: str = "matrixrl run") -> Plan:
    """Every job of ``config``'s grid with its status (matrixrl.status), the resources each
    rule requests under ``profile``, and the checkpoints' disk at the run's peak."""
    from matrixrl import grid as G
    from matrixrl.disk import disk_at_peak
    from matrixrl.snake.profiles import check_profile, profile_config, rule_resources
    from matrixrl.status import job_statuses

    if profile is not None:
        check_profile(profile)
    jobs = job_statuses(config)
    resources = None
    if profile is not None:
        resources = rule_resources(profile, list(dict.fromkeys(job["rule"] for job in jobs)))
        for job in jobs:
            job["resources"] = resources[job["rule"]]
    # As many cells unpruned as jobs can run at once: a profile's ``jobs``, else this machine's cores.
    in_flight = profile_config(profile).get("jobs") if profile is not None else None
    in_flight = in_flight if isinstance(in_flight, int) else os.cpu_count() or 1
    return Plan(
        config=config,
        jobs=jobs,
        cells=len(G.cells(config)),
        sweeps={cell.id: cell.sweep_values() for cell in G.runs(config)},
        resources=resources,
        disk=disk_at_peak(config, in_flight).line(),
        run_command=command,
    )
