"""MemCollab's pipeline end to end on a real chat model's architecture, weights and chat template:
SmolLM2-135M-Instruct cut to its first layers (conftest's ``smollm2_shallow``, a third of the
compute) as weak, strong, distiller and labeller, on GSM8K, through `matrixrl run` (slow; CI runs it).

It checks that every stage ran for real on the model (trajectories it wrote, scored;
labels; distiller prompts and replies; retrieval recorded per evaluation problem) and that
the report's memory table reads it. It measures the pipeline, not the method: SmolLM2
writes no constraint the parser keeps (docs/memcollab.md), so its memories are empty, and an
empty memory must evaluate exactly as no memory.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import yaml

from conftest import once
from test_e2e import matrixrl

GSM8K = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "gsm8k"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def study(smollm2_shallow, tmp_path_factory) -> Path:
    if not (GSM8K / "train.jsonl").exists():
        from conftest import skip_or_fail

        skip_or_fail("SmolLM2 memory study", f"needs GSM8K at {GSM8K}", "the shared data folder beside the repository")
    return once(tmp_path_factory, "memcollab-smollm2", lambda folder: run_study(folder, smollm2_shallow))


def run_study(folder: Path, smollm2: Path) -> Path:
    """The memory study on SmolLM2 under two names, run in ``folder``; its experiments file."""
    smol = {"kind": "hf", "path": str(smollm2), "device": "cpu"}
    raw = {
        "results_dir": "results",
        "grid": {"workflow": ["single"], "task": ["gsm8k"], "scale": ["smol-weak", "smol-strong"],
                 "policy": ["shared"], "seed": [0], "memory": ["none", "own", "memcollab"]},
        "scales": {"smol-weak": smol, "smol-strong": smol},
        "tasks": {"gsm8k": {"kind": "gsm8k", "path": str(GSM8K), "split": "test", "train_split": "train",
                            "n_eval": 3, "eval_pick": "first", "seed": 0}},
        "policies": {"adapter": "lora"},
        "train": {"steps": 1, "eval_every": 1, "problems_per_step": 1, "group_size": 2, "max_new_tokens": 16,
                  "keep_checkpoints": "all"},
        "eval": {"temperature": 0, "max_new_tokens": 32},
        "memory": {"weak": "smol-weak", "strong": "smol-strong", "problems": 3, "temperature": 0.7,
                   "max_new_tokens": 32, "distill_max_new_tokens": 24, "label_max_new_tokens": 4},
    }
    config = folder / "experiments.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    matrixrl("run", "-c", str(config), "--cores", "2")
    return config


def read(results: Path, path: str) -> dict:
    return json.loads((results / path).read_text())


def test_every_stage_ran_on_the_model_and_was_recorded(study):
    results = study.parent / "results"
    weak = read(results, "memory/gsm8k/trajectories/smol-weak-k1.json")
    strong = read(results, "memory/gsm8k/trajectories/smol-strong-k1.json")
    assert len(weak["trajectories"]) == len(strong["trajectories"]) == 3
    assert all(t["tokens"] > 0 and t["completion"].strip() for t in weak["trajectories"])
    # One model under two names, sampled with each name's key: two different sets of trajectories.
    assert [t["completion"] for t in weak["trajectories"]] != [t["completion"] for t in strong["trajectories"]]
    labels = read(results, "memory/gsm8k/labels.json")
    assert len(labels["labels"]) == 3 + 3 and all(labels["replies"].values())  # building and evaluation problems
    own = read(results, "memory/gsm8k/distilled/own-smol-weak.json")
    assert own["pairs"] == 3 and len(own["prompts"]) == 3  # own memory: every problem, right or wrong
    assert all(p["reply"].startswith("1. When") and len(p["reply"]) > len("1. When") for p in own["prompts"])
    kept = sum(p["kept"] for p in own["prompts"])
    assert kept == len(own["entries"]) and kept + sum(own["dropped"].values()) >= 3  # every reply was read
    # The run's analysis may ingest before the last memory job ends; a report reads every result in.
    matrixrl("report", "-c", str(study), "--table", "memory")
    with sqlite3.connect(results / "matrixrl.sqlite") as db:
        assert db.execute("select count(*) from trajectories").fetchone()[0] == 6
        assert db.execute("select count(*) from distill_prompts").fetchone()[0] == sum(
            len(read(results, f"memory/gsm8k/distilled/{bank}.json")["prompts"])
            for bank in ("own-smol-weak", "own-smol-strong", "memcollab")
        )
        retrieved = db.execute("select count(distinct problem_id) from retrievals where memory = 'own'").fetchone()[0]
    assert retrieved == 3


def test_the_memory_table_reads_the_study_and_an_empty_memory_changes_nothing(study):
    results = study.parent / "results"
    # One model under two names shares its base evaluations: smol-weak's transfer and smol-strong's
    # own read one bank; each cell's copy of step 0 still names its own mode.
    for path in results.glob("cells/*/memory/*/step_*.json"):
        assert json.loads(path.read_text())["memory"] == path.parent.name, path
    rows = json.loads(matrixrl("report", "-c", str(study), "--table", "memory", "--format", "json").stdout)
    assert {(r["scale"], r["memory"]) for r in rows} == {
        (scale, mode) for scale in ("smol-weak", "smol-strong") for mode in ("none", "own", "memcollab")
    }
    for cell in ("single-gsm8k-smol-weak-shared-s0", "single-gsm8k-smol-strong-shared-s0"):
        for mode in ("own", "memcollab"):
            for step in (0, 1):
                with_memory = read(results, f"cells/{cell}/memory/{mode}/step_{step}.json")
                plain = read(results, f"cells/{cell}/eval/step_{step}.json")
                if with_memory["entries_mean"] == 0:  # nothing shown: the prompts, and so greedy answers, are the same
                    assert with_memory["accuracy"] == plain["accuracy"]
                    assert with_memory["response_tokens"] == plain["response_tokens"]
