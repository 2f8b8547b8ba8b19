"""bench/continuous_batching.py, eval_opt by continuous batching against the staged rollout,
runs end to end on a small setting.

Timings are not asserted. What is: both schedulers make at least as many passes as
the slowest episode's tokens (a pass gives a row one token), and the benchmark's
engine is right: decoding greedily, it gives the staged rollout's turns in every episode,
with prompts joining batches that are still decoding (a model warm-started for 10 steps
ends some turns early, so they do).
"""

from __future__ import annotations

import re

import pytest


@pytest.mark.parametrize("policy", ["shared", "isolated"])
def test_continuous_batching_decodes_what_the_staged_rollout_does(policy, run_bench):
    args = ["--problems", "6", "--group", "2", "--tokens", "4", "--warmstart", "10", "--repeats", "1", "--policy", policy]
    lines = run_bench("continuous_batching.py", *args)
    assert f"{policy} policy" in lines[0]
    assert lines[1].split() == ["scheduler", "tok/s", "passes", "chain", "turns", "tokens"]
    rows = {line.split()[0]: [float(x) for x in line.split()[1:]] for line in lines[2:4]}
    assert sorted(rows) == ["continuous", "staged"]
    for name, (rate, passes, chain, turns, tokens) in rows.items():
        assert rate > 0 and passes >= chain > 0, name
        assert turns >= 12 and tokens >= turns  # every episode drafts at least once
    greedy = re.fullmatch(
        r"greedy: continuous batching and the staged rollout decoded the same turns in 24 of 24 episodes "
        r"\(prompts joined a running batch (\d+) times\)",
        lines[-1],
    )
    assert greedy, lines[-1]
    assert int(greedy[1]) > 0  # the warm-started model's turns end at different steps: rows joined mid-batch
