"""A cell's checkpoints on disk: saving one, where a training resumes, and removing one.

A ``step_N`` counts only with its ``COMPLETE`` marker. No torch at import.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Callable

from matrixrl import atomic
from matrixrl.errors import disk_errors_named
from matrixrl.layout import checkpoint_dir, checkpoints_dir

COMPLETE = "COMPLETE"
STATE_FILE = "trainer_state.pt"
"""A checkpoint's training state beside the weights: step, optimizers, RNG, the logs so far."""
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
    """Remove the checkpoint of ``step`` (renamed out first, so a kill leaves no partial ``step_N``); returns
    the bytes it held."""
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


def resume_point(
    cell_dir: Path, digest: str, steps: int, log: Callable[[str], None], evaluated: Sequence[int] = (),
    exact: bool = True,
) -> int | None:
    """Where training of ``cell_dir`` resumes, or None to start afresh; stale checkpoints and leftovers are
    removed.

    A missing evaluated step is rebuilt by replaying; ``exact``: whether a replay gives the same weights.
    """
    folder = checkpoints_dir(cell_dir)
    leftovers = sorted(p.name for p in folder.glob("*") if not is_step_dir(p.name)) if folder.is_dir() else []
    if leftovers:
        log(f"removing {', '.join(leftovers)} from {folder}: unfinished writes or removals of a stopped run")
        finish_removals(cell_dir)
        for name in leftovers:  # none is a checkpoint's name: nothing resumes from them
            path = folder / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
    stale = sorted(step for step, written_under in complete_checkpoints(cell_dir).items() if written_under != digest)
    if stale:
        log(
            f"checkpoints at steps {', '.join(map(str, stale))} were written under other training settings; "
            "removing them"
        )
        for step in stale:
            remove_checkpoint(cell_dir, step)
    up_to = steps
    latest = latest_checkpoint(cell_dir, digest, up_to=steps)
    present = complete_checkpoints(cell_dir)
    missing = [s for s in evaluated if latest is not None and s < latest and s not in present]
    if missing:
        up_to = min(missing) - 1
        log(f"the checkpoint of step {min(missing)} is missing; rebuilding it")
    start = latest_checkpoint(cell_dir, digest, up_to=up_to) if up_to >= 0 else None
    later = sorted(step for step in present if start is not None and step > start)
    if missing and not exact and later:
        log(
            f"replaying from step {start} on a device whose kernels are not deterministic: the checkpoints at steps "
            f"{', '.join(map(str, later))} belong to the path being replaced; removing them"
        )
        for step in later:
            remove_checkpoint(cell_dir, step)
    return start


def save_checkpoint(
    cell_dir: Path, step: int, policy, optimizers: dict, logs: dict[str, list[dict]], digest: str
) -> None:
    """Write the checkpoint of ``step`` (the policy's weights, :data:`STATE_FILE`, ``COMPLETE``
    with ``digest``) to a temporary folder, then rename: a kill never leaves a half checkpoint,
    and a full disk leaves none (a :class:`DiskError` naming the checkpoint)."""
    import torch  # loaded by the trainer that calls this

    folder = checkpoint_dir(cell_dir, step)
    with disk_errors_named(folder, f"the checkpoint of step {step} to"), atomic.replaced_dir(folder) as tmp:
        policy.save(tmp)
        torch.save(
            {
                "step": step,
                "optimizers": {name: opt.state_dict() for name, opt in optimizers.items()},
                "torch_rng": torch.get_rng_state(),
                **logs,  # per-step metrics so far: a resumed run continues the same lists
            },
            tmp / STATE_FILE,
        )
        (tmp / COMPLETE).write_text(json.dumps({"step": step, "resume_digest": digest}))
