"""tools/compare_results.py: two results folders, file by file, what jobs measure of themselves aside."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def write(root: Path, rel: str, data) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data)) if not isinstance(data, bytes) else path.write_bytes(data)


def compare(a: Path, b: Path, *options: str) -> tuple[int, list[str]]:
    proc = subprocess.run([sys.executable, str(REPO / "tools/compare_results.py"), str(a), str(b), *options],
                          capture_output=True, text=True)  # fmt: skip
    return proc.returncode, proc.stdout.splitlines()


def test_equal_results_but_for_their_timings_are_equal_and_a_difference_is_named(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for root, seconds in ((a, 1.5), (b, 9.0)):
        cost = {"seconds": seconds, "peak_rss_bytes": int(seconds * 1e8), "peak_gpu_bytes": None, "tokens": 40}
        write(root, "cells/c/eval/step_10.json", {"accuracy": 0.25, "seconds": seconds, "roles": [{"value": 0.5}], "cost": cost})
        write(root, "cells/c/checkpoints/step_10/shared/model.safetensors", b"weights")
        write(root, "cells/c/checkpoints/step_10/shared/config.json", {"seconds": seconds})  # a model's, not a result
    assert compare(a, b) == (0, ["2 files compared (1 checkpoint weight files): all equal"])

    write(b, "cells/c/eval/step_10.json", {"accuracy": 0.25, "seconds": 2.0, "roles": [{"value": 0.5000001}], "cost": {"tokens": 40}})
    write(b, "cells/c/checkpoints/step_10/shared/model.safetensors", b"weighty")
    write(b, "summary.json", {})
    code, lines = compare(a, b)
    assert code == 1 and lines == [
        "summary.json: only in B",
        "cells/c/checkpoints/step_10/shared/model.safetensors: the weights differ",
        "cells/c/eval/step_10.json: .roles[0].value: 0.5 vs 0.5000001",
        "2 files compared (1 checkpoint weight files): 3 differ or are in one folder only",
    ]
    code, lines = compare(a, b, "--rtol", "1e-6")
    assert "cells/c/eval/step_10.json: .roles[0].value: 0.5 vs 0.5000001" not in lines


def test_a_folder_can_be_left_out(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    write(a, "summary.json", {"cells": []})
    write(b, "summary.json", {"cells": []})
    write(b, "long-study/summary.json", {"cells": [1]})  # another study's results inside this one's folder
    assert compare(a, b)[0] == 1
    assert compare(a, b, "--exclude", "long-study") == (0, ["1 files compared (0 checkpoint weight files): all equal"])
