"""The memory axis in the grid: its configuration errors, its jobs, their prompts, and real
Snakemake runs on two random chat models (a change reruns exactly what reads it)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from matrixrl.config import load_config
from matrixrl.errors import ConfigError

from chat_models import random_chat_model
from conftest import once
from test_e2e import matrixrl

MODES = ["none", "own", "transfer", "self_contrast", "memcollab"]


def memory_experiment(folder: Path, models: Path, **memory) -> Path:
    """Two one-cell runs (single on arith, each scale one random chat model), every memory mode."""
    raw = {
        "results_dir": "results",
        "grid": {"workflow": ["single"], "task": ["arith"], "scale": ["weak", "strong"], "policy": ["shared"],
                 "seed": [0], "memory": MODES},
        "scales": {
            "weak": {"kind": "hf", "path": str(models / "weak"), "device": "cpu"},
            "strong": {"kind": "hf", "path": str(models / "strong"), "device": "cpu"},
        },
        "tasks": {"arith": {"kind": "arith", "digits": 1, "terms": 2, "n_eval": 4}},
        "train": {"steps": 2, "eval_every": 1, "problems_per_step": 2, "group_size": 2, "max_new_tokens": 4,
                  "keep_checkpoints": "all"},
        "eval": {"max_new_tokens": 4},
        "memory": {"weak": "weak", "strong": "strong", "labeller": "strong", "problems": 6, "samples": 2,
                   "max_new_tokens": 8, "distill_max_new_tokens": 8, "label_max_new_tokens": 4, **memory},
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "experiments.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def weak_and_strong(folder: Path) -> Path:
    random_chat_model(folder / "weak", seed=1)
    random_chat_model(folder / "strong", seed=2)
    return folder


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    return once(tmp_path_factory, "memory-models", weak_and_strong)


def config_only(folder: Path) -> Path:
    """The memory experiment, its model folders empty: enough to load it (nothing is loaded)."""
    for name in ("weak", "strong"):
        (folder / name).mkdir(exist_ok=True)
    return memory_experiment(folder, folder)


def config_error(path: Path, *sets: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(path, sets=list(sets))
    return str(caught.value)


# --- configuration ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sets, message",
    [
        (["grid.memory=[none, recall]"], "grid.memory: unknown memory mode 'recall'; use one of: none, own, transfer, self_contrast, memcollab"),
        (["grid.memory=[none, memcolab]"], "grid.memory: unknown memory mode 'memcolab'; did you mean memcollab?"),
        (["memory.weak=big"], "memory.weak: unknown scale 'big'; use one of: weak, strong, tiny or define it under 'scales:'"),
        (["memory.weak=wek"], "memory.weak: unknown scale 'wek'; did you mean weak? (or define it under 'scales:')"),
        (["memory.distiller=tiny"], "memory.distiller: scale 'tiny' plays compact prompts; memory is read as natural-language guidance, so it needs a chat-style scale (kind: hf, prompt_style: chat)"),
        (["grid.scale=[weak, tiny]"], "grid.memory: own, transfer, self_contrast, memcollab on scale 'tiny', which plays compact prompts; memory needs chat-style scales (kind: hf, prompt_style: chat); use grid.memory: [none] for compact scales"),
        (["memory.strong=weak"], "grid.memory: transfer needs two different models, but memory.weak and memory.strong are both 'weak'; name two scales (they may load the same model)"),
        (["memory.roles=[generator, critic]"], "memory.roles: unknown role 'critic'"),
        (["grid.memory=[own, own]"], "grid.memory: values repeat in ['own', 'own']; list each once"),
    ],
)
def test_memory_configuration_errors_name_the_key_and_the_fix(tmp_path, sets, message):
    path = config_only(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["scales"]["tiny"] = {"kind": "tiny"}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert message in config_error(path, *sets)


def test_a_memory_mode_without_a_memory_section_or_on_a_third_scale_is_an_error(tmp_path):
    path = config_only(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["scales"]["third"] = dict(raw["scales"]["weak"])
    del raw["memory"]
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert config_error(path) == (
        f"{path}: grid.memory: own, transfer, self_contrast, memcollab needs a memory: section; add memory: "
        "{weak: SCALE, strong: SCALE} naming two chat-style scales (docs/memcollab.md)"
    )
    raw["memory"] = {"weak": "weak", "strong": "strong"}
    raw["grid"]["scale"] = ["weak", "third"]
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert "grid.memory: scale 'third' is neither memory.weak ('weak') nor memory.strong ('strong')" in config_error(path)
    # Without memory modes, nothing is asked of the scales: a compact grid is untouched.
    cfg = load_config(path, sets=["grid.memory=[none]"])
    from matrixrl.grid import plan_memory

    assert plan_memory(cfg).modes == ()


# --- the jobs a memory grid plans -------------------------------------------------------------


def test_each_mode_reads_its_bank_and_banks_are_built_once(tmp_path):
    from matrixrl.dag import Graph

    cfg = load_config(config_only(tmp_path))
    jobs = Graph(cfg).jobs
    by_rule = {}
    for job in jobs:
        by_rule.setdefault(job.rule, []).append(job)
    # (weak, 1), (strong, 1) for own/transfer/memcollab; (weak, 2), (strong, 2) for self-contrast.
    assert sorted(j.output for j in by_rule["collect"]) == [
        "memory/arith/trajectories/strong-k1.json", "memory/arith/trajectories/strong-k2.json",
        "memory/arith/trajectories/weak-k1.json", "memory/arith/trajectories/weak-k2.json",
    ]
    assert [j.output for j in by_rule["label"]] == ["memory/arith/labels.json"]
    # transfer reads the other model's own memory: five banks, not eight.
    assert sorted(Path(j.output).stem for j in by_rule["bank"]) == [
        "memcollab", "own-strong", "own-weak", "self_contrast-strong", "self_contrast-weak",
    ]
    banks = {(j.cell.split("-")[2], Path(j.output).parent.name): j.inputs[1] for j in by_rule["evaluate_memory"]}
    assert banks[("weak", "transfer")] == "memory/arith/banks/own-strong.json"
    assert banks[("strong", "transfer")] == "memory/arith/banks/own-weak.json"
    assert banks[("weak", "memcollab")] == banks[("strong", "memcollab")] == "memory/arith/banks/memcollab.json"
    assert len(by_rule["evaluate_memory"]) == 2 * 4 * 2  # cells x modes x steps 1, 2
    assert len(by_rule["evaluate_base_memory"]) == 2 * 4  # step 0: one per base evaluation and bank
    # A cell's checkpoints are pruned only after its memory evaluations too.
    retain = next(j for j in by_rule["retain"] if j.cell == "single-arith-weak-shared-s0")
    assert "cells/single-arith-weak-shared-s0/memory/own/step_2.json" in retain.inputs


def test_evaluation_prompts_hold_exactly_the_retrieved_constraints_in_the_guided_roles():
    from matrixrl.jobs.memcollab import Guide
    from matrixrl.memcollab import Entry, Label
    from matrixrl.memcollab.specs import Retrieval
    from matrixrl.models.tiny import build_char_tokenizer
    from matrixrl.tasks.base import Problem
    from matrixrl.workflows import build_workflow
    from matrixrl.workflows.styles import build_style
    from chat_models import TEMPLATE

    algebra, geometry = Label("algebra", "linear equations"), Label("geometry", "area")
    entries = [
        Entry("When solving for x, enforce isolating x; avoid sign slips.", "s1", "solve 2x + 3 = 7 for x", algebra, ("w",), "own", "d"),
        Entry("When an equation has fractions, enforce clearing them first.", "s2", "solve x/2 = 5 for x", algebra, ("w",), "own", "d"),
        Entry("When finding an area, enforce units squared.", "s3", "area of a 2 by 3 rectangle", geometry, ("w",), "own", "d"),
    ]
    queries = [Problem("q1", "solve 2x + 5 = 9 for x", "2"), Problem("q2", "what is the capital of France", "Paris")]
    labels = {"q1": algebra, "q2": Label("other", "other")}
    guide = Guide("own", "own-w", entries, labels, Retrieval(top_p=1, per_problem=3, limit=None, roles=("generator", "aggregator")))
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = TEMPLATE
    plain = build_workflow("voting", {"n_votes": 2}, build_style("chat", "math", tokenizer))
    guided = build_workflow("voting", {"n_votes": 2}, build_style("chat", "math", tokenizer))
    recorded = guide.apply(guided.style, queries)

    # q1 is labelled algebra: of its two algebra sources s1 shares "2x" with it too (top_p 1: s1 alone);
    # q2's label has no source, so it is shown nothing.
    assert [(r.problem_id, r.entries) for r in recorded["retrievals"]] == [("q1", [0]), ("q2", [])]
    assert recorded["entries_mean"] == 0.5 and (recorded["memory"], recorded["bank"]) == ("own", "own-w")
    shown = guided.style.generator(queries[0])
    assert entries[0].text in shown and entries[1].text not in shown and entries[2].text not in shown
    assert shown.count("- When") == 1
    assert guided.style.aggregator(queries[0], ["a", "b"]).count(entries[0].text) == 1
    # Unguided roles, and a problem shown nothing, keep their prompts byte for byte.
    assert guided.style.generator(queries[1]) == plain.style.generator(queries[1])
    assert guided.style.evaluator(queries[0], "draft") == plain.style.evaluator(queries[0], "draft")


# --- real runs ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ran(models, tmp_path_factory) -> Path:
    """One finished run of the memory grid (once per session: conftest's ``once``); tests work on copies of it."""

    def run(folder: Path) -> Path:
        matrixrl("run", "-c", str(memory_experiment(folder, models)), "--cores", "2")
        return folder

    return once(tmp_path_factory, "memory-run", run)


@pytest.fixture
def copy(ran, tmp_path) -> Path:
    folder = tmp_path / "copy"
    shutil.copytree(ran, folder, symlinks=True)
    return folder / "experiments.yaml"


def outputs(results: Path) -> dict[str, tuple[int, int]]:
    """Every result file's (inode, mtime): a rewritten file (atomic rename) changes both."""
    return {
        str(path.relative_to(results)): (path.stat().st_ino, path.stat().st_mtime_ns)
        for path in results.rglob("*.json")
        if "logs" not in path.parts and ".snakemake" not in path.parts and ".matrixrl" not in path.parts
    }


@pytest.mark.slow
def test_a_memory_grid_runs_every_job_and_records_what_it_built(ran):
    results = ran / "results"
    plan = json.loads(matrixrl("plan", "-c", str(ran / "experiments.yaml"), "--format", "json").stdout)
    assert {job["status"] for job in plan} == {"done"}
    memcollab = json.loads((results / "memory/arith/distilled/memcollab.json").read_text())
    trajectories = json.loads((results / "memory/arith/trajectories/weak-k2.json").read_text())
    assert len(trajectories["trajectories"]) == 6 * 2 and {t["sample"] for t in trajectories["trajectories"]} == {0, 1}
    assert memcollab["memory"] == "memcollab" and len(memcollab["prompts"]) == memcollab["pairs"]
    labels = json.loads((results / "memory/arith/labels.json").read_text())
    assert len(labels["labels"]) == 6 + 4  # building and evaluation problems
    step = json.loads((results / "cells/single-arith-weak-shared-s0/memory/transfer/step_2.json").read_text())
    assert (step["memory"], step["bank"], len(step["retrievals"])) == ("transfer", "own-strong", 4)
    step0 = json.loads((results / "cells/single-arith-weak-shared-s0/memory/transfer/step_0.json").read_text())
    assert step0["base_eval"] is not None and step0["seconds"] == 0.0


def rerun_exactly_what_plan_says(config: Path, *sets: str) -> set[str]:
    """Plan with ``sets``, run, and check the run rewrote exactly the planned outputs; returns them."""
    results = config.parent / "results"
    args = [arg for s in sets for arg in ("--set", s)]
    planned = json.loads(matrixrl("plan", "-c", str(config), "--format", "json", *args).stdout)
    pending = {job["output"] for job in planned if job["status"] == "pending"}
    before = outputs(results)
    matrixrl("run", "-c", str(config), "--cores", "2", *args)
    after = outputs(results)
    rewritten = {path for path, signature in after.items() if before.get(path) != signature}
    assert rewritten == pending
    again = json.loads(matrixrl("plan", "-c", str(config), "--format", "json", *args).stdout)
    assert {job["status"] for job in again} == {"done"}
    return pending


@pytest.mark.slow
def test_a_new_distiller_reruns_distillation_and_what_reads_it_and_nothing_else(copy):
    from test_status import load, own_pending, snakemakes_pending

    cfg = load(copy, copy.parent / "results", "memory.distiller=weak")
    assert own_pending(cfg) == snakemakes_pending(cfg)
    pending = rerun_exactly_what_plan_says(copy, "memory.distiller=weak")
    assert sum(o.startswith("memory/arith/distilled/") for o in pending) == 5
    assert sum(o.startswith("memory/arith/banks/") for o in pending) == 5
    assert sum(o.startswith("base/") and "/memory/" in o for o in pending) == 8
    assert sum(o.startswith("cells/") and "/memory/" in o for o in pending) == 2 * 4 * 3
    assert {o for o in pending if o.endswith("retained.json")} == {
        "cells/single-arith-weak-shared-s0/retained.json", "cells/single-arith-strong-shared-s0/retained.json"
    }  # it waits for every evaluation of its cell; it deletes nothing new under keep_checkpoints: all
    assert len(pending) == 5 + 5 + 8 + 24 + 2  # no trajectory, label, training or plain evaluation


@pytest.mark.slow
def test_a_new_retrieval_setting_reruns_only_the_memory_evaluations(copy):
    pending = rerun_exactly_what_plan_says(copy, "memory.top_p=1")
    assert all("/memory/" in o and (o.startswith("cells/") or o.startswith("base/")) or o.endswith("retained.json") for o in pending)
    assert sum("/memory/" in o for o in pending) == 8 + 24


def test_the_gpu_example_plans_offline():
    from matrixrl.dag import Graph

    cfg = load_config(Path(__file__).parent.parent / "examples" / "memcollab.yaml")
    counts = {}
    for job in Graph(cfg).jobs:
        counts[job.rule] = counts.get(job.rule, 0) + 1
    # 2 workflows x 2 scales x 3 seeds = 12 cells, 11 checkpoints each, 4 memory modes.
    assert (counts["collect"], counts["label"], counts["distill"], counts["bank"]) == (4, 1, 5, 5)
    assert counts["evaluate_memory"] == 12 * 10 * 4 and counts["copy_base_memory_eval"] == 12 * 4


# --- training with a memory (memory.train) ---------------------------------------------------------


def test_memory_train_is_an_axis_and_other_memory_settings_are_not(tmp_path):
    from matrixrl import grid as G
    from matrixrl.dag import Graph

    path = config_only(tmp_path)
    cfg = load_config(path, sets=["grid.memory=[none]", "grid.memory.train=[null, own]"])
    cells = {cell.id: G.cell_spec(cfg, cell) for cell in G.runs(cfg)}
    assert sorted(cells) == [
        "single-arith-strong-shared-s0", "single-arith-strong-shared-s0-train=own",
        "single-arith-weak-shared-s0", "single-arith-weak-shared-s0-train=own",
    ]
    trained = cells["single-arith-weak-shared-s0-train=own"].memory
    assert (trained.mode, trained.bank.bank, trained.labeller.name) == ("own", "own-weak", "strong")
    # A cell without memory keeps the spec digests it had before memory.train existed.
    plain = cells["single-arith-weak-shared-s0"]
    assert plain.memory is None and "memory" not in plain.science
    jobs = {job.output: job for job in Graph(cfg).jobs}
    train = jobs["cells/single-arith-weak-shared-s0-train=own/train.json"]
    assert "memory/arith/banks/own-weak.json" in train.inputs
    assert jobs["cells/single-arith-weak-shared-s0/train.json"].inputs == ("base/weak/base.json",)
    # The banks training reads are built though grid.memory lists no mode; nothing is evaluated with memory.
    assert sorted(o for o in jobs if o.startswith("memory/arith/banks/")) == [
        "memory/arith/banks/own-strong.json", "memory/arith/banks/own-weak.json"
    ]
    assert not any(job.rule == "evaluate_memory" for job in jobs.values())
    # A new distiller changes what the memory-trained cells train from, and nothing else's.
    other = load_config(path, sets=["grid.memory=[none]", "grid.memory.train=[null, own]", "memory.distiller=weak"])
    again = {cell.id: G.cell_spec(other, cell).train_digest() for cell in G.runs(other)}
    assert {c for c in cells if again[c] != cells[c].train_digest()} == {
        "single-arith-weak-shared-s0-train=own", "single-arith-strong-shared-s0-train=own"
    }
    assert config_error(path, "grid.memory.top_p=[1, 3]") == (
        f"{path} with --set 'grid.memory.top_p=[1, 3]': grid.memory.top_p: the memory is built once per study, so its settings cannot be an axis; "
        "sweep memory.train (training with or without a memory), or use another results_dir"
    )


def test_training_with_memory_labels_each_drawn_problem_and_shows_its_constraints(models, tmp_path):
    import numpy as np

    from matrixrl import grid as G
    from matrixrl.jobs.memcollab import TrainingGuide
    from matrixrl.memcollab import Entry, Label, MemoryBank, retrieve
    from matrixrl.results import BankResult, write_result
    from matrixrl.train.cell import build_cell
    from matrixrl.train.trainer import GrpoRun, grpo_step, make_optimizers

    cfg = load_config(memory_experiment(tmp_path, models), sets=["grid.memory=[none]", "memory.train=own"])
    spec = G.cell_spec(cfg, next(c for c in G.runs(cfg) if c.scale == "weak"))
    other = Label("other", "other")
    entries = [
        Entry("When adding two digits, enforce carrying the ten; avoid dropping it.", "9+4", "9+4", other, ("weak",), "own", "d"),
        Entry("When a sum is asked, enforce adding every term.", "7+1", "7+1", other, ("weak",), "own", "d"),
        Entry("When an equation is given, enforce isolating x.", "x", "solve x", Label("algebra", "linear equations"), ("weak",), "own", "d"),
    ]
    bank = tmp_path / "bank.json"
    write_result(bank, BankResult(task="arith", memory="own-weak", mode="own", entries=[e.to_dict() for e in entries]))
    guide = TrainingGuide.load(spec.memory, bank, models / "strong", "math", spec.prompts)
    cell = build_cell(spec, tmp_path)

    problems = cell.task.train_problems(np.random.default_rng(0), 3)
    guide.apply(cell.style, problems)
    assert set(guide.labels) == {p.id for p in problems}  # the labeller labelled each drawn problem
    guide.labels.update({p.id: other for p in problems})  # now each is shown its other/other constraints
    recorded = guide.apply(cell.style, problems)
    assert (recorded["memory"], recorded["bank"]) == ("own", spec.memory.bank.bank)
    shown = {row.problem_id: [entries[i] for i in row.entries] for row in recorded["retrievals"]}
    for problem in problems:
        expected = retrieve(MemoryBank(entries), problem, other, top_p=3, per_problem=3)
        assert shown[problem.id] == expected and expected
        prompt = cell.style.generator(problem)
        assert {e.text for e in entries if e.text in prompt} == {e.text for e in expected}

    # Every step's rollouts are prompted after its problems were guided.
    prompts, called = [], []
    generate = cell.make_generate(cell.new_policy(), max_new_tokens=2, temperature=1.0, sample=True)

    def recording(role, batch):
        prompts.extend(batch)
        return generate(role, batch)

    def prepare(problems):
        called.append([p.id for p in problems])
        guide.labels.update({p.id: other for p in problems})
        guide.apply(cell.style, problems)

    policy = cell.new_policy()
    run = GrpoRun(
        seed=0, policy=policy, optimizers=make_optimizers(policy, spec.train), workflow=cell.workflow,
        task=cell.task, generate=recording, pad_token_id=cell.tokenizer.pad_token_id, cfg=spec.train, prepare=prepare,
    )
    grpo_step(run, 0)
    assert len(called) == 1 and len(called[0]) == spec.train.problems_per_step
    assert prompts and all(entries[0].text in p or entries[1].text in p for p in prompts)


def test_a_copied_memory_step_0_names_the_cells_own_mode(tmp_path):
    from matrixrl import grid as G
    from matrixrl.jobs.evaluate import copy_base_memory_eval
    from matrixrl.grid import memory_evals, plan_memory
    from matrixrl.results import MemoryEvalResult, read_result, write_result

    cfg = load_config(config_only(tmp_path))
    specs = {cell.id: G.cell_spec(cfg, cell) for cell in G.runs(cfg)}
    evals = memory_evals(cfg, specs, plan_memory(cfg))
    weak_transfer, strong_own = evals[("single-arith-weak-shared-s0", "transfer")], evals[("single-arith-strong-shared-s0", "own")]
    assert weak_transfer.bank == strong_own.bank  # both read own-strong
    source = tmp_path / "base.json"
    write_result(source, MemoryEvalResult(
        cell="the base model", step=0, accuracy=0.5, n=2, n_correct=1, seconds=3.0, memory="transfer",
        bank="own-strong", entries_mean=1.0, spec_digest=weak_transfer.base_digest(),
    ))
    copy_base_memory_eval(strong_own, source, tmp_path / "step_0.json", log=lambda m: None)
    copied = read_result(tmp_path / "step_0.json", MemoryEvalResult)
    assert (copied.cell, copied.memory, copied.bank, copied.seconds) == ("single-arith-strong-shared-s0", "own", "own-strong", 0.0)
    assert (copied.spec_digest, copied.base_eval) == (strong_own.digest(), weak_transfer.base_digest())
