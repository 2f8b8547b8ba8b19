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


def failure_cause(path: str | Path) -> str | None:
    """What a failed job's log says went wrong: its last ``Error:`` line, else its last
    non-empty line (an exception's own line ends a traceback), without ``Error: ``."""
    try:
        lines = [line.strip() for line in Path(path).read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return None
    errors = [line for line in lines if line.startswith("Error: ")]
    cause = errors[-1] if errors else (lines[-1] if lines else None)
    return cause.removeprefix("Error: ") if cause else None
