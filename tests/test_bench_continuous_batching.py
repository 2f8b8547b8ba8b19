"""bench/continuous_batching.py, eval_opt by continuous batching against the staged rollout,
runs end to end on a small setting.

Timings are not asserted. What is: both schedulers make at least as many passes as
the slowest episode's tokens (a pass gives a row one token), and the benchmark's
engine is right: decoding greedily, it gives the staged rollout's turns in every episode.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("policy", ["shared", "isolated"])
def test_continuous_batching_decodes_what_the_staged_rollout_does(policy, monkeypatch, capsys):
    import torch

    threads = torch.get_num_threads()
    argv = ["continuous_batching.py", "--problems", "3", "--group", "2", "--tokens", "4", "--warmstart", "0", "--repeats", "1", "--policy", policy]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    try:
        runpy.run_path(str(REPO / "bench" / "continuous_batching.py"), run_name="__main__")
    finally:
        torch.set_num_threads(threads)
    lines = capsys.readouterr().out.splitlines()
    assert f"{policy} policy" in lines[0]
    assert lines[1].split() == ["scheduler", "tok/s", "passes", "chain", "turns", "tokens"]
    rows = {line.split()[0]: [float(x) for x in line.split()[1:]] for line in lines[2:4]}
    assert sorted(rows) == ["continuous", "staged"]
    for name, (rate, passes, chain, turns, tokens) in rows.items():
        assert rate > 0 and passes >= chain > 0, name
        assert turns >= 6 and tokens >= turns  # every episode drafts at least once
    assert lines[-1] == "greedy: continuous batching and the staged rollout decoded the same turns in 12 of 12 episodes"
