"""Grid expansion, cell ids, checkpoint steps and the specs that drive reruns."""

from matrixrl.config import load_config, science
from matrixrl.grid import Cell, cell_spec, cells, checkpoint_steps


def test_cells_cover_every_combination_in_axis_order(experiment):
    cfg = load_config(
        experiment,
        sets=["grid.workflow=[single]", "grid.policy=[shared]", "grid.seed=[0, 1]", "grid.scale=[tiny-s, tiny-m]"],
    )
    ids = [c.id for c in cells(cfg)]
    assert ids == [
        "single-arith-tiny-s-shared-s0",
        "single-arith-tiny-s-shared-s1",
        "single-arith-tiny-m-shared-s0",
        "single-arith-tiny-m-shared-s1",
        "single-pyfunc-tiny-s-shared-s0",
        "single-pyfunc-tiny-s-shared-s1",
        "single-pyfunc-tiny-m-shared-s0",
        "single-pyfunc-tiny-m-shared-s1",
    ]
    assert len(set(ids)) == len(ids)


def test_cell_id_is_readable_and_deterministic():
    cell = Cell("single", "arith", "tiny-s", "shared", 3)
    assert cell.id == "single-arith-tiny-s-shared-s3"
    assert cell.axes() == {"workflow": "single", "task": "arith", "scale": "tiny-s", "policy": "shared", "seed": 3}


def test_checkpoints_include_step_zero_and_the_last_step(experiment):
    assert checkpoint_steps(load_config(experiment, sets=["train.steps=4", "train.eval_every=2"]).train) == [0, 2, 4]
    assert checkpoint_steps(load_config(experiment, sets=["train.steps=7", "train.eval_every=3"]).train) == [0, 3, 6, 7]


def test_adding_a_seed_leaves_existing_cell_specs_unchanged(experiment):
    # Snakemake reruns a job when its params change; a cell's params are its spec.
    before = load_config(experiment, sets=["grid.seed=[0]"])
    after = load_config(experiment, sets=["grid.seed=[0, 1]", "grid.scale=[tiny-s, tiny-m]"])
    cell = Cell("single", "arith", "tiny-s", "shared", 0)
    assert cell_spec(before, cell) == cell_spec(after, cell)


def test_a_training_setting_changes_every_cell_spec(experiment):
    cell = Cell("single", "arith", "tiny-s", "shared", 0)
    a = cell_spec(load_config(experiment), cell)
    b = cell_spec(load_config(experiment, sets=["train.lr=0.01"]), cell)
    assert a != b


# --- what reruns what ---------------------------------------------------------------------

CELL = Cell("voting", "pyfunc", "tiny-s", "isolated", 0)


def params(config, cell=CELL) -> tuple[str, str, str]:
    """The digests behind the three things Snakemake and the trainer compare: the train
    job's params, the evaluate jobs' params, and the checkpoints' resume digest."""
    spec = cell_spec(config, cell)
    return spec.train_digest(), spec.eval_digest(), spec.resume_digest()


def test_runtime_settings_change_no_digest(experiment):
    from matrixrl.grid import base_spec

    plain = load_config(experiment)
    runtime = load_config(
        experiment, sets=["train.threads=4", "eval.batch_size=7", "tasks.pyfunc.workers=1", "scales.tiny-s.train={threads: 2}"]
    )
    assert params(plain) == params(runtime)
    assert science(base_spec(plain, "tiny-s")) == science(base_spec(runtime, "tiny-s"))
    # The jobs still get them: the full spec travels beside the params.
    spec = cell_spec(runtime, CELL)
    assert (spec.train.threads, spec.eval.batch_size, spec.task.workers) == (2, 7, 1)


def test_an_hf_scales_device_is_runtime_too(experiment):
    sets = ["scales.big={kind: hf, path: Qwen/Qwen3-0.6B}", "grid.scale=[big]"]
    cell = Cell("single", "arith", "big", "shared", 0)
    assert params(load_config(experiment, sets=sets), cell) == params(load_config(experiment, sets=[*sets, "scales.big.device=cpu"]), cell)


def test_evaluation_settings_rerun_evaluations_but_not_training(experiment):
    plain = params(load_config(experiment))
    for setting in ("eval.temperature=0.5", "eval.samples=3", "eval.max_new_tokens=6"):
        train, evaluate, resume = params(load_config(experiment, sets=[setting]))
        assert train == plain[0] and resume == plain[2] and evaluate != plain[1], setting


def test_more_steps_keep_the_resume_digest_and_other_settings_change_it(experiment):
    plain = params(load_config(experiment))
    train, _, resume = params(load_config(experiment, sets=["train.steps=80"]))
    assert resume == plain[2] and train != plain[0]
    for setting in ("train.lr=3e-4", "train.ppo_epochs=2", "train.eval_every=5", "scales.tiny-s.warmstart.steps=10"):
        assert params(load_config(experiment, sets=[setting]))[2] != plain[2], setting


def test_a_scales_own_training_settings_apply_to_its_cells_only(experiment):
    config = load_config(experiment, sets=["train.lr=1e-4", "scales.tiny-m.train={lr: 5.0e-5, steps: 60}"])
    assert cell_spec(config, Cell("single", "arith", "tiny-m", "shared", 0)).train.lr == 5e-5
    assert cell_spec(config, Cell("single", "arith", "tiny-m", "shared", 0)).train.steps == 60
    assert cell_spec(config, Cell("single", "arith", "tiny-s", "shared", 0)).train.lr == 1e-4
    assert checkpoint_steps(config.train_for("tiny-m"))[-1] == 60
    # Moving a value from train: to the scale's train: changes nothing a result depends on.
    moved = load_config(experiment, sets=["train.lr=5e-5", "scales.tiny-s.train={lr: 1.0e-4}", "scales.tiny-m.train={steps: 60}"])
    for scale in ("tiny-s", "tiny-m"):
        cell = Cell("single", "arith", scale, "shared", 0)
        assert params(config, cell) == params(moved, cell)


def test_scales_that_differ_only_in_training_settings_share_one_base_model(experiment):
    from matrixrl.grid import base_scale, base_scales

    config = load_config(
        experiment,
        sets=[
            "scales.tiny-s-slow={kind: tiny, hidden_size: 128, num_layers: 2, num_heads: 4, num_kv_heads: 2, "
            "intermediate_size: 256, max_length: 56, warmstart: {steps: 400, batch_size: 64, lr: 3.0e-3, seed: 0}, "
            "train: {lr: 1.0e-5}}",
            "grid.scale=[tiny-s-slow, tiny-s, tiny-m]",
        ],
    )
    assert base_scale(config, "tiny-s-slow") == "tiny-s" and base_scales(config) == ["tiny-s", "tiny-m"]
    slow, plain = (cell_spec(config, Cell("single", "arith", s, "shared", 0)) for s in ("tiny-s-slow", "tiny-s"))
    assert slow.base == plain.base and slow.train.lr == 1e-5
    other = load_config(experiment, sets=["scales.tiny-s.warmstart.steps=10"])
    assert cell_spec(other, Cell("single", "arith", "tiny-s", "shared", 0)).base != plain.base


def test_a_one_role_workflow_runs_once_for_both_policy_modes(experiment):
    from matrixrl.grid import run_ids, runs

    config = load_config(experiment, sets=["grid.task=[arith]", "grid.scale=[tiny-s]"])
    ids = run_ids(config)
    assert ids["single-arith-tiny-s-isolated-s0"] == "single-arith-tiny-s-shared-s0"
    assert all(cell == run for cell, run in ids.items() if not cell.startswith("single-"))
    assert [c.id for c in runs(config)] == [
        "single-arith-tiny-s-shared-s0",
        "voting-arith-tiny-s-shared-s0", "voting-arith-tiny-s-isolated-s0",
        "eval_opt-arith-tiny-s-shared-s0", "eval_opt-arith-tiny-s-isolated-s0",
        "orch_workers-arith-tiny-s-shared-s0", "orch_workers-arith-tiny-s-isolated-s0",
    ]  # fmt: skip
    only_isolated = load_config(experiment, sets=["grid.task=[arith]", "grid.scale=[tiny-s]", "grid.policy=[isolated]"])
    assert runs(only_isolated)[0].id == "single-arith-tiny-s-shared-s0"
