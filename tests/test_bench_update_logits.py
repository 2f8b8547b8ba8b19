"""bench/update_logits.py, the update's logits benchmark, runs end to end on tiny-s.

Its timings and memory are not asserted (benchmarks print ratios; tests do not time).
What is: each way ran in its own process and computed the logits it says it did, every
position's (prompt and completion) or the completion's only (and the one before it).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_the_update_logits_bench_measures_both_ways():
    command = [sys.executable, str(REPO / "bench" / "update_logits.py"), "--model", "tiny", "--rows", "4", "--prompt", "20", "--completion", "5", "--repeats", "1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("tiny: update of 4 turns x (20 prompt + 5 completion) tokens")
    rows = {line[:14].strip(): line[14:].split() for line in lines[2:4]}
    assert rows["computed"][0] == "25" and rows["left out"][0] == "6"
    assert lines[4].startswith("left out / computed: time ")
