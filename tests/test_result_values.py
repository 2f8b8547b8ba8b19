"""Result files that are valid JSON yet cannot be a result: one ``Error:`` line, nothing stored.

- A value no job writes (NaN, an accuracy outside [0, 1], no problems, more correct
  completions than completions, a count beyond SQLite's integers) is a corrupt result
  file naming the field, where it crashed ``report`` with SQLite's or the analysis' error.
- A file that holds another result than its path names (``"step": 7`` in
  ``eval/step_1.json``, another cell's training) is a corrupt result file; it was stored
  as that other result, a row no file backs, which stayed after the file was restored.
- JSON that is not an object (``[]``) is an unreadable result for ``plan`` and an
  unreadable export state for ``export``, where both crashed with an AttributeError.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

import pytest

from matrixrl import grid as G
from matrixrl.config import load_config
from matrixrl.errors import ResultFileError
from matrixrl.export import STATE_FILE
from matrixrl.grid import Cell
from matrixrl.layout import STORE_FILE, eval_result, train_result
from matrixrl.results import EvalResult, StepMetrics, read_result

import study_files as S
from conftest import run_cli
from test_cli_errors import CELL, FIX, ONE_CELL, assert_user_error, results_of, snapshot, stored  # noqa: F401 (stored: a fixture)

GOOD_EVAL = {"cell": CELL.id, "step": 10, "accuracy": 0.25, "n": 256, "n_correct": 64, "seconds": 0.5}

BAD_EVALS = {
    "NaN accuracy": ({"accuracy": float("nan")}, "accuracy: Input should be a finite number"),
    "accuracy above 1": ({"accuracy": 5.0}, "accuracy: Input should be less than or equal to 1"),
    "negative accuracy": ({"accuracy": -1}, "accuracy: Input should be greater than or equal to 0"),
    "no problems": ({"n": 0}, "n: Input should be greater than or equal to 1"),
    "count beyond SQLite": ({"n_correct": 10**30}, "n_correct: Input should be less than or equal to 9223372036854775807"),
    "more correct than completions": ({"n_correct": 300}, "n_correct: 300, more than n * samples = 256"),
    "negative count": ({"n_correct": -1}, "n_correct: Input should be greater than or equal to 0"),
    "infinite se": ({"se": float("inf")}, "se: Input should be a finite number"),
    "pass@j above 1": ({"pass_at": {"1": 2.0}}, "pass_at.1: Input should be less than or equal to 1"),
    "NaN role metric": (
        {"roles": [{"role": "generator", "metric": "answer_acc", "value": float("nan")}]},
        "roles.0.value: Input should be a finite number",
    ),
    "negative seconds": ({"seconds": -0.5}, "seconds: Input should be greater than or equal to 0"),
    "no samples": ({"samples": 0}, "samples: Input should be greater than or equal to 1"),
}


def store_rows(experiment: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(results_of(experiment) / STORE_FILE) as db:
        return db.execute(sql).fetchall()


def assert_rejected(experiment: Path, bad: Path, text: str, problem: str) -> None:
    """``report`` names ``bad`` and ``problem`` in one line, exit 2, and leaves every file, the store's too, as it was."""
    results = results_of(experiment)
    bad.parent.mkdir(parents=True, exist_ok=True)
    bad.write_text(text)
    before = snapshot(results)
    assert_user_error(run_cli("report", "-c", experiment, *ONE_CELL), f"{bad}: corrupt result file ({problem}); {FIX}")
    assert snapshot(results) == before  # the store untouched, nothing written, nothing lost


# --- values no job writes ----------------------------------------------------------------


@pytest.mark.parametrize("case", list(BAD_EVALS))
@pytest.mark.parametrize("which", ["new-file", "changed-file"])
def test_an_evaluation_with_an_impossible_value_is_a_corrupt_result_file(stored: Path, case: str, which: str) -> None:  # noqa: F811
    change, problem = BAD_EVALS[case]
    step = 10 if which == "new-file" else 0
    bad = results_of(stored) / eval_result(CELL.id, step)
    assert_rejected(stored, bad, json.dumps({**GOOD_EVAL, "step": step, **change}), problem)
    assert store_rows(stored, "select step, accuracy, n, n_correct from evaluations") == [(0, 0.25, 256, 64)]


def test_more_correct_completions_than_problems_is_fine_with_several_samples(stored: Path) -> None:  # noqa: F811
    results = results_of(stored)
    (results / eval_result(CELL.id, 10)).write_text(json.dumps({**GOOD_EVAL, "n_correct": 300, "samples": 2}))
    result = run_cli("report", "-c", stored, *ONE_CELL, "--format", "json")
    assert result.exit_code == 0, result.output
    assert store_rows(stored, "select step, n_correct, samples from evaluations order by step") == [(0, 64, 1), (10, 300, 2)]


def good_training(experiment: Path) -> dict:
    """CELL's train.json, with one step's metrics."""
    training = json.loads((results_of(experiment) / train_result(CELL.id)).read_text())
    metrics = StepMetrics(step=1, reward_mean=0.5, reward_std=0.1, loss=0.2, entropy=1.0, response_length=2.0,
                          grad_norm=0.3, clip_fraction=0.0, group_size=8, seconds=0.1)  # fmt: skip
    return {**training, "steps": 1, "metrics": [metrics.model_dump()]}


@pytest.mark.parametrize(
    "change, problem",
    [
        (lambda t: t["metrics"][0].update(loss=float("nan")), "metrics.0.loss: Input should be a finite number"),
        (lambda t: t["metrics"][0].update(step=-1), "metrics.0.step: Input should be greater than or equal to 0"),
        (lambda t: t["metrics"][0].update(clip_fraction=1.5), "metrics.0.clip_fraction: Input should be less than or equal to 1"),
        (lambda t: t["axes"].update(extra="x"), "axes: workflow, task, scale, policy, seed, extra, not the axes workflow, task, scale, policy, seed"),
        (lambda t: t["axes"].pop("seed"), "axes: workflow, task, scale, policy, not the axes workflow, task, scale, policy, seed"),
        (lambda t: t["axes"].update(seed="0"), f'axes.seed: "0", not a whole number within [0, {2**63 - 1}]'),
        (lambda t: t["axes"].update(seed=10**30), f"axes.seed: {10**30}, not a whole number within [0, {2**63 - 1}]"),
        (lambda t: t["axes"].update(seed=3), 'axes: those of cell "single-arith-tiny-s-shared-s3", not of "single-arith-tiny-s-shared-s0"'),
    ],
    ids=["NaN loss", "negative step", "clip fraction above 1", "extra axis", "missing axis", "seed as text", "huge seed", "another cell's axes"],
)
def test_a_training_with_an_impossible_value_is_a_corrupt_result_file(stored: Path, change, problem: str) -> None:  # noqa: F811
    training = good_training(stored)
    change(training)
    bad = results_of(stored) / train_result(CELL.id)
    assert_rejected(stored, bad, json.dumps(training), problem)


# --- a file that names another result than its path -----------------------------------------


def test_an_evaluation_of_another_step_than_its_path_is_corrupt_and_leaves_no_row(stored: Path) -> None:  # noqa: F811
    results = results_of(stored)
    bad = results / eval_result(CELL.id, 1)
    assert_rejected(stored, bad, json.dumps({**GOOD_EVAL, "step": 7}), "step: 7, but its path says 1")
    bad.write_text(json.dumps({**GOOD_EVAL, "step": 1}))  # put right
    result = run_cli("report", "-c", stored, *ONE_CELL, "--format", "json")
    assert result.exit_code == 0, result.output
    assert store_rows(stored, "select step from evaluations order by step") == [(0,), (1,)]
    assert store_rows(stored, "select part from cell_inputs order by part") == [("eval/step_0",), ("eval/step_1",), ("train",)]


def test_a_changed_evaluation_of_another_step_is_corrupt(stored: Path) -> None:  # noqa: F811
    bad = results_of(stored) / eval_result(CELL.id, 0)
    assert_rejected(stored, bad, json.dumps({**GOOD_EVAL, "step": 7}), "step: 7, but its path says 0")


def test_a_file_named_for_no_step_is_corrupt(stored: Path) -> None:  # noqa: F811
    bad = results_of(stored) / "cells" / CELL.id / "eval" / "step_1 copy.json"
    assert_rejected(stored, bad, json.dumps({**GOOD_EVAL, "step": 1}), 'step: 1, but its path says "1 copy"')


def test_an_evaluation_or_training_of_another_cell_is_corrupt(stored: Path) -> None:  # noqa: F811
    results = results_of(stored)
    other = Cell(workflow="single", task="arith", scale="tiny-s", policy="shared", seed=1)
    bad = results / eval_result(CELL.id, 10)
    assert_rejected(stored, bad, json.dumps({**GOOD_EVAL, "cell": other.id}), f'cell: "{other.id}", but its path says "{CELL.id}"')
    bad.unlink()
    training = {**good_training(stored), "cell": other.id, "axes": other.axes()}
    bad = results / train_result(CELL.id)
    assert_rejected(stored, bad, json.dumps(training), f'cell: "{other.id}", but its path says "{CELL.id}"')
    assert store_rows(stored, "select cell from cells") == [(CELL.id,)]


def test_a_store_that_took_a_file_for_another_step_forgets_that_row(stored: Path) -> None:  # noqa: F811
    """A store written before this check: ``eval/step_1.json`` read as step 7 left a row of
    step 7 that no file backs. The next report forgets it, though the file is unchanged since."""
    results = results_of(stored)
    rel_1, rel_7 = eval_result(CELL.id, 1), eval_result(CELL.id, 7)
    (results / rel_7).write_text(json.dumps({**GOOD_EVAL, "step": 7, "accuracy": 0.75, "n_correct": 192}))
    assert run_cli("report", "-c", stored, *ONE_CELL).exit_code == 0
    (results / rel_7).rename(results / rel_1)  # what the old store recorded: step_1.json holds step 7 ...
    (results / rel_1).write_text(json.dumps({**GOOD_EVAL, "step": 1}))  # ... and the file put right since
    an_hour_ago = time.time() - 3600
    os.utime(results / rel_1, (an_hour_ago, an_hour_ago))
    stat = (results / rel_1).stat()
    with sqlite3.connect(results / STORE_FILE) as db:  # unchanged since it was read, as far as the store knows
        db.execute(
            "update ingested_files set path = ?, size = ?, mtime_ns = ?, inode = ? where path = ?",
            (rel_1, stat.st_size, stat.st_mtime_ns, stat.st_ino, rel_7),
        )
    assert store_rows(stored, "select step from evaluations order by step") == [(0,), (7,)]

    result = run_cli("report", "-c", stored, *ONE_CELL, "--format", "json")
    assert result.exit_code == 0, result.output
    assert store_rows(stored, "select step, accuracy from evaluations order by step") == [(0, 0.25), (1, 0.25)]
    assert store_rows(stored, "select path, part from ingested_files where part like 'eval/%' order by part") == [
        (eval_result(CELL.id, 0), "eval/step_0"), (rel_1, "eval/step_1"),
    ]  # fmt: skip
    assert store_rows(stored, "select part from cell_inputs order by part") == [("eval/step_0",), ("eval/step_1",), ("train",)]


def test_a_base_evaluation_of_another_step_than_0_is_not_copied(experiment: Path) -> None:
    from matrixrl.jobs.evaluate import copy_base_eval

    config = load_config(experiment, only=[o for o in ONE_CELL[1::2]])
    (cell,) = G.runs(config)
    spec = G.cell_spec(config, cell)
    base, name = G.base_eval_key(config, spec, G.base_scale(config, cell.scale))
    source = results_of(experiment) / f"base/{base}/eval/{name}.json"
    source.parent.mkdir(parents=True)
    source.write_text(json.dumps({**GOOD_EVAL, "cell": "the base model", "step": 7}))
    output = results_of(experiment) / eval_result(cell.id, 0)
    with pytest.raises(ResultFileError) as error:
        copy_base_eval(spec, source, output, log=lambda message: None)
    assert str(error.value) == f"{source}: corrupt result file (step: 7, but a base model's evaluation is step 0); {FIX}"
    assert not output.exists()
    source.write_text(json.dumps({**GOOD_EVAL, "cell": "the base model", "step": 0}))
    copy_base_eval(spec, source, output, log=lambda message: None)
    assert (read_result(output, EvalResult).cell, read_result(output, EvalResult).step) == (cell.id, 0)


# --- JSON that is not an object ---------------------------------------------------------------


def test_plan_says_a_result_that_is_not_an_object_is_unreadable(experiment: Path) -> None:
    args = ("-c", experiment, *ONE_CELL, "--set", "train.steps=4", "--set", "train.eval_every=2", "--format", "json")
    jobs = json.loads(run_cli("plan", *args).stdout)
    results = results_of(experiment)
    for job in jobs:  # train.json, base.json, base evaluations, retained.json, step_0.json, ...: all []
        (results / job["output"]).parent.mkdir(parents=True, exist_ok=True)
        (results / job["output"]).write_text("[]")
    result = run_cli("plan", *args)
    assert result.exit_code == 0, result.output
    reasons = [(job["rule"], job["status"], job["reason"]) for job in json.loads(result.stdout)]
    # A summary that is a list is one from before it recorded its inputs: changed, as before.
    assert reasons == [(job["rule"], "pending", "changed" if job["rule"] == "analyse" else "unreadable") for job in jobs]


@pytest.mark.parametrize(
    "state, problem",
    [
        ("[]", "a list, not an object"),
        ('"text"', "a string, not an object"),
        ('{"cells": []}', "version None"),
        ('{"version": 1, "tracker": "tensorboard", "key": "k", "cells": []}', "cells: a list, not an object"),
        ('{"version": 1, "tracker": "tensorboard", "key": "k", "cells": {"c": []}}', "cells.c: a list, not an object"),
        ('{"version": 1, "tracker": "tensorboard", "key": "k", "cells": {"c": {"parts": []}}}', "cells.c.parts: a list, not an object"),
        ('{"version": 1, "tracker": "tensorboard", "key": "k", "cells": {"c": {"stamp": "1"}}}', "cells.c.stamp: a string, not a whole number"),
        ('{"version": 1, "tracker": "tensorboard", "key": "k", "cells": {"c": {"parts": {"eval/step_x": "d"}}}}',
         "cells.c.parts: 'eval/step_x' is no evaluation's part (eval/step_N)"),
        (None, "a folder, not a file"),
    ],
    ids=["list", "string", "no version", "cells a list", "cell a list", "parts a list", "stamp text", "bad part", "folder"],
)
def test_an_export_state_that_is_not_an_export_state_is_named(experiment: Path, tmp_path: Path, state, problem: str) -> None:
    S.write_study(experiment, steps=(0,))
    out = tmp_path / "out"
    out.mkdir()
    if state is None:
        (out / STATE_FILE).mkdir()
    else:
        (out / STATE_FILE).write_text(state)
    before = snapshot(out)
    only = [arg for option in S.ONLY for arg in ("--only", option)]
    assert_user_error(
        run_cli("export", "tensorboard", "-c", experiment, *only, "--out", out),
        f"{out / STATE_FILE}: unreadable export state ({problem}); delete the folder {out} and export again",
    )
    assert snapshot(out) == before and (out / STATE_FILE).exists()
