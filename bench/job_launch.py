"""What does starting a training job cost? A fresh Python process vs a child of the job server.

The ``train`` and ``prepare_base`` rules fork their jobs from a server that imported
torch + transformers once (matrixrl/jobs/forked.py) instead of starting
``python -m matrixrl.jobs`` per job. This benchmark runs the same short training
job (the default grid's single/arith/tiny-s cell, 2 GRPO steps) N times each way,
one after another, and prints the seconds per job and their ratio. The job
server's own start (its one import) is counted in the forked total: the bench starts
one of its own. Then the same jobs again from that server, as a later run finds it
(the server outlives a run, matrixrl/jobs/forked.py).

    python bench/job_launch.py [--jobs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5, help="training jobs per variant")
    args = parser.parse_args()

    from matrixrl import grid as G
    from matrixrl.config import load_config
    from matrixrl.jobs.forked import run_job

    config = load_config(REPO / "experiments.yaml", sets=["train.steps=2", "train.eval_every=2", "scales.tiny-s.warmstart.steps=20"])
    cell = next(c for c in G.cells(config) if (c.workflow, c.task, c.scale, c.policy) == ("single", "arith", "tiny-s", "shared"))
    spec = G.cell_spec(config, cell).model_dump_json()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        base = tmp / "base"
        prepare = ["prepare_base", G.base_spec(config, "tiny-s").model_dump_json(), json.dumps([str(base / "model"), str(base / "base.json")])]
        subprocess.run([sys.executable, "-m", "matrixrl.jobs", *prepare], check=True, capture_output=True)

        def train_argv(i: int) -> list[str]:
            cell_dir = tmp / f"cell{i}"
            shutil.rmtree(cell_dir, ignore_errors=True)
            return ["train", spec, json.dumps([str(base / "model"), str(cell_dir), str(cell_dir / "train.json"), None])]

        began = time.perf_counter()
        for i in range(args.jobs):
            with open(tmp / "shell.log", "w") as log:
                subprocess.run([sys.executable, "-m", "matrixrl.jobs", *train_argv(i)], check=True, stdout=log, stderr=subprocess.STDOUT)
        shell = (time.perf_counter() - began) / args.jobs

        # A server of its own (no other run's, already warm), ended with this process: its start counts.
        os.environ.update(XDG_RUNTIME_DIR=str(tmp), MATRIXRL_JOB_SERVER_LINGER_S="0")
        began = time.perf_counter()
        for i in range(args.jobs):
            run_job(train_argv(i), cell.id, str(tmp / "forked.log"))
        fork = (time.perf_counter() - began) / args.jobs

        began = time.perf_counter()  # a later run's jobs: the server is up
        for i in range(args.jobs):
            run_job(train_argv(i), cell.id, str(tmp / "forked.log"))
        warm = (time.perf_counter() - began) / args.jobs

    print(f"{args.jobs} training jobs of 2 GRPO steps each (single/arith/tiny-s), one at a time:")
    print(f"  python -m matrixrl.jobs per job        {shell:6.2f} s/job")
    print(f"  forked from the pre-imported server    {fork:6.2f} s/job  (server start included)")
    print(f"  forked, a later run (server up)        {warm:6.2f} s/job")
    print(f"  ratio per-process / forked: {shell / fork:.1f}x; saved {shell - fork:.1f} s per job")
    print(f"  ratio per-process / forked from a server already up: {shell / warm:.1f}x")


if __name__ == "__main__":
    main()
