"""`matrixrl report` in a terminal: every table of the default grid fits 100 columns, no value cut.

The store holds a constructed study of the default experiments.yaml's grid (4
workflows × 2 tasks × 2 scales × 2 modes) with the roles, per-role accuracies,
gradient diagnostics, cliffs and negative gains of a real run, so that each
table is as wide as the default run makes it. The printed tables are parsed back
into columns (a header may span lines; columns are two spaces apart or more) and
compared with the numbers of ``--format json``.
"""

from __future__ import annotations

import io
import json
import random
import re
import shutil
from pathlib import Path

import pytest
from rich.cells import cell_len
from rich.console import Console
from test_report_tables import diag, fill, training

from conftest import EXPERIMENTS, run_cli
from matrixrl import grid as G
from matrixrl.config import load_config
from matrixrl.layout import store_path
from matrixrl.report import TABLE_NAMES
from matrixrl.report.columns import printable
from matrixrl.report.formats import render
from matrixrl.report.tables import build_tables
from matrixrl.results import EvalResult, RoleMetric

WIDTH = 100
AXES_OF = {
    "seeds": ["workflow", "task", "scale", "policy"],
    "compare": ["workflow", "task", "scale", "policy", "comparison"],
    "memory": ["workflow", "task", "scale", "policy", "memory"],
    "claims": ["claim"],
}
DEFAULT_AXES = ["workflow", "task", "scale", "policy", "seed"]
# The roles of each workflow: (name, agents, metrics its evaluation reports).
ROLES = {
    "single": [("generator", 1, ["answer_acc"])],
    "voting": [("generator", 3, ["answer_acc", "disagreement"]), ("aggregator", 1, ["answer_acc"])],
    "eval_opt": [("generator", 1, ["answer_acc"]), ("evaluator", 1, ["verdict_acc"])],
    "orch_workers": [("orchestrator", 1, []), ("worker", 3, ["answer_acc", "disagreement"]), ("synthesizer", 1, ["answer_acc"])],
}
STEPS = (0, 10, 20, 30, 40)
N_EVAL = 256


def default_study(experiment: Path, seeds: str, sets: tuple | list = (), cliff=lambda i: i % 4 == 1):
    """The default grid with ``seeds`` (and ``sets``), filled with results in its store; the
    runs whose index (``grid.runs`` order) ``cliff`` picks collapse, by default every fourth."""
    config = load_config(experiment, sets=[f"grid.seed={seeds}", *sets])
    rng = random.Random(0)
    results = []
    for i, run in enumerate(G.runs(config)):
        base, gain = rng.uniform(0.18, 0.36), rng.uniform(-0.06, 0.14)
        # Up or down by the gain over 20 steps, then level, within a point: no cliff of its own.
        curve = [base + gain * min(step, 20) / 20 + rng.uniform(-0.01, 0.01) for step in STEPS]
        if cliff(i):  # a cliff at 30: far below the peak, to the end
            curve[1] = curve[2] = base + 0.2
            curve[3] = curve[4] = base - 0.1
        evals = []
        for step, accuracy in zip(STEPS, curve):
            roles = [
                RoleMetric(role=role, metric=metric, value=round(rng.uniform(0.0, 1.0), 4))
                for role, _, metrics in ROLES[run.workflow] for metric in metrics
            ]  # fmt: skip
            n_correct = round(accuracy * N_EVAL)
            evals.append(EvalResult(cell=run.id, step=step, accuracy=n_correct / N_EVAL, n=N_EVAL, n_correct=n_correct, seconds=0.1, roles=roles))
        rows = []
        for step in range(1, STEPS[-1] + 1):
            norms = {role: rng.uniform(0.1, 2.0) for role, _, _ in ROLES[run.workflow]}
            for role, agents, _ in ROLES[run.workflow]:
                rows += [diag(step, "role_norm", role, norms[role]), diag(step, "role_share", role, norms[role] / sum(norms.values()))]
                if agents > 1:  # the amplification rises from step 20 in every other such run
                    rows.append(diag(step, "amplification", role, 1.6 + (0.8 if step > 20 and i % 2 else 0.0) + rng.uniform(0, 0.1)))
        results += [training(run, rows, steps=STEPS[-1]), *evals]
    fill(config, results)
    return config


def report(experiment: Path, *args: str) -> str:
    result = run_cli("report", "-c", experiment, *args)
    assert result.exit_code == 0, result.output
    return result.stdout


def blocks(text: str, n_rows: int) -> list[dict]:
    """The printed table's sections: each ``{"title", "columns": {name: [row texts]}, "after"}``."""
    found = []
    for block in text.rstrip("\n").split("\n\n"):
        lines = block.split("\n")
        rule = next(i for i, line in enumerate(lines) if line and set(line) <= {"─", " "})
        title, header = lines[0].strip(), lines[1:rule]
        body = [line for line in lines[rule + 1 :] if not (line and set(line) <= {"─", " "})]
        rows, after = body[:n_rows], body[n_rows:]
        # Columns: the spans where some header or row line has text, two spaces or more apart.
        width = max(map(len, [*header, *rows]))
        inked = "".join("x" if any(i < len(line) and line[i] != " " for line in [*header, *rows]) else " " for i in range(width))
        spans = [m.span() for m in re.finditer(r"x+(?: x+)*", inked)]
        columns = {}
        for start, end in spans:
            name = "".join(line[start:end].strip() for line in header)
            columns[name] = [line[start:end].strip() for line in rows]
        found.append({"title": title, "columns": columns, "after": after})
    return found


def same_in_every_row(lines: list[str]) -> dict[str, str]:
    """``{column: text}`` of the ``in every row: a = 1, b = x`` line (it may go on over indented lines)."""
    text = ""
    for line in lines:
        if line.startswith("in every row: ") or (text and line.startswith(" ")):
            text += " " + line.removeprefix("in every row: ").strip()
    return dict(item.split(" = ", 1) for item in text.strip().split(", ")) if text else {}


def text_of(value) -> str:
    """What the table shows for a JSON value: 3 decimals, yes/no, — for a missing one."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def joined_text(name: str, record: dict) -> str:
    """The text of a joined column (peak@step, cliff@onset, X±ci), worked out from its parts."""
    if name == "peak@step":
        return f"{record['peak']:.3f}@{record['peak_step']}"
    if name == "cliff@onset":
        return f"yes@{record['cliff_onset']}" if record["cliff"] else "no"
    if name == "cells":
        return str(record["n_cells"])
    stem = name.removesuffix("±ci")
    if f"{stem}_lo" not in record:  # X_mean or X_diff, with X_lo and X_hi (memory's X_diff has X_diff_lo)
        stem = stem.removesuffix("_diff")
    value = record.get(f"{stem}_mean", record.get(f"{stem}_diff", record.get(stem)))
    lo, hi = record[f"{stem}_lo"], record[f"{stem}_hi"]
    return text_of(value) if lo is None else f"{value:.3f}±{(hi - lo) / 2:.3f}"


def check_fits(text: str, width: int = WIDTH) -> None:
    too_wide = [line for line in text.splitlines() if cell_len(line) > width]
    assert too_wide == [], too_wide[:3]
    assert "…" not in text


def printed(table: str, frame, columns: str | None = None, width: int = WIDTH) -> str:
    """What ``matrixrl report --table TABLE [--columns ...]`` prints on a terminal ``width`` wide."""
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(printable(table, frame, "table", columns=columns))
    return console.export_text()


def check_default_columns(name: str, text: str, records: list[dict], expected: list[str]) -> None:
    """One section: the axes and ``expected``, each value as --format json has it, but for
    columns with one value in every row that had to move under the table to fit."""
    axes = AXES_OF.get(name, DEFAULT_AXES)
    check_fits(text)
    (table,) = blocks(text, len(records))
    same = same_in_every_row(table["after"])
    for column, value in same.items():
        assert {joined_text(column, r) if column not in r else text_of(r[column]) for r in records} == {value}
    assert list(table["columns"]) == [c for c in [*axes, *expected] if c not in same], name
    for column, texts in table["columns"].items():
        assert texts == [joined_text(column, r) if column not in r else text_of(r[column]) for r in records], (name, column)
    hidden = len(records[0]) - len(axes) - sum(2 if "@" in c else 3 if "±" in c else 1 for c in expected)
    assert table["after"][-1] == f"{hidden} more columns: --wide shows them all, --columns NAME,... picks (see --help)."


DEFAULT_COLUMNS = {
    "summary": ["base", "peak@step", "final", "gain", "cliff@onset"],
    "seeds": ["n_seeds", "base_mean", "peak_mean", "final±ci", "gain±ci", "cliff_rate"],
    "compare": ["n_pairs", "final_diff±ci", "gain_diff±ci", "cliff_rate_diff"],
    "diagnostics": ["dominant_role", "dominant_share", "amplified_role", "amplification_mean", "logp_gap_max"],
    "mechanism": ["cliff@onset", "signal", "change", "rise_step", "lead", "verdict"],
    "memory": ["base", "peak@step", "base_diff±ci", "peak_diff±ci", "peak_tokens"],  # tests/test_memory_report.py
    "claims": ["finding", "evidence", "cells", "verdict", "fragility"],
}


@pytest.fixture(scope="module")
def one_seed(tmp_path_factory: pytest.TempPathFactory):
    """(config, experiments file) of the default grid's study, shared by this module's tests
    (they only read it; the first report caches the per-cell records in its store)."""
    experiment = tmp_path_factory.mktemp("default-grid") / "experiments.yaml"
    shutil.copyfile(EXPERIMENTS, experiment)
    return default_study(experiment, "[0]"), experiment


def test_every_table_of_the_default_grid_fits_100_columns_with_every_value_whole(one_seed) -> None:
    config, _ = one_seed
    frames = build_tables(store_path(config.results_dir), config)
    for name in TABLE_NAMES:
        if name in ("memory", "cost"):  # no memory, no recorded costs: test_memory_report, test_cost fit their own
            assert frames[name].empty
            continue
        records = json.loads(render(frames[name].drop(columns="cell", errors="ignore"), "json"))
        check_default_columns(name, printed(name, frames[name]), records, DEFAULT_COLUMNS[name])

        # --wide: every column of --format json, stacked in sections that each start with the
        # axes, but for the columns with one value throughout: those are a line under the table.
        wide = printed(name, frames[name], "all")
        check_fits(wide)
        if f"row 1 of {len(records)}" in wide:  # a value too long for any column (claims' why): one record at a time
            words = " ".join(wide.split())  # a long value wraps at its spaces, under its name
            for record in records:
                for column, value in record.items():
                    assert " ".join(text_of(value).split()) in words, (name, column)
            continue
        sections = blocks(wide, len(records))
        same = same_in_every_row(sections[-1]["after"])
        for column, text in same.items():
            assert {text_of(r[column]) for r in records} == {text}, (name, column)
        axes = [a for a in AXES_OF.get(name, DEFAULT_AXES) if a not in same]
        shown = []
        for section in sections:
            assert list(section["columns"])[: len(axes)] == axes, name
            shown += [c for c in section["columns"] if c not in axes]
            for column, texts in section["columns"].items():
                assert texts == [text_of(r[column]) for r in records], (name, column)
        assert sorted([*axes, *shown, *same]) == sorted(records[0]) and len(shown) == len(set(shown)), name
        if len(sections) > 1:
            numbers = [s["title"].rsplit(" ", 1)[-1] for s in sections]
            assert numbers == [f"({i}/{len(sections)})" for i in range(1, len(sections) + 1)], name
    assert len(blocks(printed("summary", frames["summary"], "all"), len(frames["summary"]))) > 2  # the per-role columns


def test_intervals_of_three_seeds_fit_too(experiment: Path) -> None:
    """Three seeds: every mean and difference has its interval; the widest names of the grid."""
    config = default_study(experiment, "[0, 1, 2]", ["grid.workflow=[single, orch_workers]", "grid.task=[pyfunc]"])
    frames = build_tables(store_path(config.results_dir), config, ["seeds", "compare"])
    for name, frame in frames.items():
        records = json.loads(render(frame, "json"))
        assert all(r["gain_lo"] is not None for r in records) and any(r[name == "seeds" and "gain_mean" or "gain_diff"] < 0 for r in records)
        check_default_columns(name, printed(name, frame), records, DEFAULT_COLUMNS[name])
    # The widest of them: the three pairs of each comparison are a line under the table instead.
    assert same_in_every_row(blocks(printed("compare", frames["compare"]), len(frames["compare"]))[0]["after"]) == {"n_pairs": "3"}


def test_the_command_prints_at_the_width_of_COLUMNS(one_seed, monkeypatch: pytest.MonkeyPatch) -> None:
    _, experiment = one_seed
    records = json.loads(report(experiment, "--format", "json"))
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    check_default_columns("summary", report(experiment), records, DEFAULT_COLUMNS["summary"])
    monkeypatch.setenv("COLUMNS", "1000")  # a terminal wide enough: --wide in one piece
    (table,) = blocks(report(experiment, "--wide"), len(records))
    assert list(table["columns"]) == list(records[0])


def test_columns_picks_by_name_and_pattern_in_every_format(one_seed, monkeypatch: pytest.MonkeyPatch) -> None:
    _, experiment = one_seed
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    text = report(experiment, "--only", "workflow=voting", "--columns", "gain_z,peak@step,generator_*")
    check_fits(text)
    records = json.loads(report(experiment, "--only", "workflow=voting", "--format", "json"))
    generator = [c for c in records[0] if c.startswith("generator_")]
    columns = [c for s in blocks(text, len(records)) for c in s["columns"] if c not in DEFAULT_AXES]
    assert columns == ["gain_z", "peak@step", *generator]
    # csv: a joined column is its parts, at full precision; the axes first, as always.
    csv = report(experiment, "--only", "workflow=voting", "--columns", "peak@step,cliff@onset", "--format", "csv")
    assert csv.splitlines()[0] == "workflow,task,scale,policy,seed,peak,peak_step,cliff,cliff_onset"
    # csv and json keep every column by default.
    every = json.loads(report(experiment, "--format", "json"))
    assert report(experiment, "--format", "csv").splitlines()[0].split(",") == list(every[0])


def test_a_terminal_too_narrow_for_the_axes_gets_each_row_one_value_per_line(one_seed, monkeypatch: pytest.MonkeyPatch) -> None:
    _, experiment = one_seed
    monkeypatch.setenv("COLUMNS", "30")
    records = json.loads(report(experiment, "--format", "json"))
    text = report(experiment)
    check_fits(text, 30)
    assert text.count("\nrow ") == len(records) == 32
    first = text.split("\nrow 2 of 32\n")[0].splitlines()
    assert first[:2] == ["per-cell summary", "row 1 of 32"]
    pairs = [re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in first[2:]]
    same = same_in_every_row(text.splitlines())
    assert same == {"seed": "0"}  # the one value of the grid's seed axis is a line under the table
    expected = [*(c for c in DEFAULT_AXES if c not in same), *DEFAULT_COLUMNS["summary"]]
    assert pairs == [[c, joined_text(c, records[0]) if c not in records[0] else text_of(records[0][c])] for c in expected]


def test_columns_user_errors(one_seed) -> None:
    from test_cli_errors import assert_user_error

    _, experiment = one_seed
    assert_user_error(run_cli("report", "-c", experiment, "--wide", "--columns", "gain"), "--wide is --columns all; give one of them")
    line = assert_user_error(run_cli("report", "-c", experiment, "--table", "seeds", "--columns", "gain_mean,nope_*"))
    assert line.startswith("Error: --columns nope_*: the seeds table has no such column; use any of: default, all, base_mean, base_lo,")
    assert line.endswith(", n_seeds, base±ci, peak±ci, final±ci, gain±ci")
    assert_user_error(
        run_cli("report", "-c", experiment, "--table", "seeds", "--columns", "gain_maen"),
        "--columns gain_maen: the seeds table has no such column; did you mean gain_mean?",
    )


def test_the_claims_tables_headers_never_wrap(one_seed) -> None:
    """At 100 columns the claims table's default header is one line of whole names: its count is
    ``cells`` (``n_cells`` in csv and json), never "n_" over "cells" (docs/report.md's tables)."""
    config, _ = one_seed
    frame = build_tables(store_path(config.results_dir), config)["claims"]
    lines = printed("claims", frame).splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["claim"])
    assert lines[header].split() == ["claim", "finding", "evidence", "cells", "verdict", "fragility"]
    assert lines[header + 1].lstrip().startswith("─")  # the rule right under it: no second header line
    assert "n_" not in "\n".join(lines[: header + 1])
    assert json.loads(render(frame.drop(columns="cell", errors="ignore"), "json"))[0]["n_cells"] > 0
