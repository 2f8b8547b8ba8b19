"""Extra grid axes: any setting by its dotted key, checked like --set, incremental like the fixed axes.

Validation (exact messages), cell expansion and ids, what an axis does not multiply,
--only and --set on an extra axis, the report's columns, grouping and
``compare --against`` on a constructed store (checked by hand), a plot with one line
per value, and real Snakemake runs: a new value runs only its cells, and a new axis
holding the file's own value recomputes nothing.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from conftest import copy_of, run_cli
from matrixrl import grid as G
from matrixrl import layout as L
from matrixrl.config import load_config
from matrixrl.errors import ConfigError
from matrixrl.report import plots
from matrixrl.report.tables import build_tables, parse_against
from matrixrl.store import ingest
from test_cli_errors import assert_user_error
from test_store_faults import eval_file, train_file

LR = "grid.train.lr=[1.0e-4, 5.0e-5]"
VOTES = "grid.workflows.voting.n_votes=[3, 5]"


def config_of(experiment: Path, *sets: str, only=()):
    return load_config(experiment, sets=list(sets), only=list(only))


def error_of(experiment: Path, *sets: str, only=()) -> str:
    with pytest.raises(ConfigError) as caught:
        config_of(experiment, *sets, only=only)
    return str(caught.value)


# --- validation ----------------------------------------------------------------------------

BAD = [
    ("grid.train.lr=[1.0e-4, -1]", "grid.train.lr: must be greater than 0 (got -1)"),
    ("grid.train.lr=[1.0e-4, fast]", "grid.train.lr: expected a number (got 'fast')"),
    ("grid.train.lr=1.0e-4", "grid.train.lr: expected a non-empty list of values, e.g. train.lr: [a, b]"),
    ("grid.train.lr=[]", "grid.train.lr: expected a non-empty list of values, e.g. train.lr: [a, b]"),
    (
        "grid.train.lr=[1.0e-4, 0.0001]",
        "grid.train.lr: 0.0001 is listed more than once (as another spelling, maybe); list each value once",
    ),
    ("grid.train.stepz=[1, 2]", "grid.train.stepz: unknown key; did you mean steps?"),
    (
        "grid.train.colour=[1, 2]",
        "grid.train.colour: unknown key; valid keys here: steps, eval_every, checkpoint_every, keep_checkpoints, problems_per_step, "
        "group_size, lr, ppo_epochs, temperature, max_new_tokens, epsilon_low, epsilon_high, scale_rewards, reward, "
        "max_grad_norm, threads, micro_batch_tokens, rollout_batch_size, kl_beta, kl_beta_roles, use_bias_correction_kl, damper, damper_roles, damper_window, advantage_group, "
        "loss_type, importance_sampling_level, sapo_temperature_pos, sapo_temperature_neg, vespo_k_pos, vespo_lambda_pos, "
        "vespo_k_neg, vespo_lambda_neg",
    ),
    ("grid.trian.lr=[1.0e-4, 5.0e-5]", "grid.trian.lr: unknown section 'trian'; did you mean train?"),
    (
        "grid.colour.lr=[1.0e-4, 5.0e-5]",
        "grid.colour.lr: unknown section 'colour'; use one of: train, eval, policies, workflows, tasks, scales, prompts, memory",
    ),
    (
        "grid.train.threads=[1, 2]",
        "grid.train.threads: a runtime setting (it changes no result), so it cannot be an axis; "
        "set it with --set train.threads=VALUE",
    ),
    (
        "grid.analysis.cliff_delta=[0.1, 0.2]",
        "grid.analysis.cliff_delta: analysis settings are the report's thresholds, not part of what a cell "
        "computes, so they cannot be an axis; try each value with --set analysis.cliff_delta=VALUE (it reruns only analyse)",
    ),

    (
        "grid.scales.tiny-s.num_layers=[2, 3]",
        "grid.scales.tiny-s.num_layers: a scale's definition chooses its base model, so it cannot be an axis; "
        "define a second scale under scales: and list both in grid.scale (a scale's train: settings can be swept)",
    ),
    (
        "grid.train.lr.value=[1, 2]",
        "grid.train.lr.value: train.lr is a single value, not a section, so it has no key 'value'",
    ),
]


@pytest.mark.parametrize("assignment, message", BAD, ids=[m.split(":")[0] + f"-{i}" for i, (_, m) in enumerate(BAD)])
def test_a_bad_axis_is_one_line_naming_it(experiment: Path, assignment: str, message: str) -> None:
    assert error_of(experiment, assignment) == f"{experiment} with --set {assignment!r}: {message}"  # the file may be right


def test_the_same_message_through_the_cli_and_nothing_is_written(experiment: Path) -> None:
    for command in ("plan", "run", "report"):
        assert_user_error(
            run_cli(command, "-c", experiment, "--set", "grid.train.lr=[1.0e-4, -1]"),
            f"{experiment} with --set 'grid.train.lr=[1.0e-4, -1]': grid.train.lr: must be greater than 0 (got -1)",
        )
    assert not (experiment.parent / "results").exists()


def test_an_axis_written_in_the_file_is_checked_the_same(experiment: Path) -> None:
    raw = yaml.safe_load(experiment.read_text())
    raw["grid"]["eval.temperature"] = [0.7, -0.5]
    experiment.write_text(yaml.safe_dump(raw))
    assert error_of(experiment) == f"{experiment}: grid.eval.temperature: must be greater than or equal to 0 (got -0.5)"


def test_only_names_an_extra_axis_the_grid_has(experiment: Path) -> None:
    assert error_of(experiment, only=["train.lr=1e-4"]) == (
        "--only 'train.lr=1e-4': train.lr is not an axis of this grid; "
        "--only narrows the grid, use --set grid.train.lr=[...] to make it one"
    )
    with pytest.raises(ConfigError) as caught:
        config_of(experiment, LR, only=["train.lr=3e-4"])
    assert str(caught.value) == (
        "--only 'train.lr=3e-4': 3e-4 not in grid.train.lr [0.0001, 5e-05]; "
        "--only narrows the grid, use --set grid.train.lr=[...] to change it"
    )


# --- cells and ids -------------------------------------------------------------------------


def test_values_are_validated_to_one_spelling(experiment: Path) -> None:
    config = config_of(experiment, "grid.train.lr=[1e-4, 5e-5]")  # YAML reads 1e-4 as a string
    assert config.grid.sweeps == {"train.lr": [0.0001, 5e-05]}


def test_an_axis_multiplies_the_cells_it_changes_and_ids_show_values_other_than_the_files(experiment: Path) -> None:
    plain = G.cells(config_of(experiment))
    swept = G.cells(config_of(experiment, LR, VOTES))
    voting = [c for c in plain if c.workflow == "voting"]
    # train.lr changes every cell; n_votes only voting's
    assert len(swept) == 2 * len(plain) + 2 * len(voting)
    assert len({c.id for c in swept}) == len(swept)
    ids = {c.id for c in swept}
    assert {"single-arith-tiny-s-shared-s0", "single-arith-tiny-s-shared-s0-lr=5e-05"} <= ids
    assert {
        "voting-arith-tiny-s-shared-s0",
        "voting-arith-tiny-s-shared-s0-n_votes=5",
        "voting-arith-tiny-s-shared-s0-lr=5e-05",
        "voting-arith-tiny-s-shared-s0-lr=5e-05-n_votes=5",
    } <= ids
    assert not any("n_votes" in c.id for c in swept if c.workflow != "voting")
    single = next(c for c in swept if c.id == "single-arith-tiny-s-shared-s0-lr=5e-05")
    assert single.sweep_values() == {"train.lr": 5e-05}
    assert all(re.fullmatch(r"[A-Za-z0-9_.=+-]+", c.id) for c in swept)


def test_a_swept_value_is_in_the_cells_spec(experiment: Path) -> None:
    config = config_of(experiment, LR, VOTES)
    by_id = {c.id: c for c in G.cells(config)}
    spec = G.cell_spec(config, by_id["voting-arith-tiny-s-shared-s0-lr=5e-05-n_votes=5"])
    assert (spec.train.lr, spec.workflow["n_votes"]) == (5e-05, 5)
    # ... and the base model stays the file's: an extra axis never re-prepares one
    assert spec.base == G.cell_spec(config, by_id["voting-arith-tiny-s-shared-s0"]).base


def test_a_setting_a_cell_does_not_read_does_not_multiply_it(experiment: Path) -> None:
    # The compact prompt style (the tiny scales) reads no prompts: settings: nothing to sweep there.
    plain = G.cells(config_of(experiment))
    assert G.cells(config_of(experiment, "grid.prompts.quote_chars=[200, 400]")) == plain


def test_a_new_axis_holding_the_files_value_keeps_every_existing_id_and_digest(experiment: Path) -> None:
    before = config_of(experiment)
    after = config_of(experiment, "grid.train.lr=[1.0e-4, 2.0e-4]", "grid.workflows.voting.n_votes=[3, 5]")
    digests = {c.id: G.cell_spec(before, c).eval_digest() for c in G.cells(before)}
    kept = {c.id: G.cell_spec(after, c).eval_digest() for c in G.cells(after) if c.id in digests}
    assert kept == digests


def test_keys_with_the_same_last_part_are_told_apart(experiment: Path) -> None:
    config = config_of(experiment, "grid.train.lr=[1.0e-4, 2.0e-4]", "grid.workflows.voting.n_votes=[3, 5]", "grid.eval.samples=[2, 4]")
    ids = {c.id for c in G.cells(config)}
    assert "voting-arith-tiny-s-shared-s0-lr=0.0002-n_votes=5-samples=4" in ids
    config = config_of(experiment, "grid.train.lr=[1.0e-4, 2.0e-4]", "grid.scales.tiny-s.train.lr=[1.0e-4, 3.0e-4]")
    ids = {c.id for c in G.cells(config)}
    assert {"single-arith-tiny-m-shared-s0-train.lr=0.0002", "single-arith-tiny-s-shared-s0-tiny-s.train.lr=0.0003"} <= ids


def test_an_axis_that_another_overrides_adds_no_cell(experiment: Path) -> None:
    # A scale's own rate overrides train.lr, so for tiny-s the two axes are one: 2 cells, not 4
    # (tiny-s at 1e-4 is the file's own cell), under any --only of either axis.
    sets = ("grid.train.lr=[1.0e-4, 2.0e-4]", "grid.scales.tiny-s.train.lr=[1.0e-4, 3.0e-4]")
    only = ["workflow=single", "task=arith", "policy=shared"]
    cells = {c.id: c for c in G.cells(config_of(experiment, *sets, only=only))}
    assert set(cells) == {
        "single-arith-tiny-s-shared-s0",
        "single-arith-tiny-s-shared-s0-tiny-s.train.lr=0.0003",
        "single-arith-tiny-m-shared-s0",
        "single-arith-tiny-m-shared-s0-train.lr=0.0002",
    }
    config = config_of(experiment, *sets, only=only)
    assert len({G.cell_spec(config, c).model_dump_json() for c in cells.values()}) == 4
    # The report shows the rate each cell trained with, whatever the overridden axis said.
    assert cells["single-arith-tiny-s-shared-s0-tiny-s.train.lr=0.0003"].sweep_values() == {
        "train.lr": 3.0e-4, "scales.tiny-s.train.lr": 3.0e-4,
    }  # fmt: skip
    for narrowed in (["train.lr=2.0e-4"], ["scales.tiny-s.train.lr=3.0e-4"]):
        ids = {c.id for c in G.cells(config_of(experiment, *sets, only=only + narrowed))}
        assert ids and ids <= set(cells), narrowed


def test_only_narrows_an_extra_axis_and_keeps_the_ids(experiment: Path) -> None:
    whole = {c.id for c in G.cells(config_of(experiment, LR, VOTES))}
    narrowed = G.cells(config_of(experiment, LR, VOTES, only=["workflow=voting", "workflows.voting.n_votes=5"]))
    assert narrowed and all(c.id.endswith("n_votes=5") for c in narrowed)
    assert {c.id for c in narrowed} <= whole


# A scale whose own train: sets the swept key, as examples/losses.yaml's GSPO scale: the axis
# does not multiply its cells (their spec is the same under every value), so they are
# computed under the file's own value and their ids do not show the axis, but they carry
# the loss they trained with, not the file's.
GSPO = [
    "scales.tiny-s-gspo={kind: tiny, hidden_size: 128, num_layers: 2, num_heads: 4, num_kv_heads: 2, "
    "intermediate_size: 256, max_length: 56, warmstart: {steps: 400, batch_size: 64, lr: 3.0e-3, seed: 0}, "
    "train: {loss_type: grpo, importance_sampling_level: sequence}}",
    "grid.scale=[tiny-s, tiny-s-gspo]",
    "grid.seed=[0, 1]",
]
LOSSES = "grid.train.loss_type=[dapo, grpo, dr_grpo]"
SINGLE = ["workflow=single", "task=arith", "policy=shared"]


def test_a_scale_that_sets_the_swept_key_carries_its_own_value_under_the_same_ids(experiment: Path) -> None:
    config = config_of(experiment, *GSPO, LOSSES, only=SINGLE)
    cells = G.cells(config)
    assert [c.id for c in cells] == [
        "single-arith-tiny-s-shared-s0", "single-arith-tiny-s-shared-s0-loss_type=grpo",
        "single-arith-tiny-s-shared-s0-loss_type=dr_grpo",
        "single-arith-tiny-s-shared-s1", "single-arith-tiny-s-shared-s1-loss_type=grpo",
        "single-arith-tiny-s-shared-s1-loss_type=dr_grpo",
        "single-arith-tiny-s-gspo-shared-s0", "single-arith-tiny-s-gspo-shared-s1",
    ]  # fmt: skip
    shown = {c.id: c.sweep_values()["train.loss_type"] for c in cells}
    assert shown == {
        **{c.id: ("dapo", "grpo", "dr_grpo")[i % 3] for i, c in enumerate(cells[:6])},
        "single-arith-tiny-s-gspo-shared-s0": "grpo", "single-arith-tiny-s-gspo-shared-s1": "grpo",
    }  # fmt: skip
    for cell in cells:  # the value shown is the spec's
        spec = G.cell_spec(config, cell)
        assert shown[cell.id] == spec.train.loss_type == G.setting_of(config, cell, "train.loss_type")
    gspo = cells[-1]
    assert (gspo.label, gspo.sweep) == ("", (("train.loss_type", '"dapo"'),))  # computed under the file's own value
    assert G.cell_spec(config, gspo).train.importance_sampling_level == "sequence"
    # The cells the axis leaves alone, and the file's-value cells, keep the digests they had
    # without the axis: their result folders stay theirs.
    before = config_of(experiment, *GSPO, only=SINGLE)
    digests = {c.id: G.cell_spec(before, c).eval_digest() for c in G.cells(before)}
    after = {c.id: G.cell_spec(config, c).eval_digest() for c in cells if c.id in digests}
    assert after == digests and len(after) == 4
    assert G.spec_digests(config, cells) == G.spec_digests(config, [replace(c, settings=None) for c in cells])
    # A scale's own train: key as the axis: a held value shows what the spec trains with.
    lr = config_of(experiment, *GSPO, "grid.scales.tiny-s-gspo.train.lr=[1.0e-4]", only=SINGLE)
    assert {c.id: c.sweep_values() for c in G.cells(lr) if c.scale == "tiny-s-gspo"} == {
        "single-arith-tiny-s-gspo-shared-s0": {"scales.tiny-s-gspo.train.lr": 1e-4},
        "single-arith-tiny-s-gspo-shared-s1": {"scales.tiny-s-gspo.train.lr": 1e-4},
    }


# --- the report on a constructed store -----------------------------------------------------

CURVES = {  # (train.lr, seed) → accuracy at steps 0, 10, 20
    (1e-4, 0): (0.25, 0.5, 0.375),
    (1e-4, 1): (0.25, 0.5, 0.5),
    (5e-5, 0): (0.25, 0.625, 0.625),
    (5e-5, 1): (0.25, 0.625, 0.5),
}


@pytest.fixture
def study(experiment: Path):
    """single · arith · tiny-s · shared, seeds 0 and 1, train.lr 1e-4 and 5e-5: four cells written and ingested."""
    sets = ["grid.seed=[0, 1]", LR]
    only = ["workflow=single", "task=arith", "scale=tiny-s", "policy=shared"]
    config = config_of(experiment, *sets, only=only)
    results = Path(config.results_dir)
    for cell in G.cells(config):
        train_file(results, config, cell, 20)
        for step, accuracy in zip((0, 10, 20), CURVES[(cell.sweep_values()["train.lr"], cell.seed)]):
            eval_file(results, config, cell, step, accuracy)
    assert ingest(results) == 16  # 4 cells: a train.json and 3 evaluations each
    args = [a for s in sets for a in ("--set", s)] + [a for o in only for a in ("--only", o)]
    return experiment, config, args


def report_json(experiment: Path, args: list[str], *more: str) -> list[dict]:
    result = run_cli("report", "-c", experiment, *args, "--format", "json", *more)
    assert result.exit_code == 0, (result.output, result.exception)
    return json.loads(result.stdout)


def test_every_table_has_the_axis_as_a_column_named_by_its_key(study) -> None:
    experiment, config, args = study
    summary = report_json(experiment, args)
    assert [(r["seed"], r["train.lr"], r["peak"], r["final"]) for r in summary] == [
        (0, 1e-4, 0.5, 0.375), (0, 5e-5, 0.625, 0.625), (1, 1e-4, 0.5, 0.5), (1, 5e-5, 0.625, 0.5),
    ]  # fmt: skip
    seeds = report_json(experiment, args, "--table", "seeds")
    assert [(r["train.lr"], r["peak_mean"], r["n_seeds"]) for r in seeds] == [(1e-4, 0.5, 2), (5e-5, 0.625, 2)]
    for table in ("diagnostics", "mechanism"):
        assert {r["train.lr"] for r in report_json(experiment, args, "--table", table)} == {1e-4, 5e-5}
    header = run_cli("report", "-c", experiment, *args, "--format", "csv").stdout.splitlines()[0]
    assert header.startswith("workflow,task,scale,policy,seed,train.lr,base,")


def test_group_by_and_only_on_the_axis(study) -> None:
    experiment, config, args = study
    grouped = report_json(experiment, args, "--group-by", "train.lr")
    assert [(r["train.lr"], r["seed"]) for r in grouped] == [(1e-4, 0), (1e-4, 1), (5e-5, 0), (5e-5, 1)]
    only = report_json(experiment, args, "--only", "train.lr=5e-05")
    assert [(r["train.lr"], r["seed"]) for r in only] == [(5e-5, 0), (5e-5, 1)]
    assert_user_error(
        run_cli("report", "-c", experiment, *args, "--group-by", "train.lrr"),
        "--group-by 'train.lrr': unknown axis 'train.lrr'; did you mean train.lr?",
    )


def test_compare_against_a_control_value_is_paired_by_seed(study) -> None:
    experiment, config, args = study
    rows = report_json(experiment, args, "--table", "compare", "--against", "train.lr=1e-4")
    assert len(rows) == 1
    row = rows[0]
    assert (row["train.lr"], row["comparison"], row["n_pairs"]) == (5e-5, "train.lr=5e-05 - train.lr=0.0001", 2)
    # By hand: peaks 0.625 - 0.5 for both seeds; finals 0.625 - 0.375 and 0.5 - 0.5 (bases are equal).
    assert row["peak_diff"] == pytest.approx(0.125) and row["peak_lo"] == pytest.approx(0.125)
    assert row["final_diff"] == pytest.approx(0.125) and row["gain_diff"] == pytest.approx(0.125)
    half = 12.706204736 * 0.25 / 2**0.5 / 2**0.5  # t(0.975, 1) · sd(0.25, 0) / √2
    assert (row["final_lo"], row["final_hi"]) == (pytest.approx(0.125 - half), pytest.approx(0.125 + half))
    summary = {(r["train.lr"], r["seed"]): r["cliff"] for r in report_json(experiment, args)}
    expected = sum(summary[(5e-5, s)] - summary[(1e-4, s)] for s in (0, 1)) / 2
    assert row["cliff_rate_diff"] == pytest.approx(expected)


@pytest.mark.parametrize(
    "against, message",
    [
        ("train.lr=3e-4", "--against 'train.lr=3e-4': 3e-4 is not a value of grid.train.lr [0.0001, 5e-05]; use one of them"),
        ("policy=sharde", "--against 'policy=sharde': sharde is not a value of grid.policy; did you mean shared?"),
        ("trian.lr=1e-4", "--against 'trian.lr=1e-4': unknown axis 'trian.lr'; did you mean train.lr?"),
        ("seed=0", "--against 'seed=0': cells are paired by seed, so seed cannot be the control; use another axis"),
        ("lr=1e-4", "--against 'lr=1e-4': unknown axis 'lr'; use one of: workflow, task, scale, policy, train.lr"),
        ("train.lr", "--against 'train.lr': expected AXIS=VALUE, e.g. --against policy=shared"),
    ],
)
def test_bad_against_is_one_line(study, against: str, message: str) -> None:
    experiment, config, args = study
    assert_user_error(run_cli("report", "-c", experiment, *args, "--table", "compare", "--against", against), message)


def test_against_needs_the_compare_table(study) -> None:
    _, config, _ = study
    with pytest.raises(ConfigError, match="use it with --table compare"):
        parse_against("train.lr=1e-4", config, "summary")


GSPO_PEAKS = {  # (scale, train.loss_type) → each seed's accuracy at step 10 (the peak); 0.25 at 0 and 20
    ("tiny-s", "dapo"): (0.5, 0.375),
    ("tiny-s", "grpo"): (0.625, 0.625),
    ("tiny-s", "dr_grpo"): (0.375, 0.375),
    ("tiny-s-gspo", "grpo"): (0.875, 0.75),
}


def test_the_report_shows_and_pairs_a_scales_own_value_of_the_axis(experiment: Path) -> None:
    config = config_of(experiment, *GSPO, LOSSES, only=SINGLE)
    results = Path(config.results_dir)
    for cell in G.cells(config):
        train_file(results, config, cell, 20)
        peaks = GSPO_PEAKS[(cell.scale, cell.sweep_values()["train.loss_type"])]
        for step, accuracy in zip((0, 10, 20), (0.25, peaks[cell.seed], 0.25)):
            eval_file(results, config, cell, step, accuracy)
    assert ingest(results) == 32
    args = [a for s in (*GSPO, LOSSES) for a in ("--set", s)] + [a for o in SINGLE for a in ("--only", o)]

    summary = report_json(experiment, args)
    assert [(r["scale"], r["train.loss_type"], r["seed"], r["peak"]) for r in summary if r["scale"] == "tiny-s-gspo"] == [
        ("tiny-s-gspo", "grpo", 0, 0.875), ("tiny-s-gspo", "grpo", 1, 0.75),
    ]  # fmt: skip
    # Against dapo: the GSPO cells are not dapo, so they are no control, and have none.
    rows = report_json(experiment, args, "--table", "compare", "--against", "train.loss_type=dapo")
    assert [(r["scale"], r["train.loss_type"], r["n_pairs"], r["peak_diff"]) for r in rows] == [
        ("tiny-s", "grpo", 2, pytest.approx(0.1875)), ("tiny-s", "dr_grpo", 2, pytest.approx(-0.0625)),
    ]  # fmt: skip
    # Against the other scale: paired with the same loss, grpo, so the row is sequence − token level.
    (row,) = report_json(experiment, args, "--table", "compare", "--against", "scale=tiny-s")
    assert (row["scale"], row["train.loss_type"], row["comparison"], row["n_pairs"]) == (
        "tiny-s-gspo", "grpo", "scale=tiny-s-gspo - scale=tiny-s", 2,
    )  # fmt: skip
    assert row["peak_diff"] == pytest.approx(0.1875)  # (0.875 − 0.625 + 0.75 − 0.625) / 2
    # --only on the axis selects by that value too.
    only = report_json(experiment, args, "--only", "train.loss_type=grpo")
    assert [(r["scale"], r["seed"]) for r in only] == [("tiny-s", 0), ("tiny-s", 1), ("tiny-s-gspo", 0), ("tiny-s-gspo", 1)]
    assert {r["scale"] for r in report_json(experiment, args, "--only", "train.loss_type=dapo")} == {"tiny-s"}


def test_a_removed_value_leaves_the_report_but_stays_in_the_store(study) -> None:
    experiment, config, args = study
    narrowed = [a if a != LR else "grid.train.lr=[1.0e-4]" for a in args]
    assert {r["train.lr"] for r in report_json(experiment, narrowed)} == {1e-4}
    stored = build_tables(L.store_path(config.results_dir), config, ["summary"])["summary"]
    assert set(stored["train.lr"]) == {1e-4, 5e-5}  # asked for again, it is all there


def test_curves_draw_one_line_per_value(study) -> None:
    experiment, config, args = study
    figure = plots.study_figures(plots.load_study(config), line_by="train.lr")["curves-arith"]
    ax = figure.get_axes()[0]
    means = [line for line in ax.get_lines() if len(line.get_xdata()) == 3]
    assert len(means) == 2
    assert sorted(tuple(line.get_ydata()) for line in means) == sorted(
        [(0.25, 0.5, 0.4375), (0.25, 0.625, 0.5625)]  # the mean over seeds of each rate
    )
    legend = [t.get_text() for t in figure.legends[0].get_texts()]
    assert [label for label in legend if label.endswith("(mean)")] == ["train.lr=0.0001 (mean)", "train.lr=5e-05 (mean)"]


# --- real runs -----------------------------------------------------------------------------


def matrixrl(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "matrixrl", *args], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    return proc


def trained(proc: subprocess.CompletedProcess) -> list[str]:
    return re.findall(r"▶ train cell=(\S+)", proc.stderr + proc.stdout)


def pending(config: Path, *args: str) -> list[str]:
    jobs = json.loads(matrixrl("plan", "-c", str(config), *args, "--format", "json").stdout)
    return [job["rule"] for job in jobs if job["status"] == "pending"]


def snapshot(results: Path) -> dict[str, int]:
    return {str(p.relative_to(results)): p.stat().st_mtime_ns for p in (results / "cells").rglob("*.json")}


@pytest.mark.slow
def test_a_new_value_runs_only_its_cells_and_an_axis_of_the_files_value_nothing(small_run, tmp_path: Path) -> None:
    config, results = copy_of(small_run[0], tmp_path / "grid")  # test_e2e's small grid, run (conftest.py)
    cell = "single-arith-tiny-s-shared-s0"
    before = snapshot(results)

    # An axis whose one value is the file's own: no training or evaluation reruns, no
    # result file is rewritten; only the summary gains the axis's column.
    same = ["--set", "grid.train.lr=[1.0e-4]"]
    assert pending(config, *same) == ["analyse"]
    assert trained(matrixrl("run", "-c", str(config), "--cores", "2", *same)) == []
    assert snapshot(results) == before

    # A second value: its cell alone trains; the first one's files stay as they were, and its
    # step 0 is a copy of the base model's one evaluation (a learning rate cannot change it).
    two = ["--set", "grid.train.lr=[1.0e-4, 3.0e-4]"]
    assert pending(config, *two) == ["train", "copy_base_eval", "evaluate", "evaluate", "retain", "analyse"]
    assert trained(matrixrl("run", "-c", str(config), "--cores", "2", *two)) == [f"{cell}-lr=0.0003"]
    assert {k: v for k, v in snapshot(results).items() if k in before} == before
    rows = json.loads(matrixrl("report", "-c", str(config), *two, "--format", "json").stdout)
    assert [(r["train.lr"], r["n_checkpoints"]) for r in rows] == [(1e-4, 3), (3e-4, 3)]
    spec = json.loads((results / L.train_result(f"{cell}-lr=0.0003")).read_text())
    assert spec["cell"] == f"{cell}-lr=0.0003"


def test_against_pairs_the_mean_amplification_too() -> None:
    import pandas as pd

    from matrixrl.analysis.compare import against_table

    rows = [
        {"workflow": "voting", "task": "arith", "scale": "tiny-s", "policy": "isolated", "seed": seed,
         "train.damper": damper, "peak": 0.3, "final": 0.2, "gain": -0.05, "cliff": False, "amplification_mean": amp}
        for seed, damper, amp in ((0, 0.0, 2.0), (1, 0.0, 2.4), (0, 0.3, 1.5), (1, 0.3, 2.1))
    ]  # fmt: skip
    (row,) = against_table(pd.DataFrame(rows), "train.damper", 0.0).to_dict("records")
    assert row["comparison"] == "train.damper=0.3 - train.damper=0.0"
    assert row["amplification_diff"] == pytest.approx(-0.4)  # (−0.5 − 0.3) / 2
    half = 12.706204736 * (0.2 / 2**0.5) / 2**0.5  # t(0.975, 1) · sd(−0.5, −0.3) / √2
    assert (row["amplification_lo"], row["amplification_hi"]) == (pytest.approx(-0.4 - half), pytest.approx(-0.4 + half))
