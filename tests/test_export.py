"""``matrixrl export tensorboard|wandb``: the files read back with each tracker's own reader, and incremental exports.

TensorBoard's files are read with its ``EventAccumulator`` (what ``tensorboard
--logdir`` reads them with); W&B's offline runs are read record by record with
W&B's own protobuf messages (the ``.wandb`` file is a LevelDB-style log of
``Record``s, the format ``wandb sync`` uploads). Nothing touches the network.
"""

from __future__ import annotations

import importlib
import json
import struct
import sys
from pathlib import Path

import pytest

from matrixrl import grid as G
from matrixrl.config import load_config
from matrixrl.export import STATE_FILE
from matrixrl.layout import eval_result
from matrixrl.results import write_result

import study_files as S
from conftest import run_cli, skip_or_fail
from test_cli_errors import assert_user_error, results_of, snapshot

ONLY_ARGS = [arg for option in S.ONLY for arg in ("--only", option)]
CLIFF = "voting-arith-tiny-s-shared-s0"


@pytest.fixture
def experiment2(experiment: Path) -> Path:
    return S.two_seed_experiment(experiment)


def need(tracker: str) -> None:
    """Skip without the tracker's package (fail on CI, whose dev extra installs it)."""
    try:
        importlib.import_module(tracker)
    except ImportError:
        skip_or_fail(f"matrixrl export {tracker}", f"{tracker} is not installed", f"pip install 'matrixrl[{tracker}]'")


def runs_of(experiment: Path) -> dict[str, G.Cell]:
    return {run.id: run for run in G.runs(load_config(experiment, only=S.ONLY))}


def export(experiment: Path, tracker: str, out: Path, *args: str):
    result = run_cli("export", tracker, "-c", experiment, *ONLY_ARGS, "--out", out, *args)
    assert result.exit_code == 0, result.output
    return result.stdout.strip()


def scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag of a TensorBoard run folder: [(step, value), ...] as TensorBoard reads them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})  # 0: keep every point
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def f32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]  # TensorBoard stores float32


# --- TensorBoard ----------------------------------------------------------------------------


def test_tensorboard_one_run_per_cell_with_train_roles_and_eval_tags(experiment2: Path, tmp_path: Path) -> None:
    need("tensorboard")
    S.write_study(experiment2)
    out = tmp_path / "tb"
    assert export(experiment2, "tensorboard", out).startswith("Exported ")
    cells = [c.id for c in G.cells(load_config(experiment2, only=S.ONLY))]
    assert sorted(p.name for p in out.iterdir()) == sorted([*cells, STATE_FILE])
    runs = runs_of(experiment2)
    voting = scalars(out / CLIFF)
    run = runs[CLIFF]
    assert voting["train/reward"] == [(s, f32(S.reward(run, s))) for s in range(1, S.TRAIN_STEPS + 1)]
    assert voting["train/completion_tokens"][-1] == (S.TRAIN_STEPS, 100 + S.TRAIN_STEPS)
    assert voting["roles/generator/grad_norm"] == [(s, f32(S.grad_norm(run, "generator", s))) for s in range(1, 41)]
    assert voting["roles/aggregator/grad_norm"] == [(s, f32(S.grad_norm(run, "aggregator", s))) for s in range(1, 41)]
    assert voting["roles/generator/amplification"][0] == (1, 2.0)
    assert voting["roles/generator/agents/generator0/grad_norm"][0] == (1, f32(S.grad_norm(run, "generator", 1) / 2))
    assert voting["roles/generator/agents/generator0/cosine/generator1"][0] == (1, 0.5)
    assert voting["roles/generator/answer_acc"][0] == (1, 0.25)
    assert voting["train/any_correct"][0] == (1, 0.5)
    assert voting["eval/accuracy"] == [(s, f32(S.accuracy(run, s))) for s in S.STEPS]
    assert [step for step, _ in voting["eval/se"]] == list(S.STEPS)
    assert voting["eval/pass@2"][0] == (0, f32(S.accuracy(run, 0) + 0.1))
    assert voting["eval/generator/answer_acc"][1] == (10, f32(S.accuracy(run, 10)))
    # a one-role workflow's isolated cell is its shared run, exported under its own name
    single = scalars(out / "single-arith-tiny-s-isolated-s1")
    assert single == scalars(out / "single-arith-tiny-s-shared-s1")
    assert not any(tag.startswith("roles/aggregator") for tag in single)


def test_tensorboard_export_is_incremental(experiment2: Path, tmp_path: Path) -> None:
    need("tensorboard")
    S.write_study(experiment2, steps=(0, 10))
    out = tmp_path / "tb"
    export(experiment2, "tensorboard", out)
    before = snapshot(out)
    runs = runs_of(experiment2)
    config = load_config(experiment2, only=S.ONLY)
    # two more checkpoints of one run, in order: only its two cells get a new file, with only them
    run = runs[CLIFF]
    for step in (20, 30):
        write_result(Path(config.results_dir) / eval_result(run.id, step), S.evaluation(run, step, G.cell_spec(config, run).eval_digest()))
    assert export(experiment2, "tensorboard", out) == f"Exported 12 values of 1 cell to {out}; 7 cells unchanged."  # 6 per checkpoint
    after = snapshot(out)
    added = sorted(set(after) - set(before))
    assert [Path(p).parent.name for p in added] == [CLIFF]
    assert all(after[p] == before[p] for p in before if p != STATE_FILE)  # nothing rewritten
    exported = scalars(out / CLIFF)
    assert exported["eval/accuracy"] == [(s, f32(S.accuracy(run, s))) for s in (0, 10, 20, 30)]
    assert len(exported["train/reward"]) == S.TRAIN_STEPS  # once each
    # an unchanged study writes nothing, not even the state file
    assert export(experiment2, "tensorboard", out) == f"Nothing new to export: 8 cells unchanged in {out}."
    assert snapshot(out) == after


def test_tensorboard_rewrites_a_cell_whose_results_changed_or_came_out_of_order(experiment2: Path, tmp_path: Path) -> None:
    need("tensorboard")
    S.write_study(experiment2, steps=(0, 10, 30))
    out = tmp_path / "tb"
    export(experiment2, "tensorboard", out)
    config = load_config(experiment2, only=S.ONLY)
    runs = runs_of(experiment2)
    run, other = runs[CLIFF], runs["voting-arith-tiny-s-isolated-s1"]
    digest = G.cell_spec(config, run).eval_digest()
    # step 20 arrives after step 30 was exported; TensorBoard would hide step 30 were it appended
    write_result(Path(config.results_dir) / eval_result(run.id, 20), S.evaluation(run, 20, digest))
    # another cell's checkpoint is evaluated again and scores differently
    write_result(Path(config.results_dir) / eval_result(other.id, 10), S.evaluation(other, 10, G.cell_spec(config, other).eval_digest(), shift=0.1))
    line = export(experiment2, "tensorboard", out)
    assert line.startswith("Exported ") and "of 2 cells (2 rewritten whole)" in line
    for cell in (run.id, other.id):
        assert len(list((out / cell).glob("*tfevents*"))) == 1  # the old file is gone
    assert scalars(out / run.id)["eval/accuracy"] == [(s, f32(S.accuracy(run, s))) for s in (0, 10, 20, 30)]
    assert scalars(out / other.id)["eval/accuracy"] == [(0, f32(S.accuracy(other, 0))), (10, f32(S.accuracy(other, 10) + 0.1)),
                                                       (30, f32(S.accuracy(other, 30)))]  # fmt: skip
    assert len(scalars(out / run.id)["train/reward"]) == S.TRAIN_STEPS


def test_tensorboard_removes_what_an_interrupted_export_left(experiment2: Path, tmp_path: Path) -> None:
    need("tensorboard")
    S.write_study(experiment2, steps=(0, 10))
    out = tmp_path / "tb"
    export(experiment2, "tensorboard", out)
    state = json.loads((out / STATE_FILE).read_text())
    # an export killed after writing a file but before its state: the file is not recorded
    (recorded,) = state["cells"][CLIFF]["files"]
    stray = out / CLIFF / "events.out.tfevents.9999999999.matrixrl"
    stray.write_bytes((out / recorded).read_bytes())
    (out / CLIFF / ".partial.export").write_bytes(b"half")
    result = run_cli("export", "tensorboard", "-c", experiment2, *ONLY_ARGS, "--out", out)
    assert result.exit_code == 0, result.output
    assert result.stderr.strip() == "Removed 2 files an interrupted export left (their results are written again)."
    assert sorted(p.name for p in (out / CLIFF).iterdir()) == [Path(recorded).name]
    assert len(scalars(out / CLIFF)["train/reward"]) == S.TRAIN_STEPS


def test_export_user_errors(experiment2: Path, tmp_path: Path, monkeypatch) -> None:
    S.write_study(experiment2, steps=(0,))
    someone_elses = tmp_path / "mine"
    someone_elses.mkdir()
    (someone_elses / "notes.txt").write_text("keep")
    assert_user_error(
        run_cli("export", "tensorboard", "-c", experiment2, "--out", someone_elses),
        f"--out {someone_elses}: the folder has files but no {STATE_FILE}, so it is no matrixrl export; pass a new or empty folder",
    )
    assert sorted(p.name for p in someone_elses.iterdir()) == ["notes.txt"]
    assert_user_error(
        run_cli("export", "tensorboard", "-c", experiment2, "--project", "p"),
        "--project and --group name W&B runs; leave them out with tensorboard",
    )
    for tracker, modules in (("tensorboard", ["tensorboard"]), ("wandb", ["wandb"])):
        with monkeypatch.context() as patch:
            for module in modules:
                patch.setitem(sys.modules, module, None)  # as if not installed: importing it fails
            out = tmp_path / f"out-{tracker}"
            assert_user_error(
                run_cli("export", tracker, "-c", experiment2, "--out", out),
                f"matrixrl export {tracker} needs the {tracker} package, which is not installed; run: pip install 'matrixrl[{tracker}]'",
            )
            assert not out.exists()
    empty = tmp_path / "nothing-run"
    empty.mkdir()
    fresh = empty / "experiments.yaml"
    fresh.write_text(experiment2.read_text())
    assert_user_error(run_cli("export", "tensorboard", "-c", fresh), f"{empty / 'results'}: no results yet; run `matrixrl run` first")
    other_settings = tmp_path / "out-steps"  # results are stored, but none of the cells at these settings
    assert_user_error(
        run_cli("export", "tensorboard", "-c", experiment2, "--set", "train.steps=20", "--out", other_settings),
        f"{results_of(experiment2)}: no evaluations stored for the cells of this grid at these settings; run `matrixrl run` first",
    )
    assert not other_settings.exists()


# --- W&B ------------------------------------------------------------------------------------


def wandb_records(run_folder: Path) -> list:
    """The ``Record`` messages of an offline run folder's ``.wandb`` file.

    The file is W&B's transaction log: a 7-byte header (``:W&B``, magic, version),
    then LevelDB log blocks of 32 KiB, each record a 7-byte header (CRC, length,
    type: full, first, middle, last) and its bytes.
    """
    from wandb.proto import wandb_internal_pb2

    (path,) = run_folder.glob("*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pending, position, block = [], b"", 7, 32768
    while position + 7 <= len(data):
        left = block - position % block
        if left < 7:  # a block's tail too short for a header is padding
            position += left
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if kind == 0:
            position += left
            continue
        chunk = data[position + 7 : position + 7 + length]
        position += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def key_of(item) -> str:
    """An item's key: W&B records ``train/reward`` as the nested key ``["train", "reward"]``."""
    return item.key or "/".join(item.nested_key)


def wandb_run(run_folder: Path) -> tuple[dict, list[dict]]:
    """(the run record's fields, [each history row as {key: value}]) of one offline run folder."""
    run, rows = None, []
    for record in wandb_records(run_folder):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            config = {key_of(item): json.loads(item.value_json) for item in record.run.config.update if key_of(item) != "_wandb"}
            run = {"id": record.run.run_id, "name": record.run.display_name, "group": record.run.run_group,
                   "project": record.run.project, "resume": bool(record.run.resume), "config": config}  # fmt: skip
        elif kind == "history":
            rows.append({key_of(item): json.loads(item.value_json) for item in record.history.item if not key_of(item).startswith("_")}
                        | {"_step": record.history.step.num})  # fmt: skip
    return run, rows


@pytest.mark.slow  # W&B starts its service and writes one offline run per cell: ~1 s each
def test_wandb_offline_runs_one_per_cell_and_incremental(experiment2: Path, tmp_path: Path, monkeypatch) -> None:
    need("wandb")
    for variable in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(variable, str(tmp_path / variable.lower()))
    monkeypatch.setenv("WANDB_MODE", "online")  # the export is offline whatever the environment says
    two = ["--only", "workflow=voting", "--only", "seed=0"]
    S.write_study(experiment2, steps=(0, 10), runs=["voting-arith-tiny-s-shared-s0", "voting-arith-tiny-s-isolated-s0"])
    out = tmp_path / "wb"
    export(experiment2, "wandb", out, *two, "--project", "study")
    folders = sorted((out / "wandb").glob("offline-run-*"))
    assert len(folders) == 2
    runs = runs_of(experiment2)
    by_name = {wandb_run(f)[0]["name"]: f for f in folders}
    run, rows = wandb_run(by_name[CLIFF])
    assert run["project"] == "study" and run["group"] == "experiments" and not run["resume"]
    assert run["config"] == {"workflow": "voting", "task": "arith", "scale": "tiny-s", "policy": "shared", "seed": 0}
    train = [r for r in rows if "train/step" in r]
    evals = [r for r in rows if "eval/step" in r]
    assert [r["train/step"] for r in train] == list(range(1, S.TRAIN_STEPS + 1))
    assert [r["train/reward"] for r in train] == [S.reward(runs[CLIFF], s) for s in range(1, S.TRAIN_STEPS + 1)]
    assert train[0]["roles/generator/grad_norm"] == S.grad_norm(runs[CLIFF], "generator", 1)
    assert [(r["eval/step"], r["eval/accuracy"]) for r in evals] == [(s, S.accuracy(runs[CLIFF], s)) for s in (0, 10)]
    assert [r["_step"] for r in rows] == list(range(len(rows)))  # W&B's own step counts the rows
    state = json.loads((out / STATE_FILE).read_text())
    assert state["tracker"] == "wandb" and state["cells"][CLIFF]["next_step"] == len(rows)

    # a new checkpoint of one cell: one more folder for that run, resumed, with only the new row
    config = load_config(experiment2, only=S.ONLY)
    write_result(Path(config.results_dir) / eval_result(CLIFF, 20), S.evaluation(runs[CLIFF], 20, G.cell_spec(config, runs[CLIFF]).eval_digest()))
    export(experiment2, "wandb", out, *two, "--project", "study")
    new = sorted(set((out / "wandb").glob("offline-run-*")) - set(folders))
    assert len(new) == 1
    resumed, added = wandb_run(new[0])
    assert resumed["id"] == run["id"] and resumed["name"] == CLIFF and resumed["resume"]
    assert added == [{"eval/step": 20, "eval/accuracy": S.accuracy(runs[CLIFF], 20), "eval/se": 0.02,
                      "eval/pass@1": S.accuracy(runs[CLIFF], 20), "eval/pass@2": S.accuracy(runs[CLIFF], 20) + 0.1,
                      "eval/generator/answer_acc": S.accuracy(runs[CLIFF], 20),
                      "eval/aggregator/answer_acc": S.accuracy(runs[CLIFF], 20), "_step": len(rows)}]  # fmt: skip
    # unchanged: nothing written. (W&B's own service may still be appending to its debug
    # logs, under logs/ of each run, after the export returned: those are not the export's.)
    def written(folder):
        return {path: data for path, data in snapshot(folder).items() if "/logs/" not in path}

    before = written(out)
    assert export(experiment2, "wandb", out, *two, "--project", "study") == f"Nothing new to export: 2 cells unchanged in {out}."
    assert written(out) == before
