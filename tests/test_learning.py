"""The default baseline learns: what every multi-agent figure of the default study is read against.

`single` on `arith` at `tiny-s`, seeds 0, 1 and 2, with every setting as experiments.yaml
has it (the warm-start teaches both default tasks, 40 GRPO steps at the default rate,
sampled evaluation), run through `matrixrl run` like a user's. Every seed must end above
the base, and the mean gain's 95% interval over the seeds (`report --table seeds`) must
lie above zero. If a change of a default makes this fail, the default study stops
showing learning: re-run the sweep (examples/lr-sweep.yaml) before changing the test.

One seed is not enough to ask this of: seed 0 ended 2.6 standard errors above its base
on one machine and 1.3 on another (an AMD EPYC, whose floating point takes the
warm-start elsewhere), with the same code; over three seeds the gain stays positive.
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
ONLY = ["--only", "workflow=single", "--only", "task=arith", "--only", "scale=tiny-s", "--only", "policy=shared"]
SEEDS = ["--set", "grid.seed=[0, 1, 2]"]


def matrixrl(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "matrixrl", *args], capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, f"matrixrl {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_the_default_baseline_gains_in_every_seed_and_over_seeds(tmp_path):
    config = tmp_path / "experiments.yaml"
    shutil.copyfile(REPO / "experiments.yaml", config)  # results land in tmp_path/results
    matrixrl("run", "-c", str(config), "--cores", "2", *ONLY, *SEEDS)
    cells = json.loads(matrixrl("report", "-c", str(config), "--format", "json", *ONLY, *SEEDS))
    said = "; ".join(f"seed {r['seed']}: {r['base']:.3f} → {r['final']:.3f} ({r['gain_z']:.2f} SEs)" for r in cells)
    assert len(cells) == 3 and all(r["gain"] > 0 and r["cliff"] is False for r in cells), said
    (seeds,) = json.loads(matrixrl("report", "-c", str(config), "--table", "seeds", "--format", "json", *ONLY, *SEEDS))
    assert seeds["gain_lo"] > 0, f"gain {seeds['gain_mean']:+.3f} ({seeds['gain_lo']:+.3f} to {seeds['gain_hi']:+.3f}); {said}"
