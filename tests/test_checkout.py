"""What a newcomer's checkout meets: the documented commands and the examples write only
where git ignores, and tests import their siblings one way (so plain `pytest` collects)."""

from __future__ import annotations

import ast
import re
import runpy
import shutil
import subprocess
from pathlib import Path

import pytest

import matrixrl

from conftest import EXPERIMENTS, REPO

# An output path in a documented command or snippet: savefig("PATH"), --html/--plots/--out/--to PATH.
OUTPUT = re.compile(r"""savefig\(["']([^"']+)["']|--(?:html|plots|out|to)[ =](\S+)""")


def ignored_by_git(paths: list[str]) -> set[str]:
    """Those of ``paths`` (relative to the repository) that git ignores; skips outside a git checkout."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    done = subprocess.run(["git", "check-ignore", "--stdin"], input="\n".join(paths), cwd=REPO, capture_output=True, text=True)
    assert done.returncode in (0, 1), done.stderr  # 1: none of them is ignored
    return set(done.stdout.splitlines())


def documented_outputs() -> dict[str, str]:
    """Each relative path that a command or snippet in a code block of README.md or docs/ writes,
    with where it is shown. Placeholders (FILE, DIR, RESULTS/...), absolute paths and the
    commands of error messages (``Error: --out ...``) are left out."""
    found = {}
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        in_code = False
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            if line.startswith("```"):
                in_code = not in_code
                continue
            if not in_code or line.lstrip().startswith("Error:"):
                continue
            for match in OUTPUT.finditer(line):
                path = match.group(1) or match.group(2)
                if path.split("/")[0].isupper() or path.startswith(("/", "~", "$")):
                    continue
                found.setdefault(path, f"{doc.relative_to(REPO)}:{number}")
    return found


def test_what_the_documented_commands_write_is_ignored_by_git() -> None:
    found = documented_outputs()
    assert "results/arith.png" in found, found  # docs/api.md's snippet: the scan reads what it should
    ignored = ignored_by_git(sorted(found))
    assert not [f"{where}: {path}" for path, where in found.items() if path not in ignored]


def test_the_example_script_writes_under_the_results_folder_by_default() -> None:
    example = runpy.run_path(str(REPO / "examples" / "from_python.py"), run_name="example")
    out = matrixrl.Study.load(EXPERIMENTS).results_dir / example["OUT"] / "curves-arith.png"
    path = str(out.relative_to(REPO))
    assert ignored_by_git([path]) == {path}


def test_tests_import_their_siblings_by_name_not_as_a_tests_package() -> None:
    # `from tests.x import y` resolves only with the repository root on sys.path (`python -m
    # pytest`); plain `pytest`, the README's command, then fails to collect the module.
    found = []
    for path in sorted((REPO / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{path.name}:{node.lineno}: {name}" for name in names if name == "tests" or name.startswith("tests.")]
    assert not found


def test_xdist_groups_keep_a_group_on_one_worker(tmp_path) -> None:
    """The SLURM tests share one worker through `--dist loadgroup` (tests/conftest.py); with a
    pytest that pytest-xdist cannot group under (9.2 with xdist 3.8) they spread over the
    workers and wait minutes for each other's cluster. pyproject.toml's dev pins keep a pair
    that groups: a group's tests run on one worker, named with the group."""
    import sys

    (tmp_path / "test_groups.py").write_text(
        "import os, pytest\n"
        "@pytest.mark.xdist_group('one')\n"
        "@pytest.mark.parametrize('i', range(4))\n"
        "def test_grouped(i):\n"
        "    print(os.environ['PYTEST_XDIST_WORKER'])\n"
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not this repository's options
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider", "test_groups.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    ran = re.findall(r"\[(gw\d)\].*PASSED test_groups.py::test_grouped\[(\d)\]@one", done.stdout)
    assert len(ran) == 4 and len({worker for worker, _ in ran}) == 1, done.stdout
