"""The trainer on a tiny model: parameters move, reward rises on an easy task."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file

from matrixrl.config import load_config
from matrixrl.grid import Cell, base_spec, cell_spec
from matrixrl.jobs.prepare_base import prepare_base
from matrixrl.layout import checkpoint_dir
from matrixrl.train.trainer import train_cell

pytestmark = pytest.mark.slow

EASY = [
    # One-digit, two-term sums: the warm-start shape itself, so the base model is
    # partly right and GRPO has a clear signal to follow.
    "tasks.arith.terms=2",
    "tasks.arith.n_eval=40",
    "tasks.arith.warmstart_hard_fraction=1.0",
    "scales.tiny-s.warmstart.steps=60",
    "train.steps=60",
    "train.eval_every=60",
    "train.lr=0.001",
    "train.problems_per_step=16",
    "train.group_size=8",
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, request):
    folder = tmp_path_factory.mktemp("trainer")
    config_path = folder / "experiments.yaml"
    raw = yaml.safe_load((request.config.rootpath / "experiments.yaml").read_text())
    raw["tasks"] = {"arith": raw["tasks"]["arith"]}  # the warm-start teaches arith alone
    raw["grid"]["task"] = ["arith"]
    config_path.write_text(yaml.safe_dump(raw))
    cfg = load_config(config_path, sets=EASY)
    base = folder / "base"
    prepare_base(base_spec(cfg, "tiny-s"), base / "model", base / "base.json", log=lambda m: None)
    spec = cell_spec(cfg, Cell("single", "arith", "tiny-s", "shared", 0))
    result = train_cell(spec, base / "model", folder / "cell", log=lambda m: None)
    return base / "model", folder / "cell", result


def test_parameters_change(trained):
    base, cell, _ = trained
    before = load_file(base / "model.safetensors")
    after = load_file(checkpoint_dir(cell, 60) / "shared" / "model.safetensors")
    assert before.keys() == after.keys()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) == len(before), f"unchanged tensors: {set(before) - set(changed)}"
    step0 = load_file(checkpoint_dir(cell, 0) / "shared" / "model.safetensors")
    assert all(torch.equal(before[k], step0[k]) for k in before), "step 0 must be the base model"


def test_reward_rises_on_an_easy_task(trained):
    _, _, result = trained
    rewards = [m["reward_mean"] for m in result["metrics"]]
    assert len(rewards) == 60
    first, last = np.mean(rewards[:10]), np.mean(rewards[-10:])
    assert 0.05 < first < 0.95, f"the base model should be partly right, got {first:.2f}"
    # Measured here: 0.21 → 0.38; 0.08 is well above the ~0.03 noise of a 10-step mean.
    assert last > first + 0.08, f"reward did not rise: first ten {first:.3f}, last ten {last:.3f}"


def test_metrics_are_recorded_for_every_step(trained):
    _, _, result = trained
    for i, row in enumerate(result["metrics"], start=1):
        assert row["step"] == i
        assert row["grad_norm"] > 0 and np.isfinite(row["loss"])
        assert row["entropy"] > 0 and row["response_length"] >= 1


def test_a_training_whose_numbers_stop_being_numbers_fails_with_one_line(tmp_path, request):
    """A NaN in the model reaches the step's metrics; no result file could hold them, so
    the job stops with the cell, the step and the fix, and writes no checkpoint past step 0."""
    from safetensors.torch import save_file

    from matrixrl.errors import DivergedError

    config_path = tmp_path / "experiments.yaml"
    config_path.write_text((request.config.rootpath / "experiments.yaml").read_text())
    cfg = load_config(config_path, sets=["scales.tiny-s.warmstart.steps=5", "train.steps=2", "train.eval_every=2"])
    base = tmp_path / "base"
    prepare_base(base_spec(cfg, "tiny-s"), base / "model", base / "base.json", log=lambda m: None)
    weights = load_file(base / "model" / "model.safetensors")
    name = next(k for k in weights if "layers.1.mlp.down_proj" in k)
    weights[name][0, 0] = float("nan")
    save_file(weights, base / "model" / "model.safetensors", metadata={"format": "pt"})
    cell = Cell("single", "arith", "tiny-s", "shared", 0)
    with pytest.raises(DivergedError) as caught:
        train_cell(cell_spec(cfg, cell), base / "model", tmp_path / "cell", log=lambda m: None)
    assert str(caught.value).startswith(f"{cell.id}: training diverged at step 1: ")
    assert str(caught.value).endswith("is nan; lower train.lr (docs/lr-sweep.md) or train.max_grad_norm, or check that the model's weights are finite")
    assert sorted(p.name for p in (tmp_path / "cell" / "checkpoints").iterdir()) == ["step_0"]


def test_an_updates_role_rows_are_train_jsons_in_its_order():
    """The trainer stores an update's per-role figures as these rows: entropy of every role, then
    each measured figure by kind (kl, the log-probability gap, the damper, the last pass's share)."""
    from matrixrl.train.update import RoleUpdate, Update

    roles = {
        "generator": RoleUpdate(entropy_sum=3.0, tokens=6, kl=[0.5, 5], gap=[0.2, 0.1, 4], damper=(0.4, 0.9)),
        "aggregator": RoleUpdate(entropy_sum=1.0, tokens=0, gap=[0.0, 0.0, 0], last_pass_share=0.25),
    }
    rows = [(r["role"], r["metric"], r["value"]) for r in Update({}, roles).role_rows(7)]
    assert rows == [
        ("generator", "entropy", 0.5), ("aggregator", "entropy", 1.0), ("generator", "kl", 0.1),
        ("generator", "logp_gap_mean", 0.05), ("generator", "logp_gap_max", 0.1),
        ("generator", "damper_cos", 0.4), ("generator", "damper_scale", 0.9), ("aggregator", "last_pass_share", 0.25),
    ]  # fmt: skip
    assert {r["step"] for r in Update({}, roles).role_rows(7)} == {7}
    assert Update({}, roles).by_role("kl") == {"generator": 0.1}
