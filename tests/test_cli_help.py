"""Every command's help reads in the terminals users have: an option's value column
(its type, choices or metavar) is never folded onto a second line."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

# An option row of rich's panel: "│ --name  [-c]  VALUE  help"; continuation rows start "│" then spaces.
OPTION_ROW = re.compile(r"^│ (--[\w-]+)(?:\s+-\w)?\s+(\S+)\s")


@pytest.mark.parametrize("columns", [80, 120])
def test_no_option_value_column_folds(columns):
    from matrixrl.cli import app

    commands = [info.name or info.callback.__name__ for info in app.registered_commands]
    rows = 0
    for command in commands:
        env = {"COLUMNS": str(columns), "TERM": "dumb", "PATH": "/usr/bin:/bin"}
        out = subprocess.run(
            [sys.executable, "-m", "matrixrl", command, "--help"], capture_output=True, text=True, env=env, check=True
        ).stdout
        lines = out.splitlines()
        for i, line in enumerate(lines):
            row = OPTION_ROW.match(line)
            if not row:
                continue
            rows += 1
            following = lines[i + 1] if i + 1 < len(lines) else ""
            if not following.startswith("│ ") or following.startswith("│ --"):
                continue  # the panel's border, or the next option
            # A line continuing this option's help: nothing under its value.
            value_at = line.index(row[2], len(row[1]) + 2)
            below = following[value_at : value_at + len(row[2])]
            assert not below.strip(), f"matrixrl {command} --help at {columns} columns folds {row[1]}'s value {row[2]!r}: {following!r}"
    assert rows > 20  # the pattern still finds the panels' rows
