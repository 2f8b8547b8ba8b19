"""docs/architecture.md's tree of the code is generated from the modules' docstrings and checked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO, script_module

docs_tree = script_module("tools/docs_tree.py")
BEGIN, COMMAND, END, main = docs_tree.BEGIN, docs_tree.COMMAND, docs_tree.END, docs_tree.main


def test_the_architecture_tree_is_up_to_date() -> None:
    # As a user runs it, and without importing anything heavy: it reads the modules with ast.
    code = (
        "import runpy, sys\nmain = runpy.run_path('tools/docs_tree.py')['main']\nrc = main(['--check'])\n"
        "heavy = [m for m in ('torch', 'pandas', 'pydantic', 'snakemake') if m in sys.modules]\n"
        "assert not heavy, heavy\nsys.exit(rc)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}  # this checkout's
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr


# A small repository whose every module has a one-line summary, in each of the forms read.
DOCUMENTED = {
    "matrixrl/__init__.py": '"""The package.\n\nMore about it."""\n',
    "matrixrl/cli.py": '"""The ``matrixrl`` command: see :mod:`matrixrl.jobs`."""\nimport torch\n',
    "matrixrl/jobs/__init__.py": '"""Jobs."""\n',
    "matrixrl/jobs/train.py": "# a comment first\n'''train: one cell.'''\n",
    "matrixrl/workflow/Snakefile": "# The rules.\n# More.\nrule all:\n",
    "bench/plan.py": '"""Planning, timed."""\n',
}


def _repo(tmp_path: Path, files: dict[str, str]) -> tuple[Path, Path]:
    """A repository of ``files`` (path: text) and its docs/architecture.md with the markers in prose."""
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    doc = tmp_path / "docs" / "architecture.md"
    doc.parent.mkdir(exist_ok=True)
    doc.write_text(f"# Architecture\n\nProse before.\n\n{BEGIN}\n```\nan old tree\n```\n{END}\n\nProse after.\n")
    return tmp_path, doc


def test_a_stale_tree_is_named_in_one_line_and_rewritten_between_the_markers(tmp_path: Path, capsys) -> None:
    repo, doc = _repo(tmp_path, DOCUMENTED)
    args = ["--path", str(doc), "--repo", str(repo)]
    assert main(["--check", *args]) == 1
    assert capsys.readouterr().err == f"{doc}'s tree of the code is out of date; run {COMMAND}\n"
    assert main(args) == 0
    assert main(["--check", *args]) == 0
    assert doc.read_text() == (
        f"# Architecture\n\nProse before.\n\n{BEGIN}\n```\n"
        "matrixrl/      The package.\n"
        "  cli.py       The `matrixrl` command: see `matrixrl.jobs`.\n"
        "  jobs/        Jobs.\n"
        "    train.py   train: one cell.\n"
        "  workflow/\n"
        "    Snakefile  The rules.\n"
        "bench/         Benchmarks: one script per performance claim; docs/performance.md has the figures.\n"
        "  plan.py      Planning, timed.\n"
        f"```\n{END}\n\nProse after.\n"
    )


def test_modules_without_a_one_line_docstring_are_named(tmp_path: Path, capsys) -> None:
    repo, doc = _repo(tmp_path, {
        **DOCUMENTED,
        "matrixrl/bare.py": "x = 1\n",
        "matrixrl/wrapped.py": '"""A summary wrapped\nover two lines."""\n',
        "matrixrl/loose/mod.py": '"""A module of a folder without __init__.py."""\n',
    })
    before = doc.read_text()
    assert main(["--path", str(doc), "--repo", str(repo)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    for name in ("matrixrl/bare.py", "matrixrl/wrapped.py", "matrixrl/loose/ (no __init__.py)"):
        assert name in err
    assert "cli.py" not in err and "train.py" not in err
    assert doc.read_text() == before
