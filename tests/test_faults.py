"""Failures a user can fix are named as such: a full disk, a read-only or forbidden folder.

The message functions on their own first, then the faults on real small runs.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import skip_or_fail
from matrixrl import layout as L
from matrixrl.errors import disk_error_message
from test_e2e import CELL0, small_experiment
from test_signals import GRID, fresh, matrixrl, outcome


def test_a_full_disk_is_named_with_the_path_and_the_fix() -> None:
    with pytest.raises(OSError) as caught:
        with open("/dev/full", "w") as full:  # every write to /dev/full fails with ENOSPC
            full.write("x")
    assert caught.value.errno == errno.ENOSPC
    assert disk_error_message(caught.value) == (
        "no space left on the device; free some space, or point results_dir at a larger disk"
    )


def test_the_cause_is_found_behind_a_wrapping_error() -> None:
    try:
        try:
            raise OSError(errno.EROFS, "Read-only file system", "/data/results/cells/x/train.json")
        except OSError as exc:
            raise RuntimeError("saving the checkpoint failed") from exc
    except RuntimeError as wrapped:
        assert disk_error_message(wrapped) == (
            "writing /data/results/cells/x/train.json: the file system is read-only; "
            "point results_dir at a writable folder"
        )


def test_a_library_that_keeps_only_the_text_is_understood() -> None:
    # safetensors (Rust) reports a full disk this way.
    assert disk_error_message(RuntimeError("I/O error: No space left on device (os error 28)")) == (
        "no space left on the device; free some space, or point results_dir at a larger disk"
    )


def test_other_errors_keep_their_traceback() -> None:
    assert disk_error_message(ValueError("a bug")) is None
    assert disk_error_message(FileNotFoundError(errno.ENOENT, "No such file", "x")) is None


# --- on real small runs: a full disk, a read-only results folder ---------------------------
# A small tmpfs stands for a full disk and a read-only bind mount for a read-only folder:
# both need root (CI runs as root), as permissions alone cannot stop root from writing.

NO_SPACE = "no space left on the device; free some space, or point results_dir at a larger disk"
READ_ONLY = "the file system is read-only; point results_dir at a writable folder"


@contextlib.contextmanager
def mounted(target: Path, *how: list[str]):
    """``target`` with each ``mount`` command of ``how`` applied in turn; unmounted at the end."""
    target.mkdir(parents=True, exist_ok=True)
    done = 0
    try:
        for args in how:
            proc = subprocess.run(["mount", *args, str(target)], capture_output=True, text=True)
            if proc.returncode != 0:
                skip_or_fail("the disk fault tests", f"mount {' '.join(args)} failed: {proc.stderr.strip()}", "run as root")
            done += 1
        yield target
    finally:
        for _ in range(done):
            subprocess.run(["umount", "-l", str(target)], check=False)


def small_disk(target: Path, size_mb: int):
    return mounted(target, ["-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs"])


def read_only(target: Path):
    return mounted(target, ["--bind", str(target)], ["-o", "remount,bind,ro"])


def fill(disk: Path, leave_mb: float) -> Path:
    """Take all but ``leave_mb`` of ``disk``'s free space with one file; deleting it frees the space."""
    filler = disk / "filler"
    size = shutil.disk_usage(disk).free - int(leave_mb * 2**20)
    with filler.open("wb") as handle:
        if size > 0:
            os.posix_fallocate(handle.fileno(), 0, size)
    assert shutil.disk_usage(disk).free <= leave_mb * 2**20 + 2**16
    return filler


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_a_full_disk_while_writing_a_checkpoint_is_named_and_the_run_resumes(reference: Path, tmp_path: Path) -> None:
    config, results = fresh(reference, tmp_path)
    checkpoints = results / L.checkpoints_dir(L.cell_dir(CELL0))
    base = files_of(results / "base")
    with small_disk(results / "cells", 24) as cells:
        filler = fill(cells, leave_mb=6)  # room for the step 0 and step 10 checkpoints, not step 20's
        proc = matrixrl("run", "-c", str(config), "--cores", "2")
        assert proc.returncode == 1, proc.stderr
        log = results / L.job_log("train", cell=CELL0)
        failed = re.search(
            rf"✗ job train \(cell={CELL0}\) failed: (writing the checkpoint of step (\d+) to "
            # torch's writer loses the OS error: the message then says what space was left
            rf"{re.escape(str(checkpoints))}/step_\2: {re.escape(NO_SPACE)}( \(\d+ MiB free under [^)]+\))?); "
            rf"log: {re.escape(str(log))}\n",
            proc.stderr,
        )
        assert failed, proc.stderr
        assert "Traceback" not in proc.stderr
        assert log.read_text().splitlines()[-1] == f"Error: {failed[1]}"
        # Nothing half-written is left: every checkpoint there is complete, no temporary folder.
        left = sorted(p.name for p in checkpoints.iterdir())
        assert left and all(re.fullmatch(r"step_\d+", name) for name in left), left
        assert all((checkpoints / name / "COMPLETE").exists() for name in left)
        assert f"step_{failed[2]}" not in left
        assert files_of(results / "base") == base

        filler.unlink()  # the user frees some space and runs again
        proc = matrixrl("run", "-c", str(config), "--cores", "2")
        assert proc.returncode == 0, proc.stderr
        assert f"from its checkpoint at step {left[-1].removeprefix('step_')}" in log.read_text()
        assert outcome(results) == outcome(reference)


@pytest.mark.slow
def test_a_full_disk_while_writing_the_store_is_named_and_report_recovers(reference: Path, tmp_path: Path) -> None:
    config = small_experiment(tmp_path, **GRID)
    expected = report_rows(reference.parent / "experiments.yaml")
    with small_disk(tmp_path / "results", 64) as results:
        shutil.copytree(reference, results, dirs_exist_ok=True, symlinks=True)
        (results / L.STORE_FILE).unlink()  # the report must write a new one
        filler = fill(results, leave_mb=0)
        proc = matrixrl("report", "-c", str(config), "--format", "json")
        store = results / L.STORE_FILE
        assert (proc.returncode, proc.stdout) == (1, ""), proc.stderr
        assert proc.stderr == f"Error: writing the store {store}: {NO_SPACE}\n"
        assert not store.exists() or report_rows(config) == expected  # never a half-written store
        filler.unlink()
        assert report_rows(config) == expected


def report_rows(config: Path) -> list[dict]:
    proc = matrixrl("report", "-c", str(config), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_a_results_folder_this_user_cannot_write_without_a_store_is_still_reported(reference: Path, tmp_path: Path) -> None:
    """Its store cannot be created there: the report reads the result files into a temporary
    store instead, and leaves the folder as it was. The tests run as root, so the commands run
    without root's right to ignore permissions."""
    config = small_experiment(tmp_path, **GRID)
    results = tmp_path / "results"
    shutil.copytree(reference, results, symlinks=True)
    expected = report_rows(config)
    (results / L.STORE_FILE).unlink()
    before = files_of(results)
    results.chmod(0o555)
    try:
        for args in (("report", "--format", "json"), ("plot", "--out", str(tmp_path / "plots"))):
            proc = subprocess.run(
                [*AS_UNPRIVILEGED, sys.executable, "-m", "matrixrl", *args, "-c", str(config)],
                capture_output=True, text=True, timeout=600,
            )
            assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
            if args[0] == "report":
                assert json.loads(proc.stdout) == expected
    finally:
        results.chmod(0o755)
    assert files_of(results) == before
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["curves-arith.png"]


def test_a_read_only_copy_of_a_results_folder_is_reported_and_plotted(experiment: Path, tmp_path: Path) -> None:
    """A copy (an archive, a shared copy) has new inodes, and its files new times unless the copy
    kept them: the store reads them again, into a temporary copy of itself when the folder is
    read-only, and reports what the original reports."""
    from test_cli_errors import ONE_CELL, write_cell

    from conftest import run_cli

    write_cell(experiment.parent / "results", steps=(0,))
    original = run_cli("report", "-c", experiment, *ONE_CELL, "--format", "json")
    assert original.exit_code == 0, original.output
    for name, copy_function in (("kept-times", shutil.copy2), ("new-times", shutil.copyfile)):
        copy = tmp_path / name
        shutil.copytree(experiment.parent, copy, copy_function=copy_function)
        with read_only(copy / "results"):
            before = files_of(copy / "results")
            result = run_cli("report", "-c", copy / "experiments.yaml", *ONE_CELL, "--format", "json")
            # The same words too: the cell's one checkpoint of five is noted as unfinished.
            assert (result.exit_code, result.stderr) == (0, original.stderr), result.output
            assert json.loads(result.stdout) == json.loads(original.stdout)
            plots = tmp_path / f"{name}-plots"
            plotted = run_cli("plot", "-c", copy / "experiments.yaml", *ONE_CELL, "--out", plots)
            assert plotted.exit_code == 0, plotted.output
            assert files_of(copy / "results") == before
        assert (plots / "curves-arith.png").is_file()


# Root's capabilities to read and write whatever the permissions say, dropped (util-linux's setpriv).
AS_UNPRIVILEGED = (
    "setpriv", "--inh-caps=-dac_override,-dac_read_search", "--bounding-set=-dac_override,-dac_read_search", "--",
)


@pytest.mark.slow
def test_a_read_only_results_folder_is_named_and_still_reported(reference: Path, tmp_path: Path) -> None:
    config = small_experiment(tmp_path, **GRID)
    results = tmp_path / "results"
    shutil.copytree(reference, results, symlinks=True)
    expected = report_rows(config)  # its summaries cached, as after any report
    before = files_of(results)
    with read_only(results):
        # More work (a new seed) in a folder that cannot take it: named, nothing started.
        proc = matrixrl("run", "-c", str(config), "--cores", "2", "--set", "grid.seed=[0, 1]")
        assert (proc.returncode, proc.stdout) == (1, ""), proc.stderr
        assert proc.stderr == f"Error: writing {results / L.RUN_LOCK_FILE}: {READ_ONLY}\n"  # the first write: the run's lock
        # Reading needs no write: the plan (from the result files alone) and the tables, as before.
        proc = matrixrl("plan", "-c", str(config))
        assert (proc.returncode, proc.stderr) == (0, "") and proc.stdout.endswith("Nothing to run.\n"), proc.stderr
        assert report_rows(config) == expected
    assert files_of(results) == before
    # Writable again, the new seed runs.
    proc = matrixrl("run", "-c", str(config), "--cores", "2", "--set", "grid.seed=[0, 1]")
    assert proc.returncode == 0, proc.stderr
