"""What each job cost, and what the rest will cost: costs recorded in results and the store,
``report --table cost``, and plan's estimate from them (docs/performance.md)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import yaml

import matrixrl
from conftest import run_cli
from matrixrl.planning import makespan


class _Job:
    def __init__(self, output, inputs=(), priority=0):
        self.output, self.inputs = output, tuple(inputs)
        self.kind = type("K", (), {"priority": priority})()


def test_makespan_schedules_jobs_after_their_inputs_on_the_cores():
    # A training of 10 s, then three evaluations of 4 s; another training of 6 s.
    jobs = [_Job("t1"), _Job("t2"), *(_Job(f"e{i}", ["t1"], priority=1) for i in range(3))]
    durations = {"t1": 10.0, "t2": 6.0, "e0": 4.0, "e1": 4.0, "e2": 4.0}
    assert makespan(jobs, durations, cores=1) == 28.0
    # Two cores: t1 and t2 at once; t2's core takes e0 at 10 (evaluations wait for t1), e1 and e2 follow.
    assert makespan(jobs, durations, cores=2) == 18.0
    assert makespan(jobs, durations, cores=8) == 14.0


def test_a_pilot_with_fewer_steps_and_other_evaluation_settings_times_the_full_grid(tmp_path: Path):
    """The estimate learns from every cost the results folder records, not only from jobs the
    grid still has: a pilot of 2 steps evaluated at step 1, and a base evaluation made under
    other settings (another name), time a grid of 4 steps evaluated at steps 2 and 4."""
    from test_e2e import small_experiment

    from matrixrl.store import Store

    path = small_experiment(tmp_path, **{"train.steps": 4, "train.eval_every": 2})
    results = tmp_path / "results"
    results.mkdir()
    Store(results / "matrixrl.sqlite").close()  # the store's schema, as a run leaves it
    cell = "single-arith-tiny-s-shared-s0"
    cost = {"scale": "tiny-s", "device": "cpu", "peak_rss_bytes": 1, "peak_gpu_bytes": None, "tokens": 1}
    with sqlite3.connect(results / "matrixrl.sqlite") as db:
        db.execute("INSERT INTO cells VALUES (?, 'single', 'arith', 'tiny-s', 'shared', 0, 'pilot')", (cell,))
        for part, rule, seconds, steps in (("train", "train", 20.0, 2), ("eval/step_1", "evaluate", 3.0, None)):
            db.execute(
                "INSERT INTO job_costs (cell, part, rule, seconds, scale, device, peak_rss_bytes, tokens, steps) "
                "VALUES (?, ?, ?, ?, 'tiny-s', 'cpu', 1, 1, ?)",
                (cell, part, rule, seconds, steps),
            )
    base = results / "base" / "tiny-s"
    (base / "eval").mkdir(parents=True)
    (base / "base.json").write_text(json.dumps({"spec_digest": "pilot", "cost": {**cost, "seconds": 7.0, "steps": None}}))
    pilot_eval = {"spec_digest": "pilot", "cost": {**cost, "seconds": 5.0, "steps": None}}
    (base / "eval" / "single-arith-0123456789.json").write_text(json.dumps(pilot_eval))

    plan = matrixrl.Study.load(path).plan(cores=1)
    assert {job["rule"] for job in plan.pending} >= {"prepare_base", "evaluate_base", "train", "evaluate"}
    assert plan.estimate.untimed == {}
    # One core: the warm-start (7 s), its evaluation (5 s), 4 steps at the pilot's 10 s each,
    # two evaluations at 3 s; the copies, retention and analysis run in Snakemake's process.
    assert plan.estimate.wall_seconds == pytest.approx(7 + 5 + 4 * 10 + 2 * 3)
    assert plan.estimate.line() == "estimate: about 58 s on 1 core, from recorded jobs"


def one_workflow_pilot(folder: Path, seeds: list[int]) -> Path:
    from test_e2e import small_experiment

    path = small_experiment(folder, **{"train.steps": 6, "train.eval_every": 3})
    raw = yaml.safe_load(path.read_text())
    raw["grid"]["workflow"] = ["single", "voting"]
    raw["grid"]["seed"] = seeds
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.mark.slow
def test_a_pilot_seed_records_every_jobs_cost_and_times_a_second_seed(tmp_path: Path):
    """A pilot of one seed records what every job cost, and plan then times every job of a second
    seed from those records. How close that estimate comes to the second seed's run is a timing,
    measured by bench/estimate.py, not asserted here."""
    path = one_workflow_pilot(tmp_path / "study", [0])
    first = matrixrl.Study.load(path).run(cores=2)
    assert first.ok
    results = path.parent / "results"
    with sqlite3.connect(results / "matrixrl.sqlite") as db:
        rules = {rule for (rule,) in db.execute("select distinct rule from job_costs")}
    assert rules == {"train", "evaluate"}  # the store holds the costs of the results it holds
    table = matrixrl.Study.load(path).table("cost")
    rows = {row.rule: row for row in table.itertuples()}
    # Every job the pilot ran but the local ones: the warm-start and base evaluations come from their files.
    assert list(rows) == ["prepare_base", "evaluate_base", "train", "evaluate"] and set(table["scale"]) == {"tiny-s"}
    assert (rows["prepare_base"].jobs, rows["evaluate_base"].jobs, rows["train"].jobs, rows["evaluate"].jobs) == (1, 2, 2, 4)
    assert rows["train"].tokens_per_s > 0 and rows["evaluate"].tokens_per_s > 0 and rows["train"].device == "cpu"
    assert rows["train"].peak_rss_gb > 0.1  # a job process holds torch and the model: hundreds of MB
    as_json = run_cli("report", "-c", str(path), "--table", "cost", "--format", "json")
    assert list(table.columns) == list(json.loads(as_json.stdout)[0])  # the API's columns are the JSON's, in order
    printed = run_cli("report", "-c", str(path), "--table", "cost")
    assert printed.exit_code == 0, printed.output
    lines = printed.stdout.splitlines()
    assert max(map(len, lines)) <= 100 and "…" not in printed.stdout
    assert [line.split()[:3] for line in lines if line.split()[1:2] in (["train"], ["evaluate"])] == [
        ["tiny-s", "train", "2"], ["tiny-s", "evaluate", "4"]
    ]

    path.write_text(path.read_text().replace("seed:\n  - 0\n", "seed:\n  - 0\n  - 1\n"))
    study = matrixrl.Study.load(path)
    plan = study.plan(cores=2)
    assert plan.estimate is not None and not plan.estimate.untimed
    assert plan.estimate.timed == len([job for job in plan.pending if job["rule"] in ("train", "evaluate")])
    assert plan.estimate.line().endswith("on 2 cores, from recorded jobs")
