"""The default baseline learns: what every multi-agent figure of the default study is read against.

`single` on `arith` at `tiny-s`, seed 0, with every setting as experiments.yaml has it
(the warm-start teaches both default tasks, 40 GRPO steps at the default rate, sampled
evaluation), run through `matrixrl run` like a user's. Its evaluated accuracy must end
more than two standard errors of the difference above its base. If a change of a
default makes this fail, the default study stops showing learning: re-run the sweep
(examples/lr-sweep.yaml) before changing the threshold.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
ONLY = ["--only", "workflow=single", "--only", "task=arith", "--only", "scale=tiny-s", "--only", "policy=shared", "--only", "seed=0"]


def matrixrl(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "matrixrl", *args], capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, f"matrixrl {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_the_default_baseline_ends_beyond_two_standard_errors_above_its_base(tmp_path):
    config = tmp_path / "experiments.yaml"
    shutil.copyfile(REPO / "experiments.yaml", config)  # results land in tmp_path/results
    matrixrl("run", "-c", str(config), "--cores", "2", *ONLY)
    (row,) = json.loads(matrixrl("report", "-c", str(config), "--format", "json", *ONLY))
    assert row["gain_z"] > 2.0, f"base {row['base']:.3f} → final {row['final']:.3f}: {row['gain_z']:.2f} SEs"
    assert row["cliff"] is False
