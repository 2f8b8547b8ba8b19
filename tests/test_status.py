"""`matrixrl plan`'s statuses (matrixrl.status) agree with what Snakemake then runs.

One small real run, then every kind of change a user makes or a crash leaves
behind, each on its own copy of the results: the jobs matrixrl.status calls pending
are exactly those Snakemake's dry-run (given the run's --rerun-triggers and
--forcerun) would execute, and a real run executes exactly those.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import once
from test_e2e import jobs_started, matrixrl, small_experiment

pytestmark = pytest.mark.slow

# Every checkpoint kept, so that no change here needs a deleted one rebuilt (tests/test_retention.py and
# test_e2e.py cover that); the "prune" change below switches retention on.
GRID = {"grid.workflow": ["single", "voting"], "grid.policy": ["shared", "isolated"], "train.keep_checkpoints": "all"}


def load(config: Path, results: Path, *sets: str):
    from matrixrl.config import load_config

    return load_config(config, sets=[f"results_dir={results}", *sets], only=[])


def own_pending(cfg) -> set[tuple]:
    from matrixrl.dag import Graph
    from matrixrl.status import job_statuses

    jobs = Graph(cfg).jobs
    rows = job_statuses(cfg, jobs)
    return {_key(job.rule, job.wildcards) for job, row in zip(jobs, rows) if row["status"] == "pending"}


def snakemakes_pending(cfg, dry_run=None) -> set[tuple]:
    """The jobs Snakemake's dry-run would execute: by ``matrixrl.snake.command.pending_jobs``, or by ``dry_run``
    (the ``dry_runs`` fixture's, which answers the same)."""
    from matrixrl.snake.command import pending_jobs
    from matrixrl.status import job_statuses, stale_outputs

    results = Path(cfg.results_dir)
    results.mkdir(parents=True, exist_ok=True)
    found = (dry_run or pending_jobs)(cfg, results, stale_outputs(job_statuses(cfg)))
    return {_key(job["rule"], job["wildcards"]) for job in found if job["rule"] != "all"}


# matrixrl.snake.command.pending_jobs starts a Python per dry-run, as one process must not evaluate two DAGs;
# ~3 of its ~4 s go to importing Snakemake and matrixrl. This one imports them once and forks a
# fresh child for each dry-run, which calls what pending_jobs' process calls.
DRY_RUNNER = r"""
import json, os, sys
from pathlib import Path

import snakemake.api, snakemake.settings.types  # noqa: F401  (what each dry-run imports)
from matrixrl import grid, status  # noqa: F401  (and the Snakefile)
from matrixrl.snake.command import dry_run_in_this_process

for request in sys.stdin:
    configfile, workdir, stale = json.loads(request)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # stdout carries the answers
        try:
            answer = {"jobs": dry_run_in_this_process(Path(configfile), Path(workdir), stale)}
        except BaseException as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        with os.fdopen(write, "w") as out:
            json.dump(answer, out)
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        reply = answer.read()
    os.waitpid(child, 0)
    print(reply or json.dumps({"error": "the dry-run's process died"}), flush=True)
"""


@pytest.fixture(scope="module")
def dry_run():
    """``pending_jobs`` by a forked child of a process that imported Snakemake once (DRY_RUNNER)."""
    from matrixrl.snake.command import job_environment, write_configfile

    runner = subprocess.Popen(
        [sys.executable, "-c", DRY_RUNNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True, env=job_environment(),
    )  # fmt: skip

    def pending(cfg, workdir: Path, stale: list[str]) -> list[dict]:
        with tempfile.TemporaryDirectory() as tmp:
            configfile = write_configfile(cfg, Path(tmp) / "config.yaml")
            runner.stdin.write(json.dumps([str(configfile), str(workdir), list(stale)]) + "\n")
            runner.stdin.flush()
            answer = json.loads(runner.stdout.readline() or '{"error": "the dry-run server is gone"}')
        assert "error" not in answer, f"snakemake's dry-run of {workdir} failed: {answer['error']}"
        return answer["jobs"]

    yield pending
    runner.stdin.close()
    runner.wait(timeout=60)


def _key(rule: str, wildcards: dict) -> tuple:
    return (rule, tuple(sorted((k, str(v)) for k, v in wildcards.items())))


def run_status_grid(folder: Path) -> tuple[Path, Path]:
    config = small_experiment(folder, **GRID)
    matrixrl("run", "-c", str(config), "--cores", "2")
    return config, folder / "results"


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """One finished run of GRID (once per session, whatever the workers: conftest's ``once``)."""
    return once(tmp_path_factory, "status", run_status_grid)


@pytest.fixture
def copy(ran, tmp_path):
    """A private copy of the finished run's results (the copy keeps every mtime)."""
    config, results = ran
    target = tmp_path / "results"
    shutil.copytree(results, target, symlinks=True)
    return config, target


CELL = "voting-arith-tiny-s-isolated-s0"


def _mark_incomplete(results: Path, output: str) -> None:
    # What Snakemake leaves for a job it started and never saw finish (its file persistence).
    marker = results / ".snakemake" / "incomplete" / base64.urlsafe_b64encode(output.encode()).decode()
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("{}")


CHANGES = {
    "nothing": ([], lambda results: None, set()),
    "new seed": (["grid.seed=[0, 1]"], lambda results: None, {"train", "copy_base_eval", "evaluate", "retain", "analyse"}),
    "training setting": (
        ["train.lr=2e-3"], lambda results: None, {"train", "copy_base_eval", "evaluate", "retain", "analyse"}
    ),
    "evaluation setting": (
        ["eval.temperature=0.5"], lambda results: None,
        {"evaluate_base", "copy_base_eval", "evaluate", "retain", "analyse"},
    ),
    "prune": (["train.keep_checkpoints=key"], lambda results: None, {"retain"}),
    "analysis setting": (["analysis.cliff_delta=0.2"], lambda results: None, {"analyse"}),
    "runtime setting": (["train.threads=2", "eval.batch_size=5"], lambda results: None, set()),
    "deleted evaluation": (
        [], lambda r: (r / "cells" / CELL / "eval" / "step_2.json").unlink(), {"evaluate", "retain", "analyse"}
    ),
    "deleted training": (
        [], lambda r: (r / "cells" / CELL / "train.json").unlink(), {"train", "evaluate", "retain", "analyse"}
    ),
    "deleted base evaluation": (
        [], lambda r: [p.unlink() for p in (r / "base" / "tiny-s" / "eval").glob("voting-*.json")],
        {"evaluate_base", "copy_base_eval", "retain", "analyse"},
    ),
    "killed training (checkpoints, no result)": (
        [], lambda r: ((r / "cells" / CELL / "train.json").unlink(), _mark_incomplete(r, f"cells/{CELL}/train.json")),
        {"train", "evaluate", "retain", "analyse"},
    ),
    "killed evaluation that had written its file": (
        [], lambda r: _mark_incomplete(r, f"cells/{CELL}/eval/step_4.json"), {"evaluate", "retain", "analyse"}
    ),
    "corrupt result file": (
        [], lambda r: (r / "cells" / CELL / "eval" / "step_4.json").write_text("{ not json"),
        {"evaluate", "retain", "analyse"},
    ),
    "touched training result": (
        [], lambda r: os.utime(r / "cells" / CELL / "train.json"), set()
    ),
    "summary from an older matrixrl": (
        [], lambda r: (r / "summary.json").write_text(json.dumps(json.loads((r / "summary.json").read_text())["cells"])),
        {"analyse"},
    ),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_plan_agrees_with_snakemake_on_every_kind_of_change(copy, dry_run, change):
    config, results = copy
    sets, mutate, rules = CHANGES[change]
    mutate(results)
    cfg = load(config, results, *sets)
    ours = own_pending(cfg)
    assert ours == snakemakes_pending(cfg, dry_run)
    assert {rule for rule, _ in ours} == rules


def test_plan_of_a_fresh_grid_lists_every_job_as_snakemake_does(tmp_path):
    config = small_experiment(tmp_path, **GRID)
    cfg = load(config, tmp_path / "nothing-yet")
    ours = own_pending(cfg)
    assert ours == snakemakes_pending(cfg)
    # Step 0 is evaluated once per (workflow, task, scale), whatever the policy and seed.
    cfg = load(config, tmp_path / "nothing-yet", "grid.seed=[0, 1, 2]")
    base_evals = [key for key in own_pending(cfg) if key[0] == "evaluate_base"]
    assert len(base_evals) == 2  # single and voting; 9 runs share them


def test_a_run_executes_what_plan_said_and_shares_step_0(copy):
    config, results = copy
    (results / "cells" / CELL / "eval" / "step_4.json").write_text("{ not json")
    sets = ["--set", f"results_dir={results}", "--set", "eval.temperature=0.5", "--set", "grid.seed=[0, 1]"]
    planned = json.loads(matrixrl("plan", "-c", str(config), "--format", "json", *sets).stdout)
    pending = sorted(_started(job) for job in planned if job["status"] == "pending")
    proc = matrixrl("run", "-c", str(config), "--cores", "2", *sets)
    assert sorted(jobs_started(proc)) == pending
    assert f"{len(pending)}/{len(pending)}" in proc.stderr  # the progress bar counts the jobs plan listed
    assert {job["status"] for job in json.loads(matrixrl("plan", "-c", str(config), "--format", "json", *sets).stdout)} == {"done"}
    # Every cell's step 0 is its base model's one evaluation, whatever the cell's policy and seed.
    base = {}
    for cell in (results / "cells").iterdir():
        step0 = json.loads((cell / "eval" / "step_0.json").read_text())
        assert step0["cell"] == cell.name and step0["seconds"] == 0.0
        shared = base.setdefault(cell.name.split("-")[0], step0)
        assert (step0["accuracy"], step0["roles"], step0["base_eval"]) == (shared["accuracy"], shared["roles"], shared["base_eval"])


def _started(job: dict) -> str:
    """A planned job as the run's progress line names it (``▶ RULE WILDCARDS``)."""
    rule, output = job["rule"], job["output"]
    if rule == "analyse":
        return "analyse"
    if rule in ("prepare_base",):
        return f"{rule} scale={job['scale']}"
    if rule == "evaluate_base":
        scale, name = output.split("/")[1], Path(output).stem
        return f"{rule} scale={scale}, name={name}"
    if rule == "evaluate":
        return f"{rule} cell={job['cell']}, step={job['step']}"
    return f"{rule} cell={job['cell']}"
