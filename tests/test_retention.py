"""Checkpoint retention (train.keep_checkpoints) and the disk estimate, on constructed curves and folders.

The run through Snakemake (what a finished run keeps, and that nothing deleted is
recomputed) is in test_e2e.py; here the keep set is checked by hand on curves with
and without a cliff, deletion on real checkpoint folders (a kill mid-delete
included), what reruns a deleted checkpoint's evaluation, and the estimate against
transformers' own parameter counts and a checkpoint the trainer writes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from matrixrl import layout as L
from matrixrl.config import Analysis, ConfigError, load_config
from matrixrl.grid import cell_spec, runs
from matrixrl.results import EvalResult, write_result
from matrixrl.retention import RetentionRecord, format_bytes, key_checkpoints, retain
from matrixrl.status import rebuild_targets
from matrixrl.train.checkpoints import COMPLETE, complete_checkpoints, folder_bytes

RULE = Analysis()  # cliff_delta 0.10, cliff_noise_se 2


def keep(steps, accuracies, latest=None, n=1000):
    return key_checkpoints(steps, accuracies, [n] * len(steps), None, latest if latest is not None else max(steps), RULE)


# --- which checkpoints `key` keeps ----------------------------------------------------------


def test_without_a_cliff_key_keeps_the_peak_and_the_final_which_is_the_resume_point():
    assert keep([0, 10, 20, 30, 40], [0.3, 0.5, 0.45, 0.48, 0.47]) == {10: ["peak"], 40: ["resume", "final"]}


def test_a_cliff_keeps_its_onset_and_one_evaluated_checkpoint_on_each_side():
    # Peak 0.7 at 20; below 0.6 from 40 to the end: onset 40, with 30 before it and 50 after.
    kept = keep([0, 10, 20, 30, 40, 50, 60], [0.3, 0.6, 0.7, 0.65, 0.4, 0.2, 0.1])
    assert kept == {
        20: ["peak"],
        30: ["before cliff onset"],
        40: ["cliff onset"],
        50: ["after cliff onset"],
        60: ["resume", "final"],
    }


def test_a_cliff_onset_right_after_the_peak_and_at_the_end_has_one_neighbour():
    assert keep([0, 10, 20], [0.3, 0.7, 0.1]) == {
        10: ["peak", "before cliff onset"],
        20: ["resume", "final", "cliff onset"],
    }


def test_a_drop_within_noise_is_no_cliff_and_keeps_nothing_around_it():
    # n = 10: the drop 0.15 is within 2 SEs, so the report sees no cliff, and neither does retention.
    assert keep([0, 10, 20], [0.2, 0.5, 0.35], n=10) == {10: ["peak"], 20: ["resume", "final"]}
    assert keep([0, 10, 20], [0.2, 0.5, 0.35], n=1000) == {
        10: ["peak", "before cliff onset"],
        20: ["resume", "final", "cliff onset"],
    }


def test_the_peak_is_the_earliest_best_and_may_be_the_base_model():
    assert keep([0, 10, 20], [0.5, 0.5, 0.45]) == {0: ["peak"], 20: ["resume", "final"]}


def test_the_resume_point_past_the_evaluated_steps_stays():
    # A cell trained to 30 and then shortened to 20 steps resumes from 30 if extended again.
    assert keep([0, 10, 20], [0.3, 0.5, 0.45], latest=30) == {10: ["peak"], 20: ["final"], 30: ["resume"]}


def test_the_curve_may_come_in_any_order():
    assert keep([20, 0, 10], [0.4, 0.3, 0.5]) == keep([0, 10, 20], [0.3, 0.5, 0.4])


# --- deleting them --------------------------------------------------------------------------

DIGEST = "abc123"


def write_checkpoint(cell_dir: Path, step: int, digest: str = DIGEST, size: int = 1000) -> None:
    folder = L.checkpoint_dir(cell_dir, step)
    (folder / "shared").mkdir(parents=True)
    (folder / "shared" / "model.safetensors").write_bytes(b"w" * size)
    (folder / "trainer_state.pt").write_bytes(b"s" * (2 * size))
    (folder / COMPLETE).write_text(json.dumps({"step": step, "resume_digest": digest}))


def evaluation(step: int, accuracy: float, cell: str = "c") -> EvalResult:
    return EvalResult(cell=cell, step=step, accuracy=accuracy, n=1000, n_correct=int(accuracy * 2000), samples=2, seconds=0.0, se=0.01)


# A cell with resume checkpoints every 5 steps, evaluated every 10, that collapses after step 20.
CURVE = {0: 0.3, 10: 0.6, 20: 0.7, 30: 0.65, 40: 0.4, 50: 0.2, 60: 0.1}
SAVED = range(0, 65, 5)


@pytest.fixture
def cell_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "cells" / "c"
    for step in SAVED:
        write_checkpoint(folder, step, size=1000 + step)
    write_checkpoint(folder, 70, digest="other")  # another training's: the trainer's to remove, not retention's
    return folder


def test_retain_deletes_all_but_the_key_checkpoints_and_records_why(cell_dir: Path):
    sizes = {step: folder_bytes(L.checkpoint_dir(cell_dir, step)) for step in SAVED}
    lines: list[str] = []
    record = retain("c", cell_dir, [evaluation(s, a) for s, a in CURVE.items()], "key", RULE, DIGEST, log=lines.append)
    kept = {20, 30, 40, 50, 60}
    assert sorted(complete_checkpoints(cell_dir)) == [*sorted(kept), 70]
    assert sorted(p.name for p in L.checkpoints_dir(cell_dir).iterdir()) == sorted(f"step_{s}" for s in [*kept, 70])
    assert [(k.step, k.why, k.bytes) for k in record.kept] == [
        (20, ["peak"], sizes[20]),
        (30, ["before cliff onset"], sizes[30]),
        (40, ["cliff onset"], sizes[40]),
        (50, ["after cliff onset"], sizes[50]),
        (60, ["resume", "final"], sizes[60]),
    ]
    deleted = [s for s in SAVED if s not in kept]
    assert record.deleted == deleted and record.pruned == [0, 10]
    assert record.bytes_freed == sum(sizes[s] for s in deleted)
    assert (record.peak_step, record.cliff_onset) == (20, 40)
    assert RetentionRecord.model_validate_json((cell_dir / L.RETENTION_FILE).read_text()) == record
    assert lines == [
        f"c: kept checkpoints 20 (peak), 30 (before cliff onset), 40 (cliff onset), 50 (after cliff onset), "
        f"60 (resume, final); deleted {len(deleted)}, freeing {format_bytes(record.bytes_freed)}"
    ]


def test_retain_again_deletes_nothing_more_and_still_knows_what_was_pruned(cell_dir: Path):
    """Snakemake removes retained.json before the job reruns (keep_checkpoints changed, say)."""
    evaluations = [evaluation(s, a) for s, a in CURVE.items()]
    first = retain("c", cell_dir, evaluations, "key", RULE, DIGEST, log=lambda m: None)
    assert first.pruned == [0, 10]  # the evaluated ones; the unevaluated resume points need no rebuild
    (cell_dir / L.RETENTION_FILE).unlink()
    again = retain("c", cell_dir, evaluations, "key", RULE, DIGEST, log=lambda m: None)
    assert (again.deleted, again.bytes_freed, again.pruned, again.kept) == ([], 0, first.pruned, first.kept)
    # keep_checkpoints: all keeps what is left; nothing deleted comes back, and it is still known as pruned.
    (cell_dir / L.RETENTION_FILE).unlink()
    everything = retain("c", cell_dir, evaluations, "all", RULE, DIGEST, log=lambda m: None)
    assert [k.step for k in everything.kept] == [k.step for k in first.kept]
    assert everything.pruned == first.pruned and everything.deleted == []
    # A rebuilt checkpoint is no longer pruned.
    write_checkpoint(cell_dir, 10)
    assert retain("c", cell_dir, evaluations, "all", RULE, DIGEST, log=lambda m: None).pruned == [0]


def test_all_keeps_every_checkpoint(cell_dir: Path):
    record = retain("c", cell_dir, [evaluation(s, a) for s, a in CURVE.items()], "all", RULE, DIGEST, log=lambda m: None)
    assert sorted(complete_checkpoints(cell_dir)) == [*SAVED, 70]
    assert (record.deleted, record.bytes_freed, [k.step for k in record.kept]) == ([], 0, list(SAVED))


def test_a_kill_mid_delete_leaves_no_half_checkpoint_that_resume_would_trust(cell_dir: Path, monkeypatch):
    """The folder leaves the step_N names before its files go: whatever the deletion did, a
    step_N is whole, and the leftover is removed by the next retain or training."""
    import matrixrl.train.checkpoints as checkpoints

    real_rmtree = shutil.rmtree
    before = {s: sorted(p.relative_to(L.checkpoint_dir(cell_dir, s)) for p in L.checkpoint_dir(cell_dir, s).rglob("*")) for s in SAVED}

    def killed_midway(path, *args, **kwargs):
        (Path(path) / COMPLETE).unlink()  # part of the folder is gone, then the process dies
        (Path(path) / "trainer_state.pt").unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoints.shutil, "rmtree", killed_midway)
    evaluations = [evaluation(s, a) for s, a in CURVE.items()]
    with pytest.raises(KeyboardInterrupt):
        retain("c", cell_dir, evaluations, "key", RULE, DIGEST, log=lambda m: None)
    names = sorted(p.name for p in L.checkpoints_dir(cell_dir).iterdir())
    assert names == sorted([*(f"step_{s}" for s in [*SAVED, 70] if s != 0), "step_0.deleting"])
    for step in SAVED[1:]:  # every step_N is still the whole checkpoint it was
        folder = L.checkpoint_dir(cell_dir, step)
        assert sorted(p.relative_to(folder) for p in folder.rglob("*")) == before[step]
    assert 0 not in complete_checkpoints(cell_dir)
    assert not (cell_dir / L.RETENTION_FILE).exists()  # so Snakemake runs retain again

    monkeypatch.setattr(checkpoints.shutil, "rmtree", real_rmtree)
    lines: list[str] = []
    record = retain("c", cell_dir, evaluations, "key", RULE, DIGEST, log=lines.append)
    assert lines[0] == "finished removing step_0.deleting: a stopped run's removals"
    assert sorted(complete_checkpoints(cell_dir)) == [20, 30, 40, 50, 60, 70]
    assert record.deleted == [s for s in SAVED if s not in (20, 30, 40, 50, 60)] and record.pruned == [0, 10]


def test_the_trainer_removes_a_removal_a_kill_interrupted(cell_dir: Path):
    from matrixrl.train.trainer import resume_point

    L.checkpoint_dir(cell_dir, 60).rename(L.checkpoints_dir(cell_dir) / "step_60.deleting")
    lines: list[str] = []
    assert resume_point(cell_dir, DIGEST, 60, lines.append) == 55
    assert lines[0] == f"removing step_60.deleting from {L.checkpoints_dir(cell_dir)}: unfinished writes or removals of a stopped run"
    assert not (L.checkpoints_dir(cell_dir) / "step_60.deleting").exists()


# --- what a deleted checkpoint's evaluation reruns -------------------------------------------

ONE_CELL = ["workflow=single", "policy=shared", "seed=0", "task=arith", "scale=tiny-s"]
SMALL = ["train.steps=4", "train.eval_every=2"]


def finished_cell(experiment: Path, *sets: str):
    """One cell as a finished run under ``key`` leaves it: every evaluation current, steps 0 and 2 pruned."""
    config = load_config(experiment, sets=[*SMALL, *sets], only=ONE_CELL)
    (cell,) = runs(config)
    spec = cell_spec(config, cell)
    results = Path(config.results_dir)
    cell_dir = results / L.cell_dir(cell.id)
    (results / L.train_result(cell.id)).parent.mkdir(parents=True)
    (results / L.train_result(cell.id)).write_text("{}")
    evaluations = []
    for step, accuracy in {0: 0.3, 2: 0.4, 4: 0.5}.items():
        write_checkpoint(cell_dir, step, digest=spec.resume_digest())
        evaluations.append(evaluation(step, accuracy, cell.id).model_copy(update={"spec_digest": spec.eval_digest()}))
        write_result(results / L.eval_result(cell.id, step), evaluations[-1])
    record = retain(cell.id, cell_dir, evaluations, "key", RULE, spec.resume_digest(), log=lambda m: None)
    assert record.pruned == [0, 2]
    return config, results, cell


def test_a_deleted_checkpoint_is_rebuilt_only_when_its_evaluation_must_be_recomputed(experiment: Path):
    config, results, cell = finished_cell(experiment)
    train = L.train_result(cell.id)
    assert rebuild_targets(config) == []  # everything done: nothing reruns
    # An evaluation setting: every evaluation reruns, the pruned ones need their checkpoints.
    assert rebuild_targets(load_config(experiment, sets=[*SMALL, "eval.samples=3"], only=ONE_CELL)) == [train]
    # A runtime setting changes nothing, and neither does the report's threshold.
    for runtime in ("eval.batch_size=7", "train.keep_checkpoints=all", "analysis.cliff_delta=0.2"):
        assert rebuild_targets(load_config(experiment, sets=[*SMALL, runtime], only=ONE_CELL)) == [], runtime
    # A training setting retrains the cell anyway, from step 0: nothing to force.
    assert rebuild_targets(load_config(experiment, sets=[*SMALL, "train.lr=3.0e-4"], only=ONE_CELL)) == []
    # The deleted evaluation of a kept checkpoint needs no rebuild; of a pruned one, it does.
    (results / L.eval_result(cell.id, 4)).unlink()
    assert rebuild_targets(config) == []
    (results / L.eval_result(cell.id, 2)).unlink()
    assert rebuild_targets(config) == [train]


def test_evaluating_a_deleted_checkpoint_says_why_it_is_gone(experiment: Path):
    from matrixrl.errors import UserError
    from matrixrl.jobs.evaluate import evaluate

    config, results, cell = finished_cell(experiment)
    cell_dir = results / L.cell_dir(cell.id)
    with pytest.raises(UserError) as info:
        evaluate(cell_spec(config, cell), 2, L.checkpoint_dir(cell_dir, 2), results / "base", results / "out.json")
    assert str(info.value) == (
        f"the checkpoint of step 2 was deleted after its evaluation ({cell_dir.resolve() / L.RETENTION_FILE}), so it "
        f"cannot be evaluated; delete {(results / L.train_result(cell.id)).resolve()} and run `matrixrl run` again: "
        "the cell rebuilds it from its last checkpoint before"
    )


# --- the setting ----------------------------------------------------------------------------


def test_keep_checkpoints_is_a_runtime_setting(experiment: Path):
    key, every = (load_config(experiment, sets=[f"train.keep_checkpoints={v}"], only=ONE_CELL) for v in ("key", "all"))
    a, b = cell_spec(key, runs(key)[0]), cell_spec(every, runs(every)[0])
    assert (a.train.keep_checkpoints, b.train.keep_checkpoints) == ("key", "all")
    assert (a.train_digest(), a.resume_digest(), a.eval_digest()) == (b.train_digest(), b.resume_digest(), b.eval_digest())
    # A scale may keep its own.
    mixed = load_config(experiment, sets=["scales.tiny-s.train.keep_checkpoints=all"], only=ONE_CELL)
    assert cell_spec(mixed, runs(mixed)[0]).train.keep_checkpoints == "all"


@pytest.mark.parametrize(
    "sets, message",
    [
        (
            ["train.keep_checkpoints=some"],
            "FILE with --set 'train.keep_checkpoints=some': train.keep_checkpoints: must be 'key' or 'all' (got 'some')",
        ),
        (
            ["grid.train.keep_checkpoints=[key, all]"],
            "FILE with --set 'grid.train.keep_checkpoints=[key, all]': grid.train.keep_checkpoints: a runtime setting (it changes no result), so it cannot be an axis; "
            "set it with --set train.keep_checkpoints=VALUE",
        ),
    ],
)
def test_a_bad_keep_checkpoints_is_one_line_naming_the_key(experiment: Path, sets, message):
    """A value a --set wrote is named with it, an axis's values too (the file may be right)."""
    with pytest.raises(ConfigError) as info:
        load_config(experiment, sets=sets)
    assert str(info.value) == message.replace("FILE", str(experiment))


# --- the disk estimate ----------------------------------------------------------------------

QWEN3_0_6B = {  # Qwen/Qwen3-0.6B's config.json, the fields the shape reads
    "model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
    "tie_word_embeddings": True,
}  # fmt: skip
SMOLLM2_135M = {  # HuggingFaceTB/SmolLM2-135M-Instruct's
    "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
    "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152, "tie_word_embeddings": True,
}  # fmt: skip
QWEN2_UNTIED = {
    "model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300, "tie_word_embeddings": False,
}  # fmt: skip


@pytest.mark.parametrize("fields", [QWEN3_0_6B, SMOLLM2_135M, QWEN2_UNTIED], ids=["qwen3", "llama", "qwen2-untied"])
def test_the_computed_parameter_count_is_transformers_own(fields: dict):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from matrixrl.disk import decoder_shape

    config = AutoConfig.for_model(**fields)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert decoder_shape(fields).parameters == sum(p.numel() for p in model.parameters())


def tiny_policy(experiment: Path, *sets: str):
    """A cell's spec, its tiny base's parameter count, and its policy on that base (freshly built, not warm-started)."""
    from matrixrl.models.policies import build_policy
    from matrixrl.models.tiny import build_char_tokenizer, build_tiny_model
    from matrixrl.workflows import WORKFLOWS

    config = load_config(experiment, sets=list(sets), only=["task=arith", "scale=tiny-s", "seed=0"])
    spec = cell_spec(config, runs(config)[0])
    model = build_tiny_model(spec.scale, build_char_tokenizer(), seed=0)
    parameters = sum(p.numel() for p in model.parameters())
    return spec, parameters, build_policy(spec.cell.policy, model, WORKFLOWS[spec.cell.workflow].roles, spec.policies)


@pytest.mark.parametrize(
    "sets",
    [
        ("grid.workflow=[single]", "grid.policy=[shared]", "policies.adapter=full"),
        ("grid.workflow=[voting]", "grid.policy=[isolated]", "policies.adapter=lora", "policies.lora.target_modules=[q_proj, v_proj, down_proj]"),
    ],
    ids=["full-shared", "lora-isolated"],
)
def test_the_computed_checkpoint_size_is_what_the_trainer_writes(experiment: Path, tmp_path: Path, sets):
    import torch

    from matrixrl.disk import computed_size, decoder_shape, tiny_config
    from matrixrl.train.trainer import make_optimizers, save_checkpoint

    spec, parameters, policy = tiny_policy(experiment, *sets)
    assert decoder_shape(tiny_config(spec.scale)).parameters == parameters
    optimizers = make_optimizers(policy, spec.train)
    save_checkpoint(tmp_path, 0, policy, optimizers, {"metrics": []}, "d")
    for name, (_, params) in policy.parameter_sets().items():  # one step: AdamW's moments exist
        for p in params:
            p.grad = torch.ones_like(p)
        optimizers[name].step()
    save_checkpoint(tmp_path, 1, policy, optimizers, {"metrics": []}, "d")
    size = computed_size(spec)
    first, trained = folder_bytes(L.checkpoint_dir(tmp_path, 0)), folder_bytes(L.checkpoint_dir(tmp_path, 1))
    # What the estimate leaves out: configs, markers and the pickles' framing.
    assert 0 < first - size.first < 0.05 * first + 20_000
    assert 0 < trained - size.trained < 0.05 * trained + 20_000


def test_the_estimate_counts_whole_sets_only_for_the_cells_in_flight(experiment: Path):
    from matrixrl.disk import computed_size, disk_at_peak

    config = load_config(experiment)  # the default study: 28 runs of 32 cells
    cells = runs(config)
    everyone = disk_at_peak(config, in_flight=len(cells))
    assert everyone.peak == everyone.all  # every cell whole at once
    assert everyone.all == sum(computed_size(cell_spec(config, c)).first + 4 * computed_size(cell_spec(config, c)).trained for c in cells)
    one = disk_at_peak(config, in_flight=1)  # 5 checkpoints (0, 10, ..., 40): key keeps at most all of them
    assert one.peak == one.all
    longer = load_config(experiment, sets=["train.steps=200"])  # 21 checkpoints each
    two = disk_at_peak(longer, in_flight=2)
    sizes = sorted((computed_size(cell_spec(longer, c)) for c in cells), key=lambda s: s.trained)
    whole = [s.first + 20 * s.trained for s in sizes]
    assert two.peak == sum(5 * s.trained for s in sizes) + sum(w - 5 * s.trained for w, s in zip(whole[-2:], sizes[-2:]))
    assert two.all == sum(whole) and two.peak < two.all
    assert disk_at_peak(load_config(experiment, sets=["train.steps=200", "train.keep_checkpoints=all"]), 2).peak == two.all
    assert two.line() == (
        f"disk at peak: ~{format_bytes(two.peak)} of checkpoints (train.keep_checkpoints: key; all: ~{format_bytes(two.all)}), "
        "with up to 2 cells unpruned at once"
    )


def test_a_pruned_cell_counts_what_is_left_of_it(experiment: Path):
    from matrixrl.disk import disk_at_peak

    config, results, cell = finished_cell(experiment)
    left = folder_bytes(L.checkpoints_dir(results / L.cell_dir(cell.id)))
    assert disk_at_peak(config, in_flight=4).peak == left


def test_a_model_without_a_config_here_is_named_not_guessed(experiment: Path):
    from matrixrl.disk import disk_at_peak

    path = experiment.parent / "hub.yaml"
    raw = experiment.read_text().replace("scales:\n", "scales:\n  nowhere: {kind: hf, path: Nobody/not-a-model}\n", 1)
    path.write_text(raw)
    config = load_config(path, sets=["grid.scale=[nowhere]"])
    assert disk_at_peak(config, 2).line() == (
        "disk at peak: unknown: no model config on this machine for nowhere (`hf download MODEL` fetches it)"
    )


@pytest.mark.parametrize("exact", [True, False])
def test_a_replay_on_a_device_that_is_not_exact_drops_the_path_it_replaces(cell_dir: Path, exact: bool):
    """A deleted step is rebuilt from the last checkpoint before it. On CPU the replay gives back
    the same weights, and the later checkpoints stay (a replay stopped halfway resumes from
    them); on a GPU it is another sample of the training, so they are removed first, or a cell
    could end with checkpoints of two trainings."""
    from matrixrl.train.checkpoints import complete_checkpoints as present
    from matrixrl.train.trainer import resume_point

    shutil.rmtree(L.checkpoint_dir(cell_dir, 20))
    lines: list[str] = []
    start = resume_point(cell_dir, DIGEST, 60, lines.append, evaluated=[0, 10, 20, 30, 40, 50, 60], exact=exact)
    assert start == 15
    later = [s for s in SAVED if s > 15 and s != 20]
    if exact:
        assert [s for s in sorted(present(cell_dir)) if s > 15] == later
    else:
        assert [s for s in present(cell_dir) if s > 15] == []
        assert lines[-1] == (
            f"replaying from step 15 on a device whose kernels are not deterministic: the checkpoints at steps "
            f"{', '.join(map(str, later))} belong to the path being replaced; removing them"
        )
