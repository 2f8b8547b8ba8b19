"""A cell's checkpoint folders on disk: which are complete, and how one is removed.

A checkpoint ``checkpoints/step_N/`` counts only once its ``COMPLETE`` marker is
there: the trainer writes it under ``step_N.tmp`` and renames it into place
(``trainer.save_checkpoint``). Removing one goes the other way round: the folder
is renamed out of the ``step_N`` names first, atomically, then deleted, so a kill
mid-delete never leaves a ``step_N`` that holds part of a checkpoint.

No torch here: the retention job runs inside Snakemake's process.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from matrixrl.layout import checkpoint_dir, checkpoints_dir

COMPLETE = "COMPLETE"
DELETING = ".deleting"
"""Suffix of a checkpoint folder being removed (``step_N.deleting``): never resumed from."""

_STEP_DIR = re.compile(r"step_(\d+)")


def is_step_dir(name: str) -> bool:
    """Whether ``name`` is a checkpoint's own name (``step_N``), not a leftover (``step_N.tmp``, ``step_N.deleting``)."""
    return _STEP_DIR.fullmatch(name) is not None


def checkpoint_digest(folder: Path) -> str | None:
    """The resume digest a complete checkpoint was written under (None: incomplete, or
    written before checkpoints recorded one)."""
    try:
        marker = json.loads((folder / COMPLETE).read_text())
    except (OSError, ValueError):
        return None
    return marker.get("resume_digest") if isinstance(marker, dict) else None


def complete_checkpoints(cell_dir: Path) -> dict[int, str | None]:
    """Step → resume digest of every checkpoint folder (``step_N``) that was written completely."""
    found = {}
    for folder in checkpoints_dir(cell_dir).glob("step_*"):
        match = _STEP_DIR.fullmatch(folder.name)  # not step_N.tmp, a write a kill interrupted
        if match and (folder / COMPLETE).exists():
            found[int(match.group(1))] = checkpoint_digest(folder)
    return found


def latest_checkpoint(cell_dir: Path, digest: str | None = None, up_to: int | None = None) -> int | None:
    """The newest complete checkpoint, or (``digest``) the newest written under that
    resume digest, at most ``up_to`` steps in."""
    steps = [
        step
        for step, written_under in complete_checkpoints(cell_dir).items()
        if (digest is None or written_under == digest) and (up_to is None or step <= up_to)
    ]
    return max(steps, default=None)


def folder_bytes(folder: Path) -> int:
    """The size of every file under ``folder`` (0 if it is gone)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                pass
    return total


def remove_checkpoint(cell_dir: Path, step: int) -> int:
    """Remove the checkpoint of ``step``; returns the bytes it held.

    The rename out of ``step_N`` is the atomic part: before it the checkpoint is whole,
    after it no ``step_N`` exists; a kill during the deletion that follows leaves a
    ``step_N.deleting`` that :func:`finish_removals` (or the trainer's clean-up) ends.
    """
    folder = checkpoint_dir(cell_dir, step)
    doomed = folder.with_name(folder.name + DELETING)
    size = folder_bytes(folder)
    if doomed.exists():  # a removal of an earlier checkpoint of this step a kill interrupted
        shutil.rmtree(doomed)
    os.replace(folder, doomed)
    shutil.rmtree(doomed)
    return size


def finish_removals(cell_dir: Path) -> dict[int, int]:
    """End the removals a kill interrupted (``step_N.deleting``): step → the bytes they still held."""
    finished = {}
    for path in sorted(checkpoints_dir(cell_dir).glob(f"step_*{DELETING}")):
        match = _STEP_DIR.fullmatch(path.name.removesuffix(DELETING))
        if match:
            finished[int(match.group(1))] = folder_bytes(path)
            shutil.rmtree(path)
    return finished
