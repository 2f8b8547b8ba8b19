"""Math tasks from files: GSM8K, MATH-style and generic records; splits; equivalence; errors."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from matrixrl.config import load_config, validate
from matrixrl.errors import ConfigError
from matrixrl.tasks import build_task
from matrixrl.tasks.equivalence import equivalent, equivalent_batch
from matrixrl.tasks.mathdata import Settings as MathSettings

from conftest import EXPERIMENTS, REPO

FIXTURES = Path(__file__).parent / "fixtures"
GSM8K = REPO.parent / "shared" / "data" / "gsm8k"
needs_gsm8k = pytest.mark.skipif(
    not (GSM8K / "test.jsonl").is_file(), reason=f"GSM8K is not at {GSM8K} (the shared data folder beside the repo)"
)


def math_task(name="m", **settings):
    return build_task(name, MathSettings(**settings))


def error_of(call) -> str:
    with pytest.raises(ConfigError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    return message


# --- equivalence -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reference, answer",
    [
        ("0.5", "1/2"),
        ("0.5", "\\frac{1}{2}"),
        ("\\frac12", "0.5"),
        ("\\frac{1}{2}", "1/2"),
        ("1000", "1,000"),
        ("1,080", "1080"),
        ("1000000", "1,000,000"),
        ("5", "$5"),
        ("5", "\\$5"),
        ("5", "5 dollars"),
        ("72", "\\$72.00"),
        ("10", "10\\text{ cm}"),
        ("18", "\\boxed{18}"),
        ("18", "The answer is 18."),
        ("3", "3.0"),
        ("-3", "-3"),
        ("0.25", "25\\%"),
        ("2\\sqrt{2}", "\\sqrt{8}"),
        ("\\frac{3}{4}", "\\dfrac{3}{4}"),
    ],
)
def test_equivalent_answers_match(reference: str, answer: str) -> None:
    assert equivalent(reference, answer, timeout_s=5)


@pytest.mark.parametrize(
    "reference, answer",
    [
        ("-3", "3"),
        ("18", "19"),
        ("1,000", "100"),
        ("2", "2\\sqrt{3}"),  # a LaTeX answer is read whole, not as its first number
        ("1/3", "0.333"),
        ("5", ""),
        ("5", "five"),
        ("0.5", "5"),
    ],
)
def test_wrong_answers_are_rejected(reference: str, answer: str) -> None:
    assert not equivalent(reference, answer, timeout_s=5)


def test_equivalence_works_and_stays_bounded_in_a_worker_thread() -> None:
    # Snakemake runs evaluate jobs as threads; math-verify's signal timeouts cannot
    # work there, so scoring goes to a helper process that still bounds a runaway answer.
    pairs = [("0.5", "\\frac{1}{2}"), ("1", "\\boxed{10^{10^{10}}}"), ("1000", "1,000"), ("7", "8")]
    results: list = []
    began = time.perf_counter()
    worker = threading.Thread(target=lambda: results.append(equivalent_batch(pairs, timeout_s=1)))
    worker.start()
    worker.join(timeout=120)
    assert not worker.is_alive()
    assert results == [[True, False, True, False]]
    assert time.perf_counter() - began < 60


def test_a_runaway_answer_times_out_in_the_main_thread() -> None:
    assert equivalent_batch([("1", "\\boxed{10^{10^{10}}}"), ("2", "2")], timeout_s=1) == [False, True]


# --- GSM8K from the shared data folder ---------------------------------------------------


@needs_gsm8k
def test_gsm8k_folder_splits_test_for_eval_and_train_for_training() -> None:
    task = math_task("gsm8k", kind="gsm8k", path=str(GSM8K), train_split="train", n_eval=50, eval_pick="first")
    assert task.family == "math"
    evaluated = task.eval_problems()
    assert len(evaluated) == 50
    first = json.loads((GSM8K / "test.jsonl").open().readline())
    assert evaluated[0].question == first["question"] and evaluated[0].answer == "18"  # after '####'
    test_questions = {json.loads(line)["question"] for line in (GSM8K / "test.jsonl").open()}
    train_questions = {json.loads(line)["question"] for line in (GSM8K / "train.jsonl").open()}
    drawn = task.train_problems(np.random.default_rng(0), 500)
    assert all(p.question in train_questions for p in drawn)
    assert not {p.id for p in drawn} & {p.id for p in evaluated}
    assert all(p.question in test_questions for p in evaluated)


@needs_gsm8k
def test_gsm8k_answers_score_by_equivalence() -> None:
    task = math_task("gsm8k", kind="gsm8k", path=str(GSM8K / "test.jsonl"), n_eval=20, eval_pick="first")
    problem = task.eval_problems()[0]  # Janet's ducks: $18
    answers = ["18", "$18", "18 dollars", "\\boxed{18}", "18.00", "17", "", "1 8"]
    assert task.score_batch([problem] * len(answers), answers) == [1, 1, 1, 1, 1, 0, 0, 0]
    with_commas = [p for p in task._split[1] if "," in p.answer][0]  # e.g. "2,125"
    assert task.score(with_commas, with_commas.answer.replace(",", "")) == 1.0


@needs_gsm8k
def test_one_file_splits_into_disjoint_eval_and_train_sets() -> None:
    task = math_task("gsm8k", kind="gsm8k", path=str(GSM8K / "test.jsonl"), n_eval=1000)
    evaluated, train = task._split
    eval_ids, train_ids = {p.id for p in evaluated}, {p.id for p in train}
    assert len(eval_ids) == 1000 and not eval_ids & train_ids
    assert len(eval_ids | train_ids) == len({json.loads(l)["question"] for l in (GSM8K / "test.jsonl").open()})
    drawn = task.train_problems(np.random.default_rng(3), 2000)  # more than the rest: with replacement
    assert {p.id for p in drawn} <= train_ids


@needs_gsm8k
def test_the_seeded_pick_is_reproducible_and_depends_on_the_seed() -> None:
    settings = dict(kind="gsm8k", path=str(GSM8K / "test.jsonl"), n_eval=30)
    one = [p.id for p in math_task(**settings, seed=1).eval_problems()]
    assert one == [p.id for p in math_task(**settings, seed=1).eval_problems()]
    assert one != [p.id for p in math_task(**settings, seed=2).eval_problems()]
    first = [p.id for p in math_task(**settings, eval_pick="first").eval_problems()]
    assert one != first and len(set(one)) == 30


@needs_gsm8k
def test_the_example_config_points_at_the_shared_gsm8k_and_plans(tmp_path: Path) -> None:
    from conftest import run_cli

    example = REPO / "examples" / "gsm8k.yaml"
    cfg = load_config(example)
    assert Path(cfg.tasks["gsm8k"].path) == GSM8K.resolve()
    assert cfg.grid.task == ["gsm8k"] and set(cfg.grid.workflow) == {"single", "voting"}
    result = run_cli("plan", "-c", example, "--set", f"results_dir={tmp_path / 'results'}", "--format", "json")
    assert result.exit_code == 0, result.output
    trained = {job["cell"] for job in json.loads(result.stdout) if job["rule"] == "train"}
    # single has one role: its isolated cell is its shared run, trained once.
    runs = {("single", "shared")} | {("voting", p) for p in cfg.grid.policy}
    assert trained == {f"{w}-gsm8k-{s}-{p}-s0" for w, p in runs for s in cfg.grid.scale}


# --- MATH-style and generic records --------------------------------------------------------


def test_math_style_records_take_answer_or_the_last_boxed() -> None:
    task = math_task(kind="math", path=str(FIXTURES / "math_competition.jsonl"), n_eval=2, eval_pick="first")
    evaluated, train = task._split
    assert [p.answer for p in evaluated + train] == ["\\frac{3}{4}", "4", "5\\sqrt{2}", "3.14"]
    assert task.score(evaluated[0], "0.75") == 1.0 and task.score(evaluated[0], "3/5") == 0.0
    assert task.score(train[0], "\\sqrt{50}") == 1.0


def test_generic_jsonl_and_the_same_records_as_parquet(tmp_path: Path) -> None:
    import pandas as pd

    source = FIXTURES / "math_problems.jsonl"
    records = [json.loads(line) for line in source.open()]
    pd.DataFrame([{**r, "answer": str(r["answer"])} for r in records]).to_parquet(tmp_path / "test.parquet")
    from_jsonl = math_task(kind="math_generic", path=str(source), n_eval=3, eval_pick="first")
    from_parquet = math_task(kind="math_generic", path=str(tmp_path), n_eval=3, eval_pick="first")  # folder: test.parquet
    assert from_jsonl._split == from_parquet._split
    answers = {p.question: p.answer for p in from_jsonl._split[0] + from_jsonl._split[1]}
    assert answers["How many minutes are in 2.5 hours?"] == "150"  # a number in the file becomes text
    by_question = {p.question: p for p in from_jsonl._split[0] + from_jsonl._split[1]}
    assert from_jsonl.score(by_question["What is half of 3?"], "1.5") == 1.0
    assert from_jsonl.score(by_question["A shop sells 1,250 pens a day. How many pens does it sell in 4 days?"], "5000") == 1.0


def test_a_repeated_question_counts_once_and_splits_stay_disjoint(tmp_path: Path) -> None:
    rows = [{"prompt": f"q{i % 5}", "answer": str(i % 5)} for i in range(10)]
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows + [{"prompt": "q9", "answer": "9"}]))
    task = math_task(kind="math_generic", path=str(tmp_path), train_split="train", n_eval=None)
    evaluated, train = task._split
    assert len(evaluated) == 5  # the whole evaluation split, each question once
    assert [p.question for p in train] == ["q9"]  # train.jsonl less the evaluated questions


# --- errors ---------------------------------------------------------------------------------


def config_file(tmp_path: Path, task: dict) -> Path:
    raw = yaml.safe_load(EXPERIMENTS.read_text())
    raw["tasks"] = {"m": task}
    raw["grid"]["task"] = ["m"]
    path = tmp_path / "E.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_a_missing_path_names_the_task_and_the_resolved_file(tmp_path: Path) -> None:
    path = config_file(tmp_path, {"kind": "gsm8k", "path": "data/gsm8k.jsonl"})
    assert error_of(lambda: load_config(path)) == (
        f"{path}: tasks.m.path: no such file or folder {tmp_path / 'data' / 'gsm8k.jsonl'}; "
        "fix the path or put the data there"
    )


def test_paths_are_relative_to_the_experiments_file(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "test.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n{"prompt": "2+2", "answer": "4"}\n')
    path = config_file(tmp_path, {"kind": "math_generic", "path": "data", "n_eval": 1})
    monkeypatch.chdir(REPO)
    assert load_config(path).tasks["m"].path == str(tmp_path / "data")


def test_a_folder_without_the_split_lists_the_splits_it_has(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text("{}\n")
    (tmp_path / "data" / "dev.parquet").write_text("")
    path = config_file(tmp_path, {"kind": "gsm8k", "path": "data"})
    assert error_of(lambda: load_config(path)) == (
        f"{path}: tasks.m.split: {tmp_path / 'data'} has no test.jsonl, test.jsonl.gz, test.json, "
        "test.parquet; splits found there: dev, train"
    )


def test_train_split_needs_a_folder(tmp_path: Path) -> None:
    path = config_file(tmp_path, {"kind": "math_generic", "path": str(FIXTURES / "math_problems.jsonl"), "train_split": "train"})
    assert error_of(lambda: load_config(path)) == (
        f"{path}: tasks.m.train_split: path {FIXTURES / 'math_problems.jsonl'} is one file, not a folder of "
        "splits; remove train_split (training then draws from the problems left after n_eval) or point path at a folder"
    )


@pytest.mark.parametrize(
    "task, message",
    [
        ({"kind": "gsm8k"}, "tasks.m: set path (a file or folder of the data) or hub (a dataset id)"),
        ({"kind": "gsm8k", "path": "x", "hub": "openai/gsm8k"}, "tasks.m: set either path (local data) or hub (a dataset id), not both"),
        ({"kind": "gsm8k", "path": "x", "hub_config": "main"}, "tasks.m: hub_config applies to hub datasets only; remove it or set hub"),
        ({"kind": "gsm8k", "path": "x", "n_eval": None}, "tasks.m: n_eval: none evaluates the whole split and leaves nothing to train on; set train_split or a number"),
        ({"kind": "gsm8k", "path": "x", "n_eval": 0}, "tasks.m.n_eval: must be greater than or equal to 1 (got 0)"),
        ({"kind": "gsm8k", "path": "x", "eval_pick": "last"}, "tasks.m.eval_pick: must be 'first' or 'random' (got 'last')"),
        (
            {"kind": "gsm8k", "path": "x", "digits": 2},
            "tasks.m.digits: unknown key; valid keys here: path, hub, hub_config, split, train_split, n_eval, "
            "eval_pick, seed, kind, verify_timeout_s",
        ),
        ({"kind": "gms8k"}, "tasks.m.kind: unknown kind 'gms8k'; did you mean gsm8k?"),
        (
            {"kind": "sorting"},
            "tasks.m.kind: unknown kind 'sorting'; use one of: arith, pyfunc, gsm8k, math, math_generic, humaneval, code_generic"
            "; or, if a plugin defines it, name its module in MATRIXRL_PLUGINS (docs/extending.md)",
        ),
    ],
)
def test_task_config_errors(task: dict, message: str) -> None:
    raw = yaml.safe_load(EXPERIMENTS.read_text())
    raw["tasks"] = {"m": task}
    raw["grid"]["task"] = ["m"]
    assert error_of(lambda: validate(raw, "E.yaml")) == f"E.yaml: {message}"


def test_n_eval_larger_than_the_split_is_one_line() -> None:
    task = math_task("m", kind="math_generic", path=str(FIXTURES / "math_problems.jsonl"), n_eval=6)
    assert error_of(task.eval_problems) == (
        "tasks.m.n_eval: 6 but the evaluation split has 6 problems; use fewer than 6"
    )


def test_a_record_without_its_field_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "a", "answer": "x #### 1"}\n{"question": "b"}\n')
    task = math_task("g", kind="gsm8k", path=str(bad), n_eval=1)
    assert error_of(task.eval_problems) == f"tasks.g.path: {bad} record 2 has no 'answer' field"
    bad.write_text('{"question": "a", "answer": "no final line"}\n')
    assert error_of(math_task("g", kind="gsm8k", path=str(bad), n_eval=1).eval_problems) == (
        f"tasks.g.path: {bad} record 1: its answer has no final '#### <number>' line"
    )


def test_an_unreadable_file_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "test.jsonl"
    bad.write_text('{"prompt": "a", "answer": 1}\n{not json\n')
    message = error_of(math_task("m", kind="math_generic", path=str(bad), n_eval=1).eval_problems)
    assert message.startswith(f"tasks.m.path: cannot read {bad}: ")


def test_an_unreachable_hub_says_to_download_and_use_path() -> None:
    task = math_task("gsm8k", kind="gsm8k", hub="openai/gsm8k", hub_config="main")  # HF_HUB_OFFLINE=1 (conftest)
    assert error_of(task.eval_problems) == (
        "tasks.gsm8k.hub: cannot reach the Hugging Face hub to load 'openai/gsm8k'; download the data and "
        "set path: to the file or folder instead"
    )
