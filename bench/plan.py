"""`matrixrl plan` at the paper's scale: time and memory against a small plan and a bare interpreter.

A user of the paper's matrix plans, edits and replans many times a day, so the plan
must stay fast as the grid grows. Each grid is planned over a results folder in
which every job is done (every result file written, with the digests a run records,
and training results as long as the paper's 500 steps make them), which is the
slowest case: every file is read. Measured in one run, interleaved, medians:

- ``python -c pass``: the reference interpreter start;
- ``matrixrl plan`` (the CLI, its table printed) of the default grid, of
  examples/paper.yaml (one seed) and of the same with 4 seeds (about 10,000 jobs),
  with the peak memory of that process;
- ``--snakemake``: also the Snakemake dry-run that `plan` made before matrixrl
  computed statuses itself (matrixrl.snake.command.pending_jobs), for the first two grids
  (the 10,000-job one takes minutes).

    python bench/plan.py [--repeats 3] [--snakemake]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GRIDS = {
    "default grid": (REPO / "experiments.yaml", []),
    "paper.yaml": (REPO / "examples" / "paper.yaml", []),
    "paper.yaml, 4 seeds": (REPO / "examples" / "paper.yaml", ["grid.seed=[0, 1, 2, 3]"]),
}


def fill(config: Path, sets: list[str], results: Path) -> int:
    """Write every result file of the grid as a finished run would have; returns the job count."""
    from matrixrl.config import load_config
    from matrixrl.results import BaseResult, EvalResult, StepMetrics, TrainResult, write_result
    from matrixrl.retention import RetentionRecord
    from matrixrl.dag import Graph

    cfg = load_config(config, sets=[f"results_dir={results}", *sets], only=[])
    jobs = Graph(cfg).jobs
    metric = dict(reward_mean=0.5, reward_std=0.1, loss=0.0, entropy=1.0, response_length=100.0, grad_norm=1.0,
                  clip_fraction=0.0, group_size=8, seconds=1.0)
    for job in jobs:
        path = results / job.output
        if job.rule == "prepare_base":
            result = BaseResult(scale=job.scale, params=1, warmstart_loss=None, seconds=0.0, spec_digest=job.digest)
        elif job.rule == "train":
            steps = [StepMetrics(step=s, **metric) for s in range(1, 501)]
            result = TrainResult(cell=job.cell, axes={}, steps=500, spec_digest=job.digest, metrics=steps)
        elif job.rule == "analyse":
            path.write_text(json.dumps({"spec_digest": job.digest, "cells": []}))
            continue
        elif job.rule == "retain":
            result = RetentionRecord(spec_digest=job.digest, cell=job.cell, keep_checkpoints=job.params,
                                     resume_digest="-", kept=[], deleted=[], pruned=[], bytes_freed=0)
        else:
            result = EvalResult(cell=job.cell or "base", step=job.step, accuracy=0.5, n=500, n_correct=250, seconds=1.0,
                                spec_digest=job.digest, base_eval=job.base_eval)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_result(path, result)
    return len(jobs)


def timed(argv: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one command: on a busy machine the CPU time is the steadier."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--snakemake", action="store_true", help="also time the Snakemake dry-run (slow)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        variants: dict[str, list[str]] = {"python -c pass": [sys.executable, "-c", "pass"]}
        sizes = {}
        for name, (config, sets) in GRIDS.items():
            results = Path(tmp) / name.replace(" ", "_").replace(",", "")
            sizes[name] = fill(config, sets, results)
            overrides = [arg for s in [f"results_dir={results}", *sets] for arg in ("--set", s)]
            variants[f"plan: {name}"] = [sys.executable, "-m", "matrixrl", "plan", "-c", str(config), *overrides]
            if args.snakemake and "4 seeds" not in name:
                probe = (
                    "import sys; from matrixrl.config import load_config; from matrixrl.snake.command import pending_jobs; "
                    "from pathlib import Path; "
                    f"cfg = load_config({str(config)!r}, sets={[f'results_dir={results}', *sets]!r}, only=[]); "
                    "pending_jobs(cfg, Path(cfg.results_dir))"
                )
                variants[f"snakemake dry-run: {name}"] = [sys.executable, "-c", probe]
        samples: dict[str, list[float]] = {name: [] for name in variants}
        cpu: dict[str, list[float]] = {name: [] for name in variants}
        memory: dict[str, int] = {}
        for _ in range(args.repeats):
            for name, argv in variants.items():
                wall, used = timed(argv)
                samples[name].append(wall)
                cpu[name].append(used)
        for name, argv in variants.items():  # peak RSS, each alone (getrusage keeps the maximum)
            memory[name] = _peak_rss(argv)
    reference = statistics.median(samples["python -c pass"])
    print(f"{'variant':<34} {'jobs':>6} {'wall':>8} {'× python':>9} {'CPU':>8} {'peak RSS':>9}")
    for name, times in samples.items():
        grid = name.split(": ", 1)[-1]
        jobs = sizes.get(grid, "")
        median = statistics.median(times)
        print(
            f"{name:<34} {jobs:>6} {median:7.2f}s {median / reference:8.1f}× {statistics.median(cpu[name]):7.2f}s "
            f"{memory[name]:7d}MB"
        )
    small, large = statistics.median(samples["plan: default grid"]), statistics.median(samples["plan: paper.yaml, 4 seeds"])
    jobs_ratio = sizes["paper.yaml, 4 seeds"] / sizes["default grid"]
    print(f"plan of {sizes['paper.yaml, 4 seeds']} jobs vs {sizes['default grid']}: {large / small:.1f}× the time "
          f"for {jobs_ratio:.0f}× the jobs")


def _peak_rss(argv: list[str]) -> int:
    """Peak resident memory (MB) of one command, measured by a fresh parent that runs only it."""
    probe = (
        "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)"
    )
    return int(subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, check=True).stdout)


if __name__ == "__main__":
    main()
