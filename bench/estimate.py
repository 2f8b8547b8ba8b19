"""How close is plan's time estimate? A pilot seed, then the estimate for a second against its run.

`matrixrl plan` estimates the wall time of the pending jobs from the costs the results
folder records (matrixrl/planning.py, docs/performance.md). This benchmark runs the
default grid shrunk to one task, one scale and the single and voting workflows (6 steps,
evaluated every 3), one seed as the pilot, then adds a second seed: it prints the
estimate plan gave for the second seed, the second run's measured seconds and their
ratio (1.00: exact). Both runs are measured in this process, on this machine, one after
the other, so the ratio compares like with like; other load on the machine moves it.

    python bench/estimate.py [--cores 2] [--steps 6]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def pilot_config(folder: Path, steps: int, seeds: list[int]) -> Path:
    raw = yaml.safe_load((REPO / "experiments.yaml").read_text())
    raw["grid"].update(workflow=["single", "voting"], task=["arith"], scale=["tiny-s"], policy=["shared"], seed=seeds)
    raw["tasks"] = {"arith": raw["tasks"]["arith"]}
    raw["train"].update(steps=steps, eval_every=steps // 2)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "experiments.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cores", type=int, default=2, help="cores for both runs (default 2)")
    parser.add_argument("--steps", type=int, default=6, help="training steps per cell (default 6)")
    args = parser.parse_args()

    import matrixrl

    with tempfile.TemporaryDirectory() as tmp:
        path = pilot_config(Path(tmp), args.steps, [0])
        began = time.perf_counter()
        pilot = matrixrl.Study.load(path).run(cores=args.cores)
        assert pilot.ok, "the pilot run failed"
        print(f"pilot (seed 0): {time.perf_counter() - began:.1f} s")

        pilot_config(Path(tmp), args.steps, [0, 1])
        study = matrixrl.Study.load(path)
        estimate = study.plan(cores=args.cores).estimate
        print(estimate.line())
        second = study.run(cores=args.cores)
        assert second.ok, "the second seed's run failed"
        print(f"seed 1: estimated {estimate.wall_seconds:.1f} s, measured {second.seconds:.1f} s, "
              f"measured/estimated {second.seconds / estimate.wall_seconds:.2f}")


if __name__ == "__main__":
    main()
