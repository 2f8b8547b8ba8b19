"""Print the table of docs/lr-sweep.md from a finished run of examples/lr-sweep.yaml.

    matrixrl run -c examples/lr-sweep.yaml --cores 2
    python examples/lr_sweep_table.py            # or: ... path/to/other-sweep.yaml

One row per (task, scale, lr): base, peak (with its steps) and final accuracy, mean
over the seeds, then each seed's peak - base and final - base in standard errors of
the difference (``peak_gain_z``, ``gain_z`` of ``matrixrl report``). The rate is the
grid's extra axis ``train.lr``, a column of every report table.
"""

from __future__ import annotations

import sys
from pathlib import Path

from matrixrl.config import load_config
from matrixrl.report.tables import build_tables
from matrixrl.store import ingest, store_path


def rate(lr: float) -> str:
    return f"{lr:.0e}".replace("e-0", "e-")  # 1e-4, as the scale names write it


def main(path: str) -> None:
    config = load_config(path)
    ingest(config.results_dir)
    summary = build_tables(store_path(config.results_dir), config, ["summary"])["summary"]
    print("| task | scale | lr | base | peak (steps) | final | peak − base, SEs | final − base, SEs |")
    print("|---|---|---|---|---|---|---|---|")
    for (task, scale, lr), rows in summary.groupby(["task", "scale", "train.lr"], sort=False):
        steps = ", ".join(str(s) for s in rows["peak_step"])
        z = lambda column: " / ".join(f"{v:+.1f}" for v in rows[column])  # noqa: E731
        print(
            f"| {task} | {scale} | {rate(lr)} | {rows['base'].mean():.3f} | {rows['peak'].mean():.3f} ({steps}) "
            f"| {rows['final'].mean():.3f} | {z('peak_gain_z')} | {z('gain_z')} |"
        )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).with_name("lr-sweep.yaml")))
