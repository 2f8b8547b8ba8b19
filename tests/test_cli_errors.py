"""User errors through the CLI: exit code 2, one ``Error: ...`` line on stderr, nothing written.

Only ``plan`` and ``report`` are exercised (``run`` trains models).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from matrixrl.grid import Cell
from matrixrl.layout import STORE_FILE, eval_result, train_result
from matrixrl.results import EvalResult, StepMetrics, TrainResult, write_result

from conftest import REPO, run_cli

FIXTURES = REPO / "tests" / "fixtures"

CELL = Cell(workflow="single", task="arith", scale="tiny-s", policy="shared", seed=0)
ONE_CELL = ("--only", "workflow=single", "--only", "task=arith", "--only", "scale=tiny-s", "--only", "policy=shared", "--only", "seed=0")  # the grid of exactly CELL
FIX = "delete it and run `matrixrl run` to recompute it"


def assert_user_error(result, message: str | None = None) -> str:
    """Exit 2, no traceback, nothing on stdout, exactly one ``Error: `` line on stderr."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ")
    if message is not None:
        assert lines[0] == f"Error: {message}"
    return lines[0]


def snapshot(folder: Path) -> dict[str, bytes] | None:
    """Every file under ``folder`` with its bytes (None if the folder does not exist)."""
    if not folder.exists():
        return None
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def results_of(experiment: Path) -> Path:
    return experiment.parent / "results"


def write_cell(results: Path, cell: Cell = CELL, steps=(0,)) -> None:
    """Valid result files for one cell: train.json and one eval file per step."""
    metrics = [
        StepMetrics(
            step=s, reward_mean=0.5, reward_std=0.1, loss=0.2, entropy=1.0, response_length=2.0,
            grad_norm=0.3, clip_fraction=0.0, group_size=8, seconds=0.1,
        )
        for s in range(1, max(steps) + 1)
    ]
    write_result(results / train_result(cell.id), TrainResult(cell=cell.id, axes=cell.axes(), steps=max(steps), metrics=metrics))
    for step in steps:
        write_result(
            results / eval_result(cell.id, step),
            EvalResult(cell=cell.id, step=step, accuracy=0.25, n=256, n_correct=64, seconds=0.5),
        )


# --- bad configuration -----------------------------------------------------------------------

TRAIN_KEYS = (
    "steps, eval_every, checkpoint_every, keep_checkpoints, problems_per_step, group_size, lr, ppo_epochs, temperature, "
    "max_new_tokens, epsilon_low, epsilon_high, scale_rewards, reward, max_grad_norm, threads, micro_batch_tokens, rollout_batch_size, kl_beta, kl_beta_roles, use_bias_correction_kl, damper, "
    "damper_roles, damper_window, advantage_group, loss_type, importance_sampling_level, sapo_temperature_pos, "
    "sapo_temperature_neg, vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg"
)


def _edit(experiment: Path, old: str, new: str) -> None:
    text = experiment.read_text()
    assert old in text
    experiment.write_text(text.replace(old, new, 1))


# (how to break the file, extra arguments, the message after "Error: <file>: " or None for an option error)
CASES = {
    "yaml-syntax": (lambda e: _edit(e, "  seed: [0]\n", "  seed: [0\n"), (), None),
    "unknown-key": (lambda e: _edit(e, "  steps: 40\n", "  stpes: 100\n"), (), "train.stpes: unknown key; did you mean steps?"),
    "unknown-key-far": (lambda e: _edit(e, "  steps: 40\n", "  colour: 100\n"), (), f"train.colour: unknown key; valid keys here: {TRAIN_KEYS}"),
    "wrong-type": (lambda e: _edit(e, "  steps: 40\n", "  steps: abc\n"), (), "train.steps: expected an integer (got 'abc')"),
    "out-of-range": (lambda e: _edit(e, "  steps: 40\n", "  steps: 0\n"), (), "train.steps: must be greater than or equal to 1 (got 0)"),
    "unknown-scale": (
        lambda e: _edit(e, "  scale: [tiny-s, tiny-m]\n", "  scale: [tiny-s, tiny-xl]\n"),
        (),
        "grid.scale: unknown scale 'tiny-xl'; did you mean tiny-s? (or define it under 'scales:')",
    ),
    "not-a-mapping": (lambda e: e.write_text("- grid\n"), (), "expected a mapping of sections (grid:, scales:, ...) at the top level"),
    "set-unknown-key": (
        lambda e: None,
        ("--set", "train.stepz=4"),
        "train.stepz: unknown key; did you mean steps?",
    ),
    "set-wrong-type": (lambda e: None, ("--set", "grid.seed=[a]"), "grid.seed[0]: expected an integer (got 'a')"),
    "set-section": (lambda e: None, ("--set", "train={steps: 0}"), "train.steps: must be greater than or equal to 1 (got 0)"),
    "set-other-key": (lambda e: _edit(e, "  steps: 40\n", "  steps: 0\n"), ("--set", "train.lr=0.1"), "train.steps: must be greater than or equal to 1 (got 0)"),
}
OPTION_CASES = {
    "set-no-equals": (("--set", "train.steps"), "--set 'train.steps': expected dotted.key=VALUE, e.g. --set train.steps=4"),
    "set-below-scalar": (
        ("--set", "train.steps.max=4"),
        "--set 'train.steps.max=4': train.steps is a single value, not a section, so it has no key 'max'; "
        "use --set train.steps=VALUE",
    ),
    "only-unknown-axis": (
        ("--only", "colour=red"),
        "--only 'colour=red': unknown axis 'colour'; use one of: workflow, task, scale, policy, seed, e.g. --only seed=0,1",
    ),
    "only-not-in-grid": (
        ("--only", "seed=7"),
        "--only 'seed=7': 7 not in grid.seed [0]; --only narrows the grid, use --set grid.seed=[...] to change it",
    ),
}


@pytest.mark.parametrize("command", ["plan", "report"])
@pytest.mark.parametrize("case", list(CASES))
def test_bad_config_is_one_line_exit_2(experiment: Path, command: str, case: str) -> None:
    breakage, extra, message = CASES[case]
    breakage(experiment)
    line = assert_user_error(run_cli(command, "-c", experiment, *extra))
    if message is None:  # YAML syntax: the position is part of the message
        assert line == (
            f"Error: {experiment}: not valid YAML at line 19, column 7: expected ',' or ']', but got ':' "
            "(while parsing a flow sequence that starts at line 17, column 9)"
        )
    else:  # a value a --set wrote is named with it, as the file may be right
        behind = f" with --set {extra[1]!r}" if case in ("set-unknown-key", "set-wrong-type", "set-section") else ""
        assert line == f"Error: {experiment}{behind}: {message}"
    assert not results_of(experiment).exists()


@pytest.mark.parametrize("command", ["plan", "report"])
@pytest.mark.parametrize("case", list(OPTION_CASES))
def test_bad_option_is_one_line_exit_2(experiment: Path, command: str, case: str) -> None:
    args, message = OPTION_CASES[case]
    assert_user_error(run_cli(command, "-c", experiment, *args), message)
    assert not results_of(experiment).exists()


# Errors of a check across keys (and of paths resolved after validation) name the --set too.
SET_CHECKS = {
    "grid.seed=[0,0]": "grid.seed: values repeat in [0, 0]; list each once",
    "grid.scale=[tiny-x]": "grid.scale: unknown scale 'tiny-x'; did you mean tiny-s? (or define it under 'scales:')",
    "grid.workflow=[singel]": "grid.workflow: unknown workflow 'singel'; did you mean single?",
    "grid.train.lr=[]": "grid.train.lr: expected a non-empty list of values, e.g. train.lr: [a, b]",
    "grid.train.lr=[.inf]": "grid.train.lr: must be a finite number (got inf)",
    "scales.tiny-s={kind: hf, path: ./nope}": "scales.tiny-s.path: no folder {nope}; point it at a model folder "
    "(config.json, weights, tokenizer) or use a hub id such as Qwen/Qwen3-0.6B",
}


@pytest.mark.parametrize("assignment", list(SET_CHECKS))
def test_an_error_a_set_value_causes_names_the_set(experiment: Path, assignment: str) -> None:
    message = SET_CHECKS[assignment].format(nope=experiment.parent / "nope")
    assert_user_error(run_cli("plan", "-c", experiment, "--set", assignment), f"{experiment} with --set {assignment!r}: {message}")
    assert not results_of(experiment).exists()


def test_an_error_of_another_key_names_the_set_without_which_it_is_not(experiment: Path) -> None:
    # grid.scale is the file's, but the --set emptied the scales it names.
    assert_user_error(
        run_cli("plan", "-c", experiment, "--set", "train.steps=4", "--set", "scales={}", "--set", "train.lr=0.1"),
        f"{experiment} with --set 'scales={{}}': grid.scale: unknown scale 'tiny-s'; define it under 'scales:' (none is defined yet)",
    )


def test_an_error_of_the_file_names_no_set(experiment: Path) -> None:
    _edit(experiment, "  seed: [0]\n", "  seed: [0, 0]\n")
    assert_user_error(
        run_cli("plan", "-c", experiment, "--set", "train.steps=4"), f"{experiment}: grid.seed: values repeat in [0, 0]; list each once"
    )


@pytest.mark.parametrize("command", ["plan", "report"])
def test_missing_config_file(tmp_path: Path, command: str) -> None:
    path = tmp_path / "nope.yaml"
    assert_user_error(run_cli(command, "-c", path), f"{path}: no such file; pass -c PATH or create experiments.yaml")
    assert list(tmp_path.iterdir()) == []


def test_console_script_prints_no_traceback(experiment: Path) -> None:
    """The real entry point, in a subprocess: what a user's terminal shows."""
    _edit(experiment, "  steps: 40\n", "  steps: abc\n")
    proc = subprocess.run(
        [sys.executable, "-m", "matrixrl", "report", "-c", str(experiment)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == f"Error: {experiment}: train.steps: expected an integer (got 'abc')\n"


# Ctrl-C lands where the test puts it: while a library loads, or inside a command.
INTERRUPTS = {
    "while-loading": (
        "import sys\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'rich.table':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Interrupt())\n"
    ),
    "inside-a-command": (
        "import matrixrl.config as config, matrixrl.study as study\n"
        "def interrupted(*args, **kwargs):\n"
        "    raise KeyboardInterrupt\n"
        "config.load_config = study.load_config = interrupted\n"  # report loads through the Python API
    ),
}


@pytest.mark.parametrize("where", list(INTERRUPTS))
def test_ctrl_c_ends_with_one_line(experiment: Path, where: str) -> None:
    script = INTERRUPTS[where] + "import sys, runpy\nsys.argv[0] = 'matrixrl'\nrunpy.run_module('matrixrl', run_name='__main__')\n"
    proc = subprocess.run(
        [sys.executable, "-c", script, "report", "-c", str(experiment)], capture_output=True, text=True, timeout=60
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (130, "", "Interrupted.\n")
    assert not results_of(experiment).exists()


# --- report without results ------------------------------------------------------------------


def test_report_before_anything_has_run(experiment: Path) -> None:
    results = results_of(experiment)
    assert_user_error(run_cli("report", "-c", experiment), f"{results}: no results yet; run `matrixrl run` first")
    assert not results.exists()


def test_report_with_an_empty_results_dir(experiment: Path) -> None:
    results = results_of(experiment)
    (results / "logs").mkdir(parents=True)
    assert_user_error(run_cli("report", "-c", experiment), f"{results}: no results yet; run `matrixrl run` first")
    assert snapshot(results) == {}
    assert sorted(p.name for p in results.iterdir()) == ["logs"]


# --- corrupt result files --------------------------------------------------------------------


@pytest.fixture
def stored(experiment: Path) -> Path:
    """An experiment whose store holds CELL's results (one successful ``report``)."""
    results = results_of(experiment)
    write_cell(results)
    # Written an hour ago: a file changed just before a report reads it is read again by the
    # next one (matrixrl.store.RACY_NS), which records that reading; these tests want a store
    # that a report leaves alone.
    an_hour_ago = time.time() - 3600
    for path in results.rglob("*.json"):
        os.utime(path, (an_hour_ago, an_hour_ago))
    result = run_cli("report", "-c", experiment, *ONE_CELL, "--format", "json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [(r["scale"], r["seed"], r["base"]) for r in rows] == [("tiny-s", 0, 0.25)]
    assert (results_of(experiment) / STORE_FILE).is_file()
    return experiment


CORRUPT = {
    "not-json": ("{not json", "corrupt result file (not valid JSON)"),
    "missing-field": (
        json.dumps({"cell": CELL.id, "step": 10, "n": 256, "n_correct": 64, "seconds": 0.5}),
        "corrupt result file (accuracy: Field required)",
    ),
    "wrong-type": (
        json.dumps({"cell": CELL.id, "step": 10, "accuracy": "high", "n": 256, "n_correct": 64, "seconds": 0.5}),
        "corrupt result file (accuracy: Input should be a valid number, unable to parse string as a number)",
    ),
}


@pytest.mark.parametrize("case", list(CORRUPT))
@pytest.mark.parametrize("which", ["new-file", "changed-file"])
def test_corrupt_result_file_leaves_the_store_untouched(stored: Path, case: str, which: str) -> None:
    results = results_of(stored)
    before = snapshot(results)
    store_bytes = (results / STORE_FILE).read_bytes()
    text, problem = CORRUPT[case]
    bad = results / eval_result(CELL.id, 10 if which == "new-file" else 0)
    bad.write_text(text)

    assert_user_error(run_cli("report", "-c", stored, *ONE_CELL), f"{bad}: {problem}; {FIX}")

    assert (results / STORE_FILE).read_bytes() == store_bytes
    after = snapshot(results)
    assert after.pop(str(bad.relative_to(results))) == text.encode()
    before.pop(str(bad.relative_to(results)), None)
    assert after == before  # nothing else written, nothing lost (no journal left behind)


def test_corrupt_train_file_is_named(stored: Path) -> None:
    results = results_of(stored)
    store_bytes = (results / STORE_FILE).read_bytes()
    other = Cell(workflow="single", task="arith", scale="tiny-s", policy="shared", seed=1)
    bad = results / train_result(other.id)
    bad.parent.mkdir(parents=True)
    bad.write_text(json.dumps({"cell": other.id, "axes": other.axes(), "steps": 1}))
    assert_user_error(run_cli("report", "-c", stored), f"{bad}: corrupt result file (metrics: Field required); {FIX}")
    assert (results / STORE_FILE).read_bytes() == store_bytes


def test_corrupt_file_without_a_store_is_named(experiment: Path) -> None:
    results = results_of(experiment)
    bad = results / eval_result(CELL.id, 0)
    bad.parent.mkdir(parents=True)
    bad.write_text("{not json")
    assert_user_error(
        run_cli("report", "-c", experiment, *ONE_CELL), f"{bad}: corrupt result file (not valid JSON); {FIX}"
    )
    assert bad.read_text() == "{not json"


def test_corrupt_file_without_a_store_creates_no_store(experiment: Path) -> None:
    results = results_of(experiment)
    bad = results / eval_result(CELL.id, 0)
    bad.parent.mkdir(parents=True)
    bad.write_text("{not json")
    run_cli("report", "-c", experiment, *ONE_CELL)
    assert not (results / STORE_FILE).exists()


def test_report_for_cells_without_evaluations(stored: Path) -> None:
    results = results_of(stored)
    before = snapshot(results)
    assert_user_error(
        run_cli("report", "-c", stored, "--only", "scale=tiny-m"),
        f"{results}: no evaluations stored for the cells of this grid at these settings; run `matrixrl run` first",
    )
    assert snapshot(results) == before


# --- a valid plan --------------------------------------------------------------------------


def test_plan_json_lists_every_job(experiment: Path) -> None:
    result = run_cli("plan", "-c", experiment, *ONE_CELL, "--set", "train.steps=4", "--set", "train.eval_every=2", "--format", "json")
    assert result.exit_code == 0, result.output
    jobs = json.loads(result.stdout)
    assert isinstance(jobs, list) and jobs
    assert all(isinstance(j, dict) and {"rule", "cell", "step", "status"} <= set(j) for j in jobs)
    assert [(j["rule"], j["cell"], j["step"]) for j in jobs] == [
        ("prepare_base", None, None),
        ("evaluate_base", None, 0),  # the base model's evaluation: every cell's step 0
        ("train", CELL.id, None),
        ("copy_base_eval", CELL.id, 0),
        ("evaluate", CELL.id, 2),
        ("evaluate", CELL.id, 4),
        ("retain", CELL.id, None),
        ("analyse", None, None),
    ]
    assert {j["status"] for j in jobs} == {"pending"} and {j["reason"] for j in jobs} == {"missing"}
    assert not results_of(experiment).exists()  # plan writes nothing


def test_plan_words_every_reason_a_job_is_pending():
    """plan's per-cell table says why a training is pending, whatever the reason (a reason
    without words crashed plan with a KeyError: 'rebuild')."""
    from matrixrl.cli import _status
    from matrixrl.status import REASONS

    for reason in REASONS:
        shown = _status({"status": "pending", "reason": reason})
        assert shown.startswith("[yellow]pending") and shown.endswith("[/]")
    assert _status({"status": "pending", "reason": "rebuild"}) == "[yellow]pending (rebuilds a deleted checkpoint)[/]"


# --- files and values the audit found unhandled -------------------------------------------------


def test_an_experiments_file_that_is_not_utf8_is_named(experiment: Path) -> None:
    experiment.write_bytes(experiment.read_bytes().replace(b"results_dir: results", b"results_dir: r\xe9sults", 1))
    offset = experiment.read_bytes().index(b"\xe9")
    assert_user_error(run_cli("plan", "-c", experiment), f"{experiment}: not UTF-8 text (byte {offset} is 0xe9); save it as UTF-8")


def test_a_key_given_twice_is_refused_not_silently_overridden(experiment: Path) -> None:
    _edit(experiment, "  steps: 40\n", "  steps: 40\n  steps: 3\n")
    line = experiment.read_text().splitlines().index("  steps: 3") + 1
    assert_user_error(run_cli("plan", "-c", experiment), f"{experiment}: 'steps' is given twice in one mapping (line {line}); keep one")


def test_a_results_dir_that_is_a_file_is_named(experiment: Path) -> None:
    results_of(experiment).write_text("not a folder")
    for command in ("plan", "report"):
        assert_user_error(
            run_cli(command, "-c", experiment),
            f"{experiment}: results_dir: {results_of(experiment)} is a file, not a folder; point results_dir at a folder",
        )


def test_a_results_dir_under_a_file_is_named_by_every_command(experiment: Path) -> None:
    """A file part way down results_dir is refused as the setting's fault when the file is read,
    not met as an OS error about some result file below it (exit 1, no fix)."""
    blocker = experiment.parent / "afile"
    blocker.write_text("a file")
    for command in ("plan", "report", "run", "doctor"):
        assert_user_error(
            run_cli(command, "-c", experiment, "--set", "results_dir=afile/sub"),
            f"{experiment} with --set 'results_dir=afile/sub': results_dir: {blocker / 'sub'} is under {blocker}, "
            "a file, not a folder; point results_dir at a folder",
        )
    assert blocker.read_text() == "a file"


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, where no folder can be made")
def test_run_names_results_dir_when_its_folder_cannot_be_made(experiment: Path) -> None:
    assert_user_error(
        run_cli("run", "-c", experiment, *ONE_CELL, "--set", "results_dir=/proc/nope"),
        "results_dir: cannot create /proc/nope: no such file or directory; "
        "point results_dir at a folder this user can write (--set results_dir=PATH)",
    )


EMPTY_PATHS = {  # an empty path is the current folder to pathlib: it would silently take the files
    ("report", "--html"): "--html: needs a value (a file name such as report.html)",
    ("report", "--plots"): "--plots: needs a value (a folder for the PNG files)",
    ("plot", "--out"): "--out: needs a value (a folder for the PNG files)",
    ("export", "tensorboard", "--out"): "--out: needs a value (a folder)",
    ("models", "convert-smollm2", "--to"): "--to: needs a value (a folder)",
}


@pytest.mark.parametrize("args", list(EMPTY_PATHS), ids=" ".join)
def test_an_empty_output_path_is_refused_not_the_current_folder(experiment: Path, args: tuple[str, ...]) -> None:
    config = () if args[0] == "models" else ("-c", experiment)
    before = sorted(os.listdir())
    assert_user_error(run_cli(*args, "", *config), EMPTY_PATHS[args])
    assert sorted(os.listdir()) == before
    assert not results_of(experiment).exists()


def test_an_empty_results_dir_is_refused_not_the_files_folder(experiment: Path) -> None:
    _edit(experiment, "results_dir: results ", 'results_dir: ""      ')
    fix = "results_dir: must not be empty; write . for the experiments file's folder"
    assert_user_error(run_cli("plan", "-c", experiment), f"{experiment}: {fix}")
    assert_user_error(run_cli("plan", "-c", experiment, "--set", "results_dir=''"), f"{experiment} with --set \"results_dir=''\": {fix}")


def test_one_axis_narrowed_twice_names_the_earlier_narrowing(experiment: Path) -> None:
    assert_user_error(
        run_cli("plan", "-c", experiment, "--only", "workflow=single", "--only", "workflow=voting"),
        "--only 'workflow=voting': voting not left by --only 'workflow=single', which narrowed grid.workflow first "
        "(repeated --only options intersect); give the values in one: --only workflow=V1,V2",
    )
    narrowed = run_cli("plan", "-c", experiment, "--only", "workflow=single,voting", "--only", "workflow=voting", "--format", "json")
    assert {job["cell"].split("-")[0] for job in json.loads(narrowed.stdout) if job["cell"]} == {"voting"}


def test_a_step_count_past_the_bound_is_a_config_error_not_a_crash(experiment: Path) -> None:
    assert_user_error(
        run_cli("plan", "-c", experiment, "--set", "train.steps=9999999999999"),
        f"{experiment} with --set 'train.steps=9999999999999': train.steps: must be less than or equal to 1000000 (got 9999999999999)",
    )


def test_plan_csv_writes_steps_as_whole_numbers(experiment: Path) -> None:
    result = run_cli("plan", "-c", experiment, *ONE_CELL, "--set", "train.steps=4", "--set", "train.eval_every=2", "--format", "csv")
    assert result.exit_code == 0, result.output
    steps = [line.split(",")[3] for line in result.stdout.splitlines()[1:]]
    assert steps == ["", "0", "", "0", "2", "4", "", ""]


def assert_write_error(result, message: str) -> None:
    """A path the user named cannot be written: exit 1, one line, no traceback."""
    assert result.exit_code == 1, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output
    assert result.stderr.splitlines() == [f"Error: {message}"]


def test_an_output_path_under_a_file_names_the_option_and_the_file(stored: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "page.html"
    blocker.write_text("a file")
    why = f"cannot write there ({blocker}): a file is where a folder must go; choose another path"
    assert_write_error(run_cli("report", "-c", stored, *ONE_CELL, "--html", str(blocker / "x.html")), f"--html {blocker / 'x.html'}: {why}")
    why = f"cannot write there ({blocker}): a part of the path is a file, not a folder; choose another path"
    assert_write_error(run_cli("plot", "-c", stored, *ONE_CELL, "--out", str(blocker / "plots")), f"--out {blocker / 'plots'}: {why}")
    relative = os.path.relpath(blocker / "deeper" / "x.html")  # the file in the way as the user spelled the path
    why = f"cannot write there ({os.path.relpath(blocker)}): a part of the path is a file, not a folder; choose another path"
    assert_write_error(run_cli("report", "-c", stored, *ONE_CELL, "--html", relative), f"--html {relative}: {why}")
    assert blocker.read_text() == "a file"


def test_html_refuses_a_device_and_the_plots_folder_and_writes_through_a_link(stored: Path, tmp_path: Path) -> None:
    assert_user_error(
        run_cli("report", "-c", stored, *ONE_CELL, "--html", "/dev/null"),
        "--html /dev/null: is not a regular file; pass a file name such as report.html",
    )
    both = tmp_path / "out"
    assert_user_error(
        run_cli("report", "-c", stored, *ONE_CELL, "--html", str(both), "--plots", str(both)),
        f"--html and --plots both name {both}; give the page a file name of its own",
    )
    assert not both.exists()  # refused before anything was written
    assert_user_error(
        run_cli("report", "-c", stored, *ONE_CELL, "--html", str(tmp_path / "r.html"), "--format", "json"),
        "--table and --format choose the printed table (the HTML page has every table); leave them out with --html and --plots",
    )
    link, target = tmp_path / "link.html", tmp_path / "target.html"
    link.symlink_to(target)
    assert run_cli("report", "-c", stored, *ONE_CELL, "--html", str(link)).exit_code == 0
    assert link.is_symlink() and target.read_text().startswith("<!DOCTYPE html>")


def test_an_output_path_never_overwrites_what_the_study_reads(stored: Path) -> None:
    results = results_of(stored)
    (results / "summary.json").write_text("{}")
    before, config_text = snapshot(results), stored.read_text()
    fix = {"--html": "report.html", "--plots": "report-plots"}
    for option, name, entry in [
        ("--html", "matrixrl.sqlite", "matrixrl.sqlite"),
        ("--html", "summary.json", "summary.json"),
        ("--html", f"cells/{CELL.id}/train.json", "cells"),
        ("--html", ".matrixrl/config.yaml", ".matrixrl"),
        ("--plots", f"cells/{CELL.id}/eval", "cells"),
    ]:
        path = results / name
        assert_user_error(
            run_cli("report", "-c", stored, *ONE_CELL, option, path),
            f"{option} {path}: is part of the study's results ({entry} in results_dir {results}); "
            f"pass another path, such as {fix[option]}",
        )
    assert_user_error(
        run_cli("report", "-c", stored, *ONE_CELL, "--html", stored),
        f"--html {stored}: is the experiments file this command reads; pass another path, such as report.html",
    )
    assert_user_error(
        run_cli("plot", "-c", stored, *ONE_CELL, "--out", results / "logs"),
        f"--out {results / 'logs'}: is part of the study's results (logs in results_dir {results}); "
        "pass another path, such as plots",
    )
    assert_user_error(
        run_cli("export", "tensorboard", "-c", stored, *ONE_CELL, "--out", results / "base" / "tb"),
        f"--out {results / 'base' / 'tb'}: is part of the study's results (base in results_dir {results}); "
        "pass another path, such as runs/tensorboard",
    )
    assert snapshot(results) == before and stored.read_text() == config_text
    # The rest of results_dir is the user's: a page there, and a second report over it.
    for _ in range(2):
        assert run_cli("report", "-c", stored, *ONE_CELL, "--html", results / "report.html").exit_code == 0
    assert (results / "report.html").read_text().startswith("<!DOCTYPE html>")


def test_an_output_path_never_overwrites_a_tasks_data(stored: Path) -> None:
    data = stored.parent / "problems.jsonl"
    shutil.copyfile(FIXTURES / "math_problems.jsonl", data)
    before = data.read_bytes()
    task = "tasks.mine={kind: math_generic, path: problems.jsonl, n_eval: 3}"
    assert_user_error(
        run_cli("report", "-c", stored, *ONE_CELL, "--set", task, "--html", data),
        f"--html {data}: is part of tasks.mine.path ({data}), which the study reads; pass another path, such as report.html",
    )
    assert data.read_bytes() == before


PROFILE_CASES = {
    "jobs: abc\n": "jobs: expected a whole number of at least 1 or unlimited (got 'abc'); e.g. jobs: 50",
    "restart_times: true\n": "restart_times: expected a whole number of at least 0 (got true); e.g. restart_times: 1",
    "latency-wait: -5\n": "latency-wait: expected a whole number of at least 0 (got -5); e.g. latency-wait: 60",
    "max-jobs-per-second: fast\n": "max-jobs-per-second: expected a number above 0 (got 'fast'); e.g. max-jobs-per-second: 10",
}


@pytest.mark.parametrize("command", ["plan", "run"])
@pytest.mark.parametrize("text", list(PROFILE_CASES))
def test_a_profile_option_snakemake_would_refuse_is_named_before_anything_starts(
    experiment: Path, command: str, text: str
) -> None:
    profile = experiment.parent / "prof"
    profile.mkdir()
    (profile / "config.yaml").write_text(text)
    assert_user_error(run_cli(command, "-c", experiment, "--profile", profile), f"{profile / 'config.yaml'}: {PROFILE_CASES[text]}")
    assert not results_of(experiment).exists()


def test_an_executor_not_installed_stops_a_run_but_not_its_plan(experiment: Path) -> None:
    """A plan is previewed where the run may not go (a laptop without the SLURM plugin)."""
    from matrixrl.snake.profiles import executor_plugins

    profile = experiment.parent / "prof"
    profile.mkdir()
    (profile / "config.yaml").write_text("executor: zzz\n")
    assert run_cli("plan", "-c", experiment, "--profile", profile).exit_code == 0
    choices = ", ".join(["dryrun", "local", "touch", *executor_plugins()])
    assert_user_error(
        run_cli("run", "-c", experiment, "--profile", profile),
        f"{profile / 'config.yaml'}: executor: 'zzz' is no installed Snakemake executor; use one of: {choices} "
        "(or pip install snakemake-executor-plugin-zzz)",
    )
    assert not results_of(experiment).exists()


@pytest.mark.parametrize("command", ["plan", "run", "doctor"])
def test_a_profile_that_is_a_file_is_named_as_one(experiment: Path, command: str) -> None:
    assert_user_error(
        run_cli(command, "-c", experiment, "--profile", experiment),
        f"--profile {experiment}: is a file, not a profile; a profile is a folder holding config.yaml, "
        "such as profiles/slurm (an experiments file goes to -c)",
    )
    profile = experiment.parent / "prof"
    profile.mkdir()
    (profile / "config.yaml").write_text("jobs: 2\n")
    assert_user_error(
        run_cli(command, "-c", experiment, "--profile", profile / "config.yaml"),
        f"--profile {profile / 'config.yaml'}: is a file; pass the folder that holds it: --profile {profile}",
    )
    assert_user_error(
        run_cli(command, "-c", experiment, "--profile", ""), "--profile: needs a value (a Snakemake profile folder such as profiles/slurm)"
    )
    assert not results_of(experiment).exists()


def test_a_profile_with_snakemakes_words_for_no_limit_plans(experiment: Path) -> None:
    profile = experiment.parent / "prof"
    profile.mkdir()
    (profile / "config.yaml").write_text("jobs: unlimited\ncores: all\nexecutor: local\nlatency_wait: 5\n")
    assert run_cli("plan", "-c", experiment, *ONE_CELL, "--profile", profile).exit_code == 0


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("MATRIXRL_JOB_SERVER_LINGER_S", "abc", "MATRIXRL_JOB_SERVER_LINGER_S='abc': expected seconds, e.g. 300"),
        ("MATRIXRL_GPU_WAIT_S", "-1", "MATRIXRL_GPU_WAIT_S='-1': expected seconds, e.g. 600"),
        ("MATRIXRL_GPU_WAIT_S", "inf", "MATRIXRL_GPU_WAIT_S='inf': expected seconds, e.g. 600"),
    ],
)
@pytest.mark.parametrize("command", ["plan", "run", "report"])
def test_a_bad_environment_variable_stops_every_command_before_it_starts(
    experiment: Path, monkeypatch, command: str, name: str, value: str, message: str
) -> None:
    monkeypatch.setenv(name, value)
    assert_user_error(run_cli(command, "-c", experiment), message)
    assert not results_of(experiment).exists()


def test_the_environments_seconds_keep_their_defaults_and_zero() -> None:
    from matrixrl.environment import GPU_WAIT_S, JOB_SERVER_LINGER_S, seconds

    assert seconds(JOB_SERVER_LINGER_S, {}) == 300.0 and seconds(GPU_WAIT_S, {GPU_WAIT_S: ""}) == 600.0
    assert seconds(JOB_SERVER_LINGER_S, {JOB_SERVER_LINGER_S: "0"}) == 0.0
    assert seconds(GPU_WAIT_S, {GPU_WAIT_S: " 2.5 "}) == 2.5


# --- mistyped names and option values ----------------------------------------------------------


def test_a_name_near_a_valid_one_gets_it_and_one_near_none_gets_them_all() -> None:
    from matrixrl.errors import did_you_mean

    assert did_you_mean("stpes", ["steps", "eval_every"]) == "did you mean steps?"
    assert did_you_mean("SEEDS", ["summary", "seeds"]) == "did you mean seeds?"  # case aside
    assert did_you_mean("xml", ["table", "csv"]) == "use one of: table, csv"
    assert did_you_mean("colour", ["steps", "lr"], "valid keys here") == "valid keys here: steps, lr"
    define = "define it under 'scales:'"
    assert did_you_mean("tiny-xl", ["tiny-s", "big"], otherwise=define) == "did you mean tiny-s? (or define it under 'scales:')"
    assert did_you_mean("huge", ["tiny-s", "big"], otherwise=define) == "use one of: tiny-s, big or define it under 'scales:'"
    # No valid name at all (scales: {}): no empty list to choose from.
    assert did_you_mean("tiny-s", [], otherwise=define) == "define it under 'scales:' (none is defined yet)"
    assert did_you_mean("colour", [], "valid keys here") == "valid keys here: none"


def test_an_empty_scales_section_says_to_define_one(experiment: Path) -> None:
    text = experiment.read_text()
    experiment.write_text(text[: text.index("\nscales:\n")] + "\nscales: {}\n" + text[text.index("\ntasks:") :])
    assert_user_error(
        run_cli("plan", "-c", experiment),
        f"{experiment}: grid.scale: unknown scale 'tiny-s'; define it under 'scales:' (none is defined yet)",
    )


# A mistyped command line: (arguments, the line after "Error: "). Click's usage block and boxed
# message in its own words (`Invalid value for '--cores': Input should be a valid integer, unable
# to parse string as an integer`) are one line in matrixrl's style, exit status 2.
USAGE_CASES = {
    "table-near": (("report", "--table", "seed"), "--table seed: unknown table; did you mean seeds?"),
    "table-far": (
        ("report", "--table", "xyz"),
        "--table xyz: unknown table; use one of: summary, seeds, compare, diagnostics, mechanism, memory, claims, cost",
    ),
    "format-far": (("report", "--format", "xml"), "--format xml: unknown format; use one of: table, csv, markdown, latex, json"),
    "format-near": (("plan", "--format", "jsn"), "--format jsn: unknown format; did you mean json?"),
    "cores-word": (("run", "--cores", "two"), "--cores two: expected a whole number, e.g. --cores 2"),
    "cores-spaced": (("run", "--cores", "two cores"), "--cores 'two cores': expected a whole number, e.g. --cores 2"),
    "cores-zero": (("run", "--cores", "0"), "--cores 0: must be at least 1"),
    "tracker-near": (("export", "tensorbord"), "export tensorbord: unknown tracker; did you mean tensorboard?"),
    "tracker-missing": (("export",), "export: missing TRACKER; use one of: tensorboard, wandb"),
    "option-near": (("report", "--tabel", "seeds"), "--tabel: no such option; did you mean --table?"),
    "option-far": (("report", "--bogus"), "--bogus: no such option; see matrixrl report --help"),
    "option-no-value": (("report", "-c"), "-c: needs a value; see matrixrl report --help"),
    "flag-with-value": (("report", "--wide=1"), "--wide: does not take a value; see matrixrl report --help"),
    "command-near": (("reprot",), "reprot: no such command; did you mean report?"),
    "command-far": (("models", "fetch"), "models fetch: no such command; use one of: convert-smollm2"),
    "extra-argument": (("report", "summary"), "report summary: unexpected argument; see matrixrl report --help"),
}


@pytest.mark.parametrize("case", list(USAGE_CASES))
def test_a_mistyped_command_line_is_one_line_exit_2(case: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # nothing may be written, here or anywhere
    args, message = USAGE_CASES[case]
    assert_user_error(run_cli(*args), message)
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_column_suggests_the_nearest(stored: Path) -> None:
    assert_user_error(
        run_cli("report", "-c", stored, *ONE_CELL, "--columns", "peak@stpe"),
        "--columns peak@stpe: the summary table has no such column; did you mean peak@step?",
    )


def test_a_mistyped_value_in_a_terminal_is_one_line_too(experiment: Path) -> None:
    """The real entry point: no usage block, no box, only the line."""
    proc = subprocess.run(
        [sys.executable, "-m", "matrixrl", "report", "-c", str(experiment), "--table", "seed"],
        capture_output=True, text=True, timeout=60,
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", "Error: --table seed: unknown table; did you mean seeds?\n")


def test_a_bare_group_still_prints_its_help() -> None:
    result = run_cli("models")
    assert "convert-smollm2" in result.output and "Error" not in result.output
