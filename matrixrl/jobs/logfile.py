"""Per-job log files for jobs that run inside the Snakemake process (``run:`` rules)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable


def file_logger(path: str | Path) -> Callable[[str], None]:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")

    def log(message: str) -> None:
        with path.open("a") as handle:
            handle.write(message + "\n")

    return log
