"""What a run's progress line says while it works: the jobs running, and the time left."""

from __future__ import annotations

from matrixrl.snake.events import TimeLeft


def test_no_estimate_before_a_job_has_finished() -> None:
    clock = TimeLeft({"train": 2, "evaluate": 4}, cores=2)
    clock.started("1", "train", now=0.0)
    clock.started("2", "train", now=0.0)
    assert clock.seconds_left(5.0) is None
    assert clock.describe(5.0) == "running: train ×2"


def test_the_estimate_weighs_each_rule_by_its_own_jobs_so_far() -> None:
    clock = TimeLeft({"train": 3, "evaluate": 4}, cores=2)
    clock.started("1", "train", 0.0)
    clock.started("2", "evaluate", 0.0)
    clock.finished("2", 10.0)  # an evaluation takes 10 s
    clock.finished("1", 100.0)  # a training 100 s
    clock.started("3", "train", 100.0)
    # Left: one training to start (100 s), 50 s of the one running, three evaluations (30 s), on 2 cores.
    assert clock.seconds_left(150.0) == (100 + 50 + 3 * 10) / 2
    assert clock.describe(150.0) == "running: train · about 2 min left"
    # A rule none of whose jobs has finished is expected to take the mean of every finished job.
    other = TimeLeft({"analyse": 1, "evaluate": 1}, cores=1)
    other.started("1", "evaluate", 0.0)
    other.finished("1", 4.0)
    assert other.seconds_left(4.0) == 4.0  # the analysis, at the evaluation's 4 s
    other.started("2", "analyse", 4.0)
    other.finished("2", 5.0)
    assert other.describe(5.0) == "jobs"  # all done: no estimate left to give


def test_long_estimates_read_in_minutes_and_hours() -> None:
    clock = TimeLeft({"train": 60}, cores=1)
    clock.started("1", "train", 0.0)
    clock.finished("1", 120.0)
    assert clock.describe(120.0) == "about 2.0 h left"
    clock = TimeLeft({"train": 5}, cores=1)
    clock.started("1", "train", 0.0)
    clock.finished("1", 120.0)
    assert clock.describe(120.0) == "about 8 min left"
