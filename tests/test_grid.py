"""Grid expansion, cell ids, checkpoint steps and the specs that drive reruns."""

from matrixrl.config import load_config
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
