"""bench/rollout.py, the rollout-throughput benchmark, runs end to end on a small setting.

Its timings are not asserted (benchmarks print ratios; tests do not time). What is: it
covers every workflow, its pass counts respect the dependency bound it reports, and
matrixrl's decoder and transformers' generate sampled the same tokens in every rollout.
"""

from __future__ import annotations

# The table's columns, one word each (the header's "prompt tok", "new tok/s"... are two).
COLUMNS = [
    "workflow", "calls", "compl", "tokens", "prompt", "new", "old", "plain_rate", "old/plain", "new/plain",
    "new/same", "new/old", "new/unsh", "passes", "min", "plain", "flat@min",
]


def test_the_rollout_bench_covers_every_workflow_and_decode_matches_generate(run_bench):
    from matrixrl.workflows import WORKFLOWS

    lines = run_bench("rollout.py", "--problems", "2", "--group", "2", "--tokens", "3", "--warmstart", "0", "--repeats", "1")
    assert lines[1].split()[:2] == ["workflow", "calls"] and lines[1].split()[-5:] == COLUMNS[-5:]
    rows = {line.split()[0]: dict(zip(COLUMNS, line.split())) for line in lines[2 : 2 + len(WORKFLOWS)]}
    assert sorted(rows) == sorted(WORKFLOWS)
    for name, row in rows.items():
        passes, fewest = int(row["passes"]), int(row["min"])
        assert fewest <= passes, f"{name}: {passes} passes made, below the {fewest} its dependencies allow"
        assert 0 < float(row["flat@min"]) <= 1.0
        assert float(row["new/same"]) > 0
    assert rows["single"]["calls"] == "1" and rows["eval_opt"]["calls"] != "1"
    # The split of the new path's time: prompt reads and decoding passes are parts of the step's time.
    at = next(i for i, line in enumerate(lines) if line.startswith("where the new path's time goes"))
    assert lines[at + 1].split() == ["workflow", "total", "prefill", "positions", "decode", "passes", "other", "at0.9"]
    split = {line.split()[0]: line.split()[1:] for line in lines[at + 2 : at + 2 + len(WORKFLOWS)]}
    assert sorted(split) == sorted(WORKFLOWS)
    for name, (total, prefill, positions, decode, passes, other, at_09) in split.items():
        assert float(prefill) > 0 and float(decode) > 0 and float(other) >= 0 and float(at_09) > 0, name
        assert abs(float(total) - float(prefill) - float(decode) - float(other)) < 0.2, name
        assert 0 < int(passes) <= int(rows[name]["passes"]) and int(positions) > 0, name
    assert lines[-1] == "new and old sampled the same tokens: in every rollout"
