"""Start-up time of the ``matrixrl`` command, against starting a bare interpreter.

A user types ``matrixrl --help`` or a command's ``--help`` many times; neither
needs torch, pandas or Snakemake, so neither should pay for them. Measured in one
run, interleaved so machine load hits every variant alike, as medians of wall time:

- ``python -c pass``: the reference, this interpreter with its site-packages;
- ``import typer, rich``: the floor any typer CLI pays;
- ``matrixrl --help`` and ``matrixrl plan --help`` (``python -m matrixrl``: the
  console script adds only its own tiny wrapper);
- ``from matrixrl.config import load_config``: what every command then pays to read
  experiments.yaml (pydantic, the tasks' schema), for scale.

    python bench/cli_start.py [--repeats 15]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

VARIANTS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "import typer, rich": [sys.executable, "-c", "import typer, rich.console"],
    "matrixrl --help": [sys.executable, "-m", "matrixrl", "--help"],
    "matrixrl plan --help": [sys.executable, "-m", "matrixrl", "plan", "--help"],
    "import matrixrl.config": [sys.executable, "-c", "from matrixrl.config import load_config"],
}


def timed(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    samples: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for argv in VARIANTS.values():  # warm the file cache
        timed(argv)
    for _ in range(args.repeats):
        for name, argv in VARIANTS.items():
            samples[name].append(timed(argv))
    reference = statistics.median(samples["python -c pass"])
    print(f"{'variant':<24} {'median':>9} {'vs python -c pass':>18}")
    for name, times in samples.items():
        median = statistics.median(times)
        print(f"{name:<24} {median * 1000:7.0f} ms {median / reference:17.1f}×")


if __name__ == "__main__":
    main()
