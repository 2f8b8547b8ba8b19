"""Per-job log files for jobs that run inside the Snakemake process (``run:`` rules)."""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


def file_logger(path: str | Path) -> Callable[[str], None]:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")

    def log(message: str) -> None:
        with path.open("a") as handle:
            handle.write(message + "\n")

    return log


@contextmanager
def logged_failures(log: Callable[[str], None]) -> Iterator[None]:
    """Writes what goes wrong inside the block to ``log`` as the job's last ``Error:`` line
    (a user error or a disk error as its message, anything else with its traceback first),
    then raises it: Snakemake fails the job and ``failure_cause`` names it from the log."""
    from matrixrl.errors import UserError, disk_error_message

    try:
        yield
    except Exception as exc:
        message = str(exc) if isinstance(exc, UserError) else disk_error_message(exc)
        if message is None:
            log(traceback.format_exc().rstrip())
            message = f"{type(exc).__name__}: {exc}"
        log(f"Error: {message}")
        raise


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
