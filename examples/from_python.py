"""The default study's table (docs/default-study.md), and its learning curves, from Python.

    python examples/from_python.py                      # the repository's experiments.yaml and results/
    python examples/from_python.py examples/lr-sweep.yaml --only train.lr=1e-04

Prints the summary of seed 0 arranged by policy, as docs/default-study.md shows it (peak, its
step, final accuracy and the gain in standard errors, shared beside isolated), and
writes each task's learning-curve figure as a PNG, by default into the study's results
folder (``results/plots-from-python/``, which git ignores), never into the checkout.
docs/api.md has the API it uses.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matrixrl

OUT = "plots-from-python"  # under the study's results folder, so a checkout's git ignores it
HEADER = (
    "| workflow | task | scale | base | shared: peak (step) → final | gain, SEs | isolated: peak (step) → final | gain, SEs |\n"
    "|---|---|---|---|---|---|---|---|"
)


def by_policy(summary, runs: dict[str, str]) -> list[str]:
    """One markdown row per workflow, task and scale: shared beside isolated (seed 0).

    ``summary``: ``study.table("summary")`` (indexed by cell id); ``runs``: each cell's run id.
    """

    def run(row) -> str:
        return f"{row['peak']:.3f} ({row['peak_step']}) → {row['final']:.3f} | {row['gain_z']:+.1f}"

    rows = []
    seed0 = summary[summary["seed"] == summary["seed"].min()]
    for (workflow, task, scale), cells in seed0.groupby(["workflow", "task", "scale"], sort=False):
        shared = cells[cells["policy"] == "shared"].iloc[0]
        isolated = cells[cells["policy"] == "isolated"]
        # A one-role workflow's isolated cell is its shared run (the table's caption says so).
        if isolated.empty:
            right = "— | —"
        elif runs[isolated.index[0]] != isolated.index[0]:
            right = "same run as shared (one role) | —"
        else:
            right = run(isolated.iloc[0])
        rows.append(f"| {workflow} | {task} | {scale} | {shared['base']:.3f} | {run(shared)} | {right} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default=str(Path(__file__).resolve().parent.parent / "experiments.yaml"))
    parser.add_argument("--only", action="append", default=[], metavar="AXIS=V1,V2", help="as matrixrl report --only")
    parser.add_argument("--out", help=f"folder for the PNG files [default: RESULTS/{OUT}]")
    args = parser.parse_args()

    study = matrixrl.Study.load(args.config, only=args.only)
    print(HEADER)
    cells = study.cells()
    print("\n".join(by_policy(study.table("summary"), dict(zip(cells["cell"], cells["run"])))))

    out = Path(args.out) if args.out else study.results_dir / OUT
    out.mkdir(parents=True, exist_ok=True)
    for task in cells["task"].unique():
        path = out / f"curves-{task}.png"
        study.figure("curves", task=task).savefig(path, dpi=110, facecolor="white")
        print(path)


if __name__ == "__main__":
    main()
