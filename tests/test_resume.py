"""Which checkpoints may seed a resume, and runs that are one computation.

A checkpoint records the digest of the training settings it was written under: a
changed setting trains the cell afresh, more steps continue it, and a one-role
workflow is the same computation under both policy modes.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from matrixrl.config import load_config
from matrixrl.grid import Cell, base_spec, cell_spec
from matrixrl.jobs.prepare_base import prepare_base
from matrixrl.layout import checkpoint_dir
from matrixrl.train.checkpoints import COMPLETE, complete_checkpoints, latest_checkpoint
from matrixrl.train.trainer import train_cell

from conftest import EXPERIMENTS

SMALL = [
    "scales.tiny-s.warmstart.steps=20",
    "train.steps=6",
    "train.eval_every=2",
    "train.problems_per_step=4",
    "train.group_size=4",
    "tasks.arith.n_eval=16",
]
CELL = Cell("single", "arith", "tiny-s", "shared", 0)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A one-task config and its warm-started tiny-s base model."""
    folder = tmp_path_factory.mktemp("resume")
    raw = yaml.safe_load(EXPERIMENTS.read_text())
    raw["tasks"] = {"arith": raw["tasks"]["arith"]}
    raw["grid"].update(task=["arith"], scale=["tiny-s"])
    path = folder / "experiments.yaml"
    path.write_text(yaml.safe_dump(raw))
    config = lambda *sets: load_config(path, sets=[*SMALL, *sets])  # noqa: E731
    base = folder / "base"
    prepare_base(base_spec(config(), "tiny-s"), base / "model", base / "base.json", log=lambda m: None)
    return config, base / "model", folder


def train(study, cell_dir: Path, *sets: str, cell: Cell = CELL) -> tuple[dict, list[str]]:
    config, base, _ = study
    lines: list[str] = []
    result = train_cell(cell_spec(config(*sets), cell), base, cell_dir, log=lines.append)
    return result, lines


def curve(result: dict) -> list[tuple]:
    """Per-step metrics without wall-clock time."""
    return [tuple(v for k, v in row.items() if k != "seconds") for row in result["metrics"]]


def weights(folder: Path) -> dict[str, torch.Tensor]:
    """A one-set checkpoint's trained tensors: the whole model, or the LoRA adapter."""
    (file,) = [*folder.glob("*/model.safetensors"), *folder.glob("lora/*/adapter_model.safetensors")]
    return load_file(file)


def test_a_changed_training_setting_retrains_the_cell_from_step_0(study, tmp_path):
    first, _ = train(study, tmp_path / "cell")
    again, lines = train(study, tmp_path / "cell", "train.lr=3.0e-4")
    assert not any("resuming" in line for line in lines), lines
    assert lines[0] == "checkpoints at steps 0, 2, 4, 6 were written under other training settings; removing them"
    assert [row["step"] for row in again["metrics"]] == [1, 2, 3, 4, 5, 6]
    # Step 1 samples from the same base model; from step 2 on the other rate shows.
    assert curve(again)[0] == curve(first)[0] and curve(again)[1:] != curve(first)[1:]
    fresh, _ = train(study, tmp_path / "fresh", "train.lr=3.0e-4")
    assert curve(fresh) == curve(again)
    # Only the new training's checkpoints are left, each under its digest.
    digest = cell_spec(study[0]("train.lr=3.0e-4"), CELL).resume_digest()
    assert complete_checkpoints(tmp_path / "cell") == {step: digest for step in (0, 2, 4, 6)}


def test_more_steps_continue_and_match_an_uninterrupted_longer_run(study, tmp_path):
    short, _ = train(study, tmp_path / "extended")
    extended, lines = train(study, tmp_path / "extended", "train.steps=10")
    assert lines[0] == f"resuming {CELL.id} from its checkpoint at step 6"
    assert not any("removing" in line for line in lines)
    uninterrupted, _ = train(study, tmp_path / "uninterrupted", "train.steps=10")
    assert curve(extended) == curve(uninterrupted) and curve(extended)[:6] == curve(short)
    a, b = weights(checkpoint_dir(tmp_path / "extended", 10)), weights(checkpoint_dir(tmp_path / "uninterrupted", 10))
    assert all(torch.equal(a[k], b[k]) for k in a)
    # Fewer steps than trained: the run ends at a checkpoint it has, nothing retrained or removed.
    fewer, lines = train(study, tmp_path / "extended", "train.steps=4")
    assert lines == [f"resuming {CELL.id} from its checkpoint at step 4"] and curve(fewer) == curve(short)[:4]
    assert sorted(complete_checkpoints(tmp_path / "extended")) == [0, 2, 4, 6, 8, 10]


def test_only_complete_checkpoints_of_these_settings_count(study, tmp_path):
    cell_dir = tmp_path / "cell"
    train(study, cell_dir)
    digest = cell_spec(study[0](), CELL).resume_digest()
    # A kill just before the final rename leaves step_N.tmp holding its marker.
    shutil.copytree(checkpoint_dir(cell_dir, 6), cell_dir / "checkpoints" / "step_8.tmp")
    # A checkpoint from before digests were recorded: its marker is the bare step.
    shutil.copytree(checkpoint_dir(cell_dir, 6), checkpoint_dir(cell_dir, 7))
    (checkpoint_dir(cell_dir, 7) / COMPLETE).write_text("7")
    assert latest_checkpoint(cell_dir) == 7
    assert latest_checkpoint(cell_dir, digest) == 6
    _, lines = train(study, cell_dir, "train.steps=8")
    assert lines[:3] == [
        f"removing step_8.tmp from {cell_dir / 'checkpoints'}: unfinished writes or removals of a stopped run",
        "checkpoints at steps 7 were written under other training settings; removing them",
        f"resuming {CELL.id} from its checkpoint at step 6",
    ]
    assert not (cell_dir / "checkpoints" / "step_8.tmp").exists()


def test_a_deleted_evaluated_checkpoint_is_rebuilt_bit_for_bit(study, tmp_path):
    """An evaluation that must be recomputed needs its checkpoint: training replays up to it."""
    cell_dir = tmp_path / "cell"
    first, _ = train(study, cell_dir)
    before = weights(checkpoint_dir(cell_dir, 4))
    shutil.rmtree(checkpoint_dir(cell_dir, 4))
    again, lines = train(study, cell_dir)
    assert lines[:2] == [
        "the checkpoint of step 4 is missing; rebuilding it",
        f"resuming {CELL.id} from its checkpoint at step 2",
    ]
    after = weights(checkpoint_dir(cell_dir, 4))
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert curve(again) == curve(first)


def test_a_one_role_workflow_is_the_same_computation_under_both_modes(study, tmp_path):
    """Why grid.run_of computes single's isolated cell as its shared cell."""
    isolated = Cell("single", "arith", "tiny-s", "isolated", 0)
    for adapter in ("full", "lora"):
        a, _ = train(study, tmp_path / f"shared-{adapter}", f"policies.adapter={adapter}")
        b, _ = train(study, tmp_path / f"isolated-{adapter}", f"policies.adapter={adapter}", cell=isolated)
        assert curve(a) == curve(b), adapter
        wa, wb = weights(checkpoint_dir(tmp_path / f"shared-{adapter}", 6)), weights(checkpoint_dir(tmp_path / f"isolated-{adapter}", 6))
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa), adapter


def fake_checkpoint(cell_dir: Path, step: int, digest: str) -> None:
    import json

    from matrixrl.train.checkpoints import STATE_FILE

    folder = checkpoint_dir(cell_dir, step)
    folder.mkdir(parents=True)
    for name in ("model.safetensors", STATE_FILE):
        (folder / name).write_bytes(b"x" * 64)
    (folder / COMPLETE).write_text(json.dumps({"step": step, "resume_digest": digest}))


@pytest.mark.parametrize("why", ["other settings", "a replay on a device that is not exact"])
def test_a_removal_killed_midway_leaves_no_complete_checkpoint_missing_files(tmp_path, monkeypatch, why):
    """resume_point removes checkpoints (stale ones; those after a replay's start) through the
    rename-then-delete path: a kill during a deletion leaves a ``step_N.deleting``, never a
    ``step_N`` with its ``COMPLETE`` marker and part of its files; the next resume ends it."""
    from matrixrl.train.checkpoints import resume_point

    cell_dir = tmp_path / "cell"
    written_under = "old" if why == "other settings" else "now"
    for step in (0, 20, 30):  # the checkpoint of step 10 is gone: a replay rebuilds it
        fake_checkpoint(cell_dir, step, written_under)
    whole = {p.name for p in checkpoint_dir(cell_dir, 0).iterdir()}
    real_rmtree = shutil.rmtree

    def killed_after_one_file(path, *args, **kwargs):
        next(p for p in sorted(Path(path).iterdir()) if p.name != COMPLETE).unlink()
        raise KeyboardInterrupt("killed mid-delete")

    monkeypatch.setattr(shutil, "rmtree", killed_after_one_file)
    with pytest.raises(KeyboardInterrupt):
        resume_point(cell_dir, "now", 30, lambda line: None, evaluated=[0, 10, 20, 30], exact=False)
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)
    for step in complete_checkpoints(cell_dir):  # what a resume may read: every step_N with COMPLETE
        assert {p.name for p in checkpoint_dir(cell_dir, step).iterdir()} == whole, step
    assert any(p.name.endswith(".deleting") for p in checkpoint_dir(cell_dir, 0).parent.iterdir())  # struck mid-delete

    lines: list[str] = []
    start = resume_point(cell_dir, "now", 30, lines.append, evaluated=[0, 10, 20, 30], exact=False)
    assert not any(p.name.endswith(".deleting") for p in checkpoint_dir(cell_dir, 0).parent.iterdir())
    assert start == (None if why == "other settings" else 0)
    assert sorted(complete_checkpoints(cell_dir)) == ([] if why == "other settings" else [0])
