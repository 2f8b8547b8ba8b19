"""The memory's results in the store, and the report's memory table (no model: result files by hand).

A study of two chat-style scales (weak, strong) × single/voting × arith × both policy
modes × three seeds, evaluated under none, own and memcollab. The voting/weak/shared
cells' numbers are chosen so the table's values can be worked out by hand below.
"""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import pytest
import yaml

import matrixrl
from conftest import EXPERIMENTS, run_cli
from matrixrl import grid as G
from matrixrl.config import load_config
from matrixrl.errors import ConfigError, ResultFileError
from matrixrl.layout import (
    bank_result,
    distilled_result,
    eval_result,
    labels_result,
    memory_eval_result,
    store_path,
    trajectories_result,
)
from matrixrl.report.formats import render
from matrixrl.report.tables import build_tables
from matrixrl.results import (
    BankResult,
    DistilledResult,
    DistillPrompt,
    EvalResult,
    LabelsResult,
    MemoryEvalResult,
    Retrieval,
    TrajectoriesResult,
    write_result,
)
from matrixrl.store import Store, ingest

T2 = 4.302652729749462  # t(0.975, 2): three seeds (a t table: 4.303)
T1 = 12.706204736174694  # t(0.975, 1): two seeds (12.706)
STEPS = (0, 10, 20)

# (workflow, policy, scale, seed) → accuracy at STEPS, per mode; None: not evaluated.
NONE = {
    0: (0.25, 0.5, 0.375),
    1: (0.25, 0.375, 0.5),
    2: (0.25, 0.4375, 0.4375),  # the mean curve ties at 10 and 20: the peak is the earlier
}
OWN = {0: (0.3125, 0.5, 0.5625), 1: (0.25, 0.5, 0.5), 2: (0.375, 0.4375, 0.5)}
MEMCOLLAB = {0: (0.375, 0.5, 0.5), 1: (0.3125, 0.5625, 0.4375), 2: (0.25, 0.25, 0.25)}
NONE_TOKENS, OWN_TOKENS = (100.0, 80.0, 90.0), (70.0, 60.0, 50.0)


def memory_experiment(folder: Path, modes=("none", "own", "memcollab"), workflows=("single", "voting"),
                      scales=("weak", "strong"), seeds=(0, 1, 2)) -> Path:  # fmt: skip
    """The default experiments file with two chat-style scales and a memory axis."""
    config = yaml.safe_load(EXPERIMENTS.read_text())
    for scale in scales:
        config["scales"][scale] = {"kind": "hf", "path": f"Org/{scale}"}
    config["grid"] |= {"workflow": list(workflows), "task": ["arith"], "scale": list(scales), "seed": list(seeds),
                       "memory": list(modes)}  # fmt: skip
    config["memory"] = {"weak": scales[0], "strong": scales[1]}
    path = folder / "experiments.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def run_id(workflow: str, policy: str, seed: int, scale: str = "weak") -> str:
    return G.Cell(workflow, "arith", scale, policy, seed).id


def evaluation(run: str, step: int, accuracy: float, tokens: float | None) -> EvalResult:
    return EvalResult(cell=run, step=step, accuracy=accuracy, n=64, n_correct=round(accuracy * 64), seconds=0.1,
                      response_tokens=tokens)  # fmt: skip


def memory_evaluation(run: str, mode: str, step: int, accuracy: float, tokens: float | None, entries: list[list[int]]) -> MemoryEvalResult:
    retrievals = [Retrieval(problem_id=f"eval-{i}", label="arithmetic / addition", entries=e) for i, e in enumerate(entries)]
    return MemoryEvalResult(
        cell=run, step=step, accuracy=accuracy, n=64, n_correct=round(accuracy * 64), seconds=0.1, response_tokens=tokens,
        memory=mode, bank="memcollab" if mode == "memcollab" else "own-weak",
        entries_mean=sum(map(len, entries)) / len(entries), retrievals=retrievals,
    )  # fmt: skip


def write_memory_evals(results: Path, run: str, mode: str, curve, tokens, entries) -> None:
    for step, accuracy, n_tokens in zip(STEPS, curve, tokens):
        write_result(results / memory_eval_result(run, mode, step), memory_evaluation(run, mode, step, accuracy, n_tokens, entries))


TRAJECTORIES = [
    {"problem_id": "b0", "question": "2+3+4=", "model": "weak", "completion": "2+3=5, 5+4=9. 9", "answer": "9", "correct": True, "tokens": 12},
    {"problem_id": "b1", "question": "7+8+1=", "model": "weak", "completion": "15", "answer": "15", "correct": False, "tokens": 3},
]  # fmt: skip
PROMPT = DistillPrompt(problem_id="b1", digest="d1b1", system="You distil.", user="Contrast these.",
                       reply="1. When adding three terms, enforce a running sum; avoid dropping a term.\nhello", kept=1,
                       dropped={"no_form": 1})  # fmt: skip
ENTRY = {"text": "When adding three terms, enforce a running sum; avoid dropping a term.", "problem_id": "b1",
         "question": "7+8+1=", "models": ["strong", "weak"], "distiller": "d1b1"}  # fmt: skip


def write_memory_builds(results: Path) -> None:
    """The memory-building results of task arith: trajectories, labels, a distillation, a bank."""
    write_result(results / trajectories_result("arith", "weak", 1), TrajectoriesResult(
        task="arith", scale="weak", samples=1, trajectories=TRAJECTORIES, accuracy=0.5, seconds=1.0))  # fmt: skip
    write_result(results / labels_result("arith"), LabelsResult(
        task="arith", labeller="strong", seconds=1.0,
        labels={"b1": {"category": "arithmetic", "subcategory": "addition"}, "eval-0": {"category": "arithmetic", "subcategory": "addition"}},
        replies={"b1": "arithmetic / addition", "eval-0": "addition"}))  # fmt: skip
    write_result(results / distilled_result("arith", "memcollab"), DistilledResult(
        task="arith", memory="memcollab", mode="memcollab", distiller="strong", pairs=1, entries=[ENTRY],
        prompts=[PROMPT], dropped={"no_form": 1}, seconds=2.0))  # fmt: skip
    label = {"category": "arithmetic", "subcategory": "addition"}
    entries = [{**ENTRY, "label": label, "mode": "memcollab"}, {**ENTRY, "text": "When carrying, enforce the carry; avoid losing it.", "label": label, "mode": "memcollab"}]
    write_result(results / bank_result("arith", "memcollab"), BankResult(task="arith", memory="memcollab", mode="memcollab", entries=entries))


def write_study(experiment: Path, memcollab_seeds=(0, 1)) -> Path:
    """The study's result files; memcollab of voting/weak/shared for ``memcollab_seeds`` only."""
    results = experiment.parent / "results"
    for seed in (0, 1, 2):
        voting = run_id("voting", "shared", seed)
        for step, accuracy, tokens in zip(STEPS, NONE[seed], NONE_TOKENS):
            write_result(results / eval_result(voting, step), evaluation(voting, step, accuracy, tokens))
        write_memory_evals(results, voting, "own", OWN[seed], OWN_TOKENS, [[0, 1, 2]] * 2 if seed < 2 else [[0, 1], [2, 3]])
        if seed in memcollab_seeds:
            write_memory_evals(results, voting, "memcollab", MEMCOLLAB[seed], (None,) * 3, [[1, 0, 1], [0, 1, 0]])
        # voting/weak/isolated: ordinary evaluations only (no row in the memory table)
        isolated = run_id("voting", "isolated", seed)
        for step in STEPS:
            write_result(results / eval_result(isolated, step), evaluation(isolated, step, 0.25, 100.0))
    single = run_id("single", "shared", 0)  # one seed: no interval
    for step, accuracy in zip(STEPS, (0.25, 0.25, 0.5)):
        write_result(results / eval_result(single, step), evaluation(single, step, accuracy, None))
    write_memory_evals(results, single, "own", (0.5, 0.5, 0.5), (40.0, 40.0, 40.0), [[0], []])
    write_memory_builds(results)
    return results


def interval(values: list[float], t: float) -> tuple[float, float, float]:
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return mean, mean - t * sd / math.sqrt(len(values)), mean + t * sd / math.sqrt(len(values))


def row(mode: str, n_seeds: int, base: float, peak: float, peak_step: int, base_diff, peak_diff, n_pairs, entries,
        base_tokens, peak_tokens, workflow="voting", policy="shared") -> dict:  # fmt: skip
    base_diff, peak_diff = base_diff or (None, None, None), peak_diff or (None, None, None)
    return {
        "workflow": workflow, "task": "arith", "scale": "weak", "policy": policy, "memory": mode, "n_seeds": n_seeds,
        "base": base, "peak": peak, "peak_step": peak_step,
        "base_diff": base_diff[0], "base_diff_lo": base_diff[1], "base_diff_hi": base_diff[2],
        "peak_diff": peak_diff[0], "peak_diff_lo": peak_diff[1], "peak_diff_hi": peak_diff[2],
        "n_pairs": n_pairs, "entries": entries, "base_tokens": base_tokens, "peak_tokens": peak_tokens,
    }  # fmt: skip


def expected_rows(memcollab_seeds=(0, 1)) -> list[dict]:
    """The memory table, worked out by hand from the numbers above."""
    # none: peak of the mean curve (0.25, 0.4375, 0.4375) at 10, the earlier of the tie.
    none_peak = 1
    # own: mean curve (0.3125, 0.479…, 0.5208…): peak at 20.
    own_base = [OWN[s][0] - NONE[s][0] for s in (0, 1, 2)]  # 0.0625, 0, 0.125
    own_peak = [OWN[s][2] - NONE[s][none_peak] for s in (0, 1, 2)]  # 0.0625, 0.125, 0.0625
    seeds = list(memcollab_seeds)
    means = [sum(MEMCOLLAB[s][i] for s in seeds) / len(seeds) for i in range(3)]
    peak_i = max(range(3), key=lambda i: (means[i], -i))
    collab_base = [MEMCOLLAB[s][0] - NONE[s][0] for s in seeds]
    collab_peak = [MEMCOLLAB[s][peak_i] - NONE[s][none_peak] for s in seeds]
    t = {2: T1, 3: T2}[len(seeds)]
    single_shared = [
        row("none", 1, 0.25, 0.5, 20, None, None, None, 0.0, None, None, "single"),
        row("own", 1, 0.5, 0.5, 0, (0.25, None, None), (0.0, None, None), 1, 0.5, 40.0, 40.0, "single"),
    ]
    return [
        *single_shared,
        *({**r, "policy": "isolated"} for r in single_shared),  # single's isolated cells are its shared runs
        row("none", 3, 0.25, 0.4375, 10, None, None, None, 0.0, 100.0, 80.0),
        row("own", 3, 0.3125, (0.5625 + 0.5 + 0.5) / 3, 20, interval(own_base, T2), interval(own_peak, T2), 3,
            (3 * 3 + 3 * 3 + 2 * 3) / 9, 70.0, 50.0),  # fmt: skip
        row("memcollab", len(seeds), means[0], means[peak_i], STEPS[peak_i], interval(collab_base, t), interval(collab_peak, t),
            len(seeds), 3.0, None, None),  # fmt: skip
    ]


def same(records: list[dict], expected: list[dict]) -> None:
    assert [list(r) for r in records] == [list(e) for e in expected]
    for got, want in zip(records, expected):
        for column, value in want.items():
            if isinstance(value, float):
                assert got[column] == pytest.approx(value, abs=1e-12), (got["memory"], column)
            else:
                assert got[column] == value, (got["memory"], column)


def table_records(config) -> list[dict]:
    frame = build_tables(store_path(config.results_dir), config, ["memory"])["memory"]
    return json.loads(render(frame, "json"))


@pytest.fixture
def study(tmp_path: Path):
    experiment = memory_experiment(tmp_path)
    write_study(experiment)
    return experiment, load_config(experiment)


def test_the_memory_table_row_by_row(study) -> None:
    experiment, config = study
    ingest(config.results_dir)
    expected = expected_rows()
    # own's base difference by hand: mean 0.0625, sd 0.0625, ± t(2) · 0.0625 / √3
    assert expected[5]["base_diff"] == 0.0625
    assert expected[5]["base_diff_hi"] - 0.0625 == pytest.approx(T2 * 0.0625 / math.sqrt(3), abs=1e-15)
    assert expected[5]["base_diff_hi"] == pytest.approx(0.0625 + 0.15525861, abs=1e-8)
    # own's peak difference: (0.0625, 0.125, 0.0625), mean 1/12, sd 0.0625/√3
    assert expected[5]["peak_diff"] == pytest.approx(1 / 12) and expected[5]["peak_diff_lo"] == pytest.approx(1 / 12 - T2 * 0.0625 / 3)
    same(table_records(config), expected)

    # The Python API and the command give the same rows.
    api = matrixrl.Study.load(experiment)
    same(json.loads(render(api.table("memory"), "json")), expected)
    result = run_cli("report", "-c", str(experiment), "--table", "memory", "--format", "json")
    assert result.exit_code == 0, result.output
    same(json.loads(result.stdout), expected)
    # --only keeps the rows of its cells
    result = run_cli("report", "-c", str(experiment), "--only", "workflow=voting", "--table", "memory", "--format", "json")
    same(json.loads(result.stdout), expected[4:])


def test_the_terminal_table_and_the_other_formats(study, monkeypatch) -> None:
    experiment, _ = study
    monkeypatch.setenv("COLUMNS", "100")
    result = run_cli("report", "-c", str(experiment), "--table", "memory")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].strip() == "memory: accuracy with each memory mode, and its difference from none"
    assert max(len(line) for line in lines) <= 100
    header = " ".join(lines[1:3])
    for column in ("memory", "base", "peak@step", "base_diff±ci", "peak_diff±ci", "peak_", "tokens"):
        assert column in header
    # n_seeds, n_pairs, entries, base_tokens
    assert lines[-1] == "4 more columns: --wide shows them all, --columns NAME,... picks (see --help)."
    own = next(line for line in lines if "voting" in line and " own " in line)
    half = T2 * 0.0625 / math.sqrt(3)
    assert f"0.062±{half:.3f}" in own and "0.521@20" in own
    csv = run_cli("report", "-c", str(experiment), "--table", "memory", "--format", "csv").stdout.splitlines()
    assert csv[0] == "workflow,task,scale,policy,memory," + ",".join(list(expected_rows()[0])[5:])
    markdown = run_cli("report", "-c", str(experiment), "--table", "memory", "--format", "markdown").stdout
    assert "| memory" in markdown and "base_diff±ci" in markdown
    # `report` without --table: the summary, not the memory table
    summary = run_cli("report", "-c", str(experiment)).stdout
    assert "per-cell summary" in summary and "memory:" not in summary


def test_a_study_without_memory_evaluations_says_so_in_one_line(tmp_path: Path) -> None:
    experiment = memory_experiment(tmp_path, modes=("none",))
    results = tmp_path / "results"
    run = run_id("voting", "shared", 0)
    for step in STEPS:
        write_result(results / eval_result(run, step), evaluation(run, step, 0.25, 10.0))
    result = run_cli("report", "-c", str(experiment), "--table", "memory")
    assert result.exit_code != 0
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1 and "no memory evaluations stored for the cells of this grid" in message
    with pytest.raises(ConfigError, match="no memory evaluations"):
        matrixrl.Study.load(experiment).table("memory")
    assert "memory" not in matrixrl.Study.load(experiment).tables()
    assert run_cli("report", "-c", str(experiment)).exit_code == 0


def test_a_mode_the_grid_does_not_list_is_not_reported(study) -> None:
    experiment, _ = study
    config = load_config(experiment, sets=["grid.memory=[none, own]"])
    assert config.grid.memory == ["none", "own"]
    ingest(config.results_dir)
    assert [r["memory"] for r in table_records(config)] == ["none", "own"] * 3


# --- the store -------------------------------------------------------------------------------------


def stored(db: Path, sql: str, *args) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql, args).fetchall()


MEMORY_TABLES = ("memory_evaluations", "memory_role_metrics", "retrievals", "trajectories", "memory_labels",
                 "memory_entries", "distill_prompts", "memory_builds", "memory_inputs", "evaluations", "cell_inputs",
                 "cell_keys", "cell_summaries", "ingested_files")  # fmt: skip


def everything(db: Path) -> dict[str, list[tuple]]:
    return {table: sorted(stored(db, f"select * from {table}"), key=repr) for table in MEMORY_TABLES}


def test_retrievals_entries_and_their_provenance_are_in_the_store(study) -> None:
    _, config = study
    ingest(config.results_dir)
    db = store_path(config.results_dir)
    voting = run_id("voting", "shared", 0)
    assert stored(db, "select problem_id, rank, bank, label, entry from retrievals where cell = ? and memory = 'memcollab' "
                      "and step = 10 order by problem_id, rank", voting) == [
        ("eval-0", 0, "memcollab", "arithmetic / addition", 1), ("eval-0", 1, "memcollab", "arithmetic / addition", 0),
        ("eval-0", 2, "memcollab", "arithmetic / addition", 1), ("eval-1", 0, "memcollab", "arithmetic / addition", 0),
        ("eval-1", 1, "memcollab", "arithmetic / addition", 1), ("eval-1", 2, "memcollab", "arithmetic / addition", 0),
    ]  # fmt: skip
    # A problem shown nothing keeps its row (its label), without an entry.
    single = run_id("single", "shared", 0)
    assert stored(db, "select problem_id, rank, entry from retrievals where cell = ? and step = 0 order by problem_id", single) == [
        ("eval-0", 0, 0), ("eval-1", 0, None)
    ]
    assert stored(db, "select memory, bank, entries_mean, response_tokens from memory_evaluations where cell = ? and step = 0 "
                      "order by memory", voting) == [("memcollab", "memcollab", 3.0, None), ("own", "own-weak", 3.0, 70.0)]  # fmt: skip
    # What each problem was shown, with its source: retrievals joined to the bank's entries, and each entry's prompt.
    shown = stored(db, """
        select r.problem_id, r.rank, m.text, m.problem_id, m.question, m.category, m.subcategory, m.models, m.mode, p.system, p.reply
        from retrievals r join memory_entries m on m.task = 'arith' and m.bank = r.bank and m.entry = r.entry
        join distill_prompts p on p.task = m.task and p.bank = m.bank and p.digest = m.distiller
        where r.cell = ? and r.memory = 'memcollab' and r.step = 0 and r.problem_id = 'eval-0' order by r.rank""", voting)
    assert [s[:2] for s in shown] == [("eval-0", 0), ("eval-0", 1), ("eval-0", 2)]
    assert shown[1][2:] == (ENTRY["text"], "b1", "7+8+1=", "arithmetic", "addition", '["strong", "weak"]', "memcollab",
                            PROMPT.system, PROMPT.reply)  # fmt: skip
    assert shown[0][2] == "When carrying, enforce the carry; avoid losing it."
    assert stored(db, "select prompt, problem_id, digest, user, kept, dropped from distill_prompts") == [
        (0, "b1", "d1b1", "Contrast these.", 1, '{"no_form": 1}')
    ]
    assert stored(db, "select problem_id, sample, model, correct, tokens, answer from trajectories order by problem_id") == [
        ("b0", 0, "weak", 1, 12, "9"), ("b1", 0, "weak", 0, 3, "15")
    ]
    assert stored(db, "select problem_id, labeller, category, subcategory, reply from memory_labels order by problem_id") == [
        ("b1", "strong", "arithmetic", "addition", "arithmetic / addition"),
        ("eval-0", "strong", "arithmetic", "addition", "addition"),
    ]
    assert stored(db, "select part, kind, bank, mode, distiller, pairs, entries, dropped from memory_builds where kind != 'trajectories' "
                      "order by part") == [
        ("bank/memcollab", "bank", "memcollab", "memcollab", None, None, 2, None),
        ("distilled/memcollab", "distilled", "memcollab", "memcollab", "strong", 1, 1, '{"no_form": 1}'),
        ("labels", "labels", None, None, None, None, None, None),
    ]  # fmt: skip
    # Memory-building files are kept by their task, memory evaluations by their cell and mode.
    assert stored(db, "select cell, part from ingested_files where path like 'memory/%' order by part") == [
        ("memory:arith", "bank/memcollab"), ("memory:arith", "distilled/memcollab"), ("memory:arith", "labels"),
        ("memory:arith", "trajectories/weak-k1"),
    ]  # fmt: skip
    assert stored(db, "select cell, part from ingested_files where path = ?", memory_eval_result(voting, "own", 10)) == [
        (voting, "memory/own/step_10")
    ]
    assert stored(db, "select count(*) from memory_inputs") == [(3 * 3 + 2 * 3 + 3 + 4,)]
    # Only train and eval results are a cell's summary inputs.
    assert stored(db, "select count(*) from cell_inputs where part not like 'eval/%' and part != 'train'") == [(0,)]


def test_memory_files_are_read_incrementally_and_leave_the_summaries_cached(study) -> None:
    experiment, config = study
    results = Path(config.results_dir)
    db = store_path(results)
    assert ingest(results) > 0
    build_tables(db, config, ["summary"])  # the per-cell summaries, cached
    with Store(db) as store:
        computations = store.computations()
    keys = stored(db, "select * from cell_keys order by cell")
    assert ingest(results) == 0  # nothing new

    # A new memory evaluation: memcollab of seed 2.
    voting = run_id("voting", "shared", 2)
    write_memory_evals(results, voting, "memcollab", MEMCOLLAB[2], (None,) * 3, [[1, 0, 1], [0, 1, 0]])
    assert ingest(results) == 3
    same(table_records(config), expected_rows((0, 1, 2)))
    # A changed one: seed 2's step 10 better than any.
    write_result(results / memory_eval_result(voting, "memcollab", 10), memory_evaluation(voting, "memcollab", 10, 0.875, None, [[2]]))
    assert ingest(results) == 1
    changed = {**MEMCOLLAB, 2: (0.25, 0.875, 0.25)}
    records = table_records(config)
    collab = next(r for r in records if r["workflow"] == "voting" and r["memory"] == "memcollab")
    assert (collab["peak"], collab["peak_step"]) == (pytest.approx(sum(changed[s][1] for s in (0, 1, 2)) / 3), 10)
    assert collab["entries"] == pytest.approx((3.0 * 8 + 1.0) / 9)
    assert stored(db, "select problem_id, rank, entry from retrievals where cell = ? and memory = 'memcollab' and step = 10", voting) == [
        ("eval-0", 0, 2)
    ]
    # A deleted one: seed 2's memcollab files are gone, and so are their rows.
    for step in STEPS:
        (results / memory_eval_result(voting, "memcollab", step)).unlink()
    assert ingest(results) == 0
    assert stored(db, "select count(*) from memory_evaluations where cell = ? and memory = 'memcollab'", voting) == [(0,)]
    assert stored(db, "select count(*) from retrievals where cell = ? and memory = 'memcollab'", voting) == [(0,)]
    assert stored(db, "select count(*) from memory_inputs where cell = ? and part like 'memory/memcollab/%'", voting) == [(0,)]
    same(table_records(config), expected_rows())
    # A memory-building file gone: its rows too.
    (results / labels_result("arith")).unlink()
    ingest(results)
    assert stored(db, "select count(*) from memory_labels") == [(0,)]
    assert stored(db, "select count(*) from memory_builds where part = 'labels'") == [(0,)]

    # None of this touched a cell's summary inputs: the cached summaries stand, none recomputed.
    assert stored(db, "select * from cell_keys order by cell") == keys
    build_tables(db, config, ["summary"])
    with Store(db) as store:
        assert store.computations() == computations


@pytest.mark.parametrize(
    "where, text, said",
    [
        ("memory_eval", "{", "not valid JSON"),
        ("memory_eval", json.dumps({"cell": "x", "step": 0}), "accuracy"),
        ("bank", None, "entries.0"),
        ("trajectories", None, "trajectories.1: tokens must be a int"),
    ],
    ids=["not-json", "fields-missing", "entry-without-label", "trajectory-wrong-type"],
)
def test_a_corrupt_memory_file_is_a_clean_error_and_nothing_is_written(study, where, text, said) -> None:
    _, config = study
    results = Path(config.results_dir)
    db = store_path(results)
    ingest(results)
    before = everything(db)
    # A good new file beside the corrupt one: not written either.
    voting = run_id("voting", "shared", 2)
    write_memory_evals(results, voting, "memcollab", MEMCOLLAB[2], (None,) * 3, [[1]])
    if where == "memory_eval":
        path = results / memory_eval_result(voting, "own", 30)
        path.write_text(text)
    elif where == "bank":
        path = results / bank_result("arith", "own-weak")
        path.write_text(json.dumps({"task": "arith", "memory": "own-weak", "mode": "own", "entries": [ENTRY]}))
    else:
        path = results / trajectories_result("arith", "strong", 1)
        bad = [TRAJECTORIES[0], {**TRAJECTORIES[1], "tokens": "three"}]
        path.write_text(json.dumps({"task": "arith", "scale": "strong", "samples": 1, "trajectories": bad, "accuracy": 0.5, "seconds": 1.0}))
    with pytest.raises(ResultFileError, match="corrupt result file") as error:
        ingest(results)
    assert str(path) in str(error.value) and said in str(error.value)
    assert everything(db) == before
    path.unlink()  # fixed: the good file is read now
    assert ingest(results) == 3


# --- a 100-column terminal ------------------------------------------------------------------------


def wide_study(folder: Path, seeds: tuple, scales: tuple):
    """Every workflow × both policy modes × two scales × every memory mode, five checkpoints each."""
    import random

    modes = ("none", "own", "transfer", "self_contrast", "memcollab")
    experiment = memory_experiment(folder, modes, ("single", "voting", "eval_opt", "orch_workers"), scales, seeds)
    config = load_config(experiment)
    rng, results = random.Random(0), Path(config.results_dir)
    for run in G.runs(config):
        for step in (0, 10, 20, 30, 40):
            write_result(results / eval_result(run.id, step), evaluation(run.id, step, rng.uniform(0.2, 0.6), rng.uniform(100, 900)))
            for mode in modes[1:]:
                accuracy, tokens = rng.uniform(0.2, 0.6), rng.uniform(100, 900)
                write_result(results / memory_eval_result(run.id, mode, step), memory_evaluation(run.id, mode, step, accuracy, tokens, [[0, 1, 2], [1]]))
    ingest(results)
    return config


@pytest.mark.parametrize(
    "seeds, scales",
    [((0,), ("qwen3-0.6b", "qwen3-1.7b")), ((0, 1, 2), ("weak", "strong"))],
    ids=["one-seed", "three-seeds"],
)
def test_the_memory_table_fits_100_columns_in_one_piece(tmp_path: Path, seeds, scales) -> None:
    from test_report_fit import DEFAULT_COLUMNS, blocks, check_default_columns, check_fits, printed

    config = wide_study(tmp_path, seeds, scales)
    frame = build_tables(store_path(config.results_dir), config, ["memory"])["memory"]
    records = json.loads(render(frame, "json"))
    assert len(records) == 4 * 2 * 2 * 5
    assert all(r["base_diff_lo"] is not None for r in records if r["memory"] != "none") == (len(seeds) == 3)
    check_default_columns("memory", printed("memory", frame), records, DEFAULT_COLUMNS["memory"])
    wide = printed("memory", frame, "all")  # --wide: stacked, every value whole
    check_fits(wide)
    assert len(blocks(wide, len(records))) > 1


def test_a_memory_evaluation_of_another_spec_is_left_out(study) -> None:
    """As an ordinary evaluation: one stamped with a spec digest that is not its (run, mode)'s
    current one (an old retrieval setting, say) is not reported; one stamped with it is."""
    from matrixrl.grid import memory_evals, plan_memory

    _, config = study
    results = Path(config.results_dir)
    single = run_id("single", "shared", 0)
    specs = {single: G.cell_spec(config, G.Cell("single", "arith", "weak", "shared", 0))}
    digest = memory_evals(config, specs, plan_memory(config))[(single, "own")].digest()
    for step, stamp, accuracy in zip(STEPS, (digest, "old", digest), (0.5, 0.875, 0.5)):
        result = memory_evaluation(single, "own", step, accuracy, 40.0, [[0], []]).model_copy(update={"spec_digest": stamp})
        write_result(results / memory_eval_result(single, "own", step), result)
    ingest(results)
    own = next(r for r in table_records(config) if r["workflow"] == "single" and r["memory"] == "own")
    assert (own["peak"], own["peak_step"]) == (0.5, 0)  # step 10 (0.875) left out: steps 0 and 20 only
    with sqlite3.connect(store_path(results)) as db:
        assert db.execute("select count(*) from memory_evaluations where cell = ? and memory = 'own'", (single,)).fetchone() == (3,)
