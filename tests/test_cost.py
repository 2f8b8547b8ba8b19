"""What each job cost, and what the rest will cost: costs recorded in results and the store,
``report --table cost``, and plan's estimate from them (docs/performance.md)."""

from __future__ import annotations

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


def one_workflow_pilot(folder: Path, seeds: list[int]) -> Path:
    from test_e2e import small_experiment

    path = small_experiment(folder, **{"train.steps": 6, "train.eval_every": 3})
    raw = yaml.safe_load(path.read_text())
    raw["grid"]["workflow"] = ["single", "voting"]
    raw["grid"]["seed"] = seeds
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.mark.slow
def test_after_one_seed_the_estimate_for_a_second_is_within_30_percent(tmp_path: Path):
    """A pilot of one seed records what every job cost; plan then estimates adding a second
    seed, and the second seed's run takes within ±30% of that estimate."""
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
    assert plan.estimate is not None and plan.estimate.timed > 0 and not plan.estimate.untimed
    second = study.run(cores=2)
    assert second.ok
    ratio = second.seconds / plan.estimate.wall_seconds
    print(f"estimate {plan.estimate.wall_seconds:.1f} s, measured {second.seconds:.1f} s, ratio {ratio:.2f}")
    assert 0.7 <= ratio <= 1.3, (plan.estimate, second.seconds)
