"""matrixrl.layout reads back every result path it builds: what the file is, and its key in the store.

The store keys every result by ``(owner, part)`` (``cell_inputs``, ``ingested_files``,
the caches): these keys are stored, so they must stay as they are.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from matrixrl import layout as L
from matrixrl import results as R
from matrixrl.layout import ResultFile, result_file, result_key
from matrixrl.store import RESULT_FILES
from matrixrl.store.writes import store_key

CELL = "single-arith-tiny-s-shared-s0"

BUILT = [
    # (path, what it is, its key in the store or None for a file the store does not hold)
    (L.base_result("tiny-s"), ResultFile("base", "base", scale="tiny-s"), None),
    (L.base_eval_result("tiny-s", "single-arith"), ResultFile("base_eval", "single-arith", scale="tiny-s"), None),
    (
        L.base_memory_eval_result("tiny-s", "own-tiny-s", "single-arith"),
        ResultFile("base_memory_eval", "single-arith", scale="tiny-s", bank="own-tiny-s"),
        None,
    ),
    (L.train_result(CELL), ResultFile("train", "train", cell=CELL), (CELL, "train")),
    (L.eval_result(CELL, 12), ResultFile("eval", "step_12", cell=CELL), (CELL, "eval/step_12")),
    (
        L.memory_eval_result(CELL, "transfer", 12),
        ResultFile("memory_eval", "step_12", cell=CELL, mode="transfer"),
        (CELL, "memory/transfer/step_12"),
    ),
    (L.retention_record(CELL), ResultFile("retained", "retained", cell=CELL), None),
    (
        L.trajectories_result("arith", "tiny-s", 4),
        ResultFile("trajectories", "tiny-s-k4", task="arith"),
        ("memory:arith", "trajectories/tiny-s-k4"),
    ),
    (L.labels_result("arith"), ResultFile("labels", "labels", task="arith"), ("memory:arith", "labels")),
    (
        L.distilled_result("arith", "own-tiny-s"),
        ResultFile("distilled", "own-tiny-s", task="arith"),
        ("memory:arith", "distilled/own-tiny-s"),
    ),
    (L.bank_result("arith", "own-tiny-s"), ResultFile("bank", "own-tiny-s", task="arith"), ("memory:arith", "bank/own-tiny-s")),
]


@pytest.mark.parametrize("path, what, key", BUILT, ids=[what.kind for _, what, _ in BUILT])
def test_every_result_path_built_is_read_back(tmp_path: Path, path: str, what: ResultFile, key) -> None:
    assert result_file(path) == what
    assert result_file(tmp_path / "results" / path) == what  # a job's input: the path in its results folder
    if key is None:
        with pytest.raises(ValueError, match="not the path of a result the store holds"):
            result_key(path)
    else:
        assert result_key(path) == key


def test_an_evaluations_step_is_its_files_name() -> None:
    assert result_file(L.eval_result(CELL, 7)).step == "7"
    assert result_file(L.memory_eval_result(CELL, "own", 0)).step == "0"
    assert result_file(f"cells/{CELL}/eval/step_1 copy.json").step == "1 copy"  # named for no step: path_mismatch says so


@pytest.mark.parametrize("path", ["summary.json", "matrixrl.sqlite", f"cells/{CELL}/checkpoints/step_1/model.json", "eval/step_1.json"])
def test_other_files_are_no_results(path: str) -> None:
    assert result_file(path) is None
    with pytest.raises(ValueError):
        result_key(path)


def test_the_store_reads_every_result_file_by_the_key_of_its_path() -> None:
    """Each of the store's globs matches its builder's paths, and a result is keyed as its file:
    ``ingest`` takes a file whose result has another key than its path's for a corrupt one."""
    results = {
        R.TrainResult: (R.TrainResult.model_construct(cell=CELL), L.train_result(CELL)),
        R.EvalResult: (R.EvalResult.model_construct(cell=CELL, step=3), L.eval_result(CELL, 3)),
        R.MemoryEvalResult: (
            R.MemoryEvalResult.model_construct(cell=CELL, step=3, memory="own"),
            L.memory_eval_result(CELL, "own", 3),
        ),
        R.TrajectoriesResult: (
            R.TrajectoriesResult.model_construct(task="arith", scale="tiny-s", samples=4),
            L.trajectories_result("arith", "tiny-s", 4),
        ),
        R.LabelsResult: (R.LabelsResult.model_construct(task="arith"), L.labels_result("arith")),
        R.DistilledResult: (
            R.DistilledResult.model_construct(task="arith", memory="own-tiny-s"),
            L.distilled_result("arith", "own-tiny-s"),
        ),
        R.BankResult: (R.BankResult.model_construct(task="arith", memory="own-tiny-s"), L.bank_result("arith", "own-tiny-s")),
    }
    assert sorted(kind.__name__ for _, kind in RESULT_FILES) == sorted(kind.__name__ for kind in results)
    for glob, kind in RESULT_FILES:
        result, path = results[kind]
        assert Path(path).match(glob), (path, glob)
        assert store_key(result) == result_key(path)


def test_a_checkpoint_folder_as_a_job_is_handed_it_is_the_cells_checkpoint_folder():
    assert L.checkpoint_of("c-s0", 40) == str(L.checkpoint_dir(L.cell_dir("c-s0"), 40)) == "cells/c-s0/checkpoints/step_40"
