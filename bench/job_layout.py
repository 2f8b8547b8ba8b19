"""How should per-checkpoint evaluation jobs execute? In-process threads vs one process each.

Importing torch + transformers costs seconds per Python process, while evaluating
one tiny checkpoint takes a fraction of a second. Snakemake runs a ``run:`` rule
in its own process when given ``--force-use-threads`` (what ``matrixrl run``
passes) and otherwise spawns one Python process per job. This benchmark trains a
one-cell grid once, then re-runs only its evaluation jobs both ways, with the
same Snakefile, and prints the times and their ratio.

    python bench/job_layout.py [--checkpoints 11]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", type=int, default=11, help="evaluation jobs per variant")
    args = parser.parse_args()

    from matrixrl.config import load_config
    from matrixrl.layout import CONFIG_FILE
    from matrixrl.snake.command import job_environment, snakemake_command

    with tempfile.TemporaryDirectory() as tmp:
        raw = yaml.safe_load((REPO / "experiments.yaml").read_text())
        raw["grid"].update(workflow=["single"], scale=["tiny-s"], policy=["shared"], seed=[0])
        raw["scales"]["tiny-s"]["warmstart"]["steps"] = 30
        raw["train"].update(steps=2 * (args.checkpoints - 1), eval_every=2)
        config_path = Path(tmp) / "experiments.yaml"
        config_path.write_text(yaml.safe_dump(raw))
        subprocess.run([sys.executable, "-m", "matrixrl", "run", "-c", str(config_path), "--cores", "2"], check=True, capture_output=True)

        cfg = load_config(config_path)
        results = Path(cfg.results_dir)
        times = {}
        for variant in ("in-process threads (matrixrl run)", "one process per job (Snakemake default)"):
            for f in results.glob("cells/*/eval/*.json"):
                f.unlink()
            (results / "summary.json").unlink()
            command = snakemake_command(cfg, results / CONFIG_FILE, 2, ["--quiet", "all"])
            if variant.startswith("one process"):
                command.remove("--force-use-threads")
            began = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True, env=job_environment())
            times[variant] = time.perf_counter() - began
        shutil.rmtree(results, ignore_errors=True)

    (fast, t_fast), (slow, t_slow) = times.items()
    print(f"{args.checkpoints} evaluation jobs + analyse, 2 cores, tiny-s:")
    print(f"  {fast:42s} {t_fast:6.1f} s  ({t_fast / args.checkpoints:.2f} s/job)")
    print(f"  {slow:42s} {t_slow:6.1f} s  ({t_slow / args.checkpoints:.2f} s/job)")
    print(f"  ratio one-process-per-job / in-process: {t_slow / t_fast:.1f}x")


if __name__ == "__main__":
    main()
