"""``python -m matrixrl.jobs KIND SPEC ARGS``: a job's process entry, for running one job by hand.

The Snakefile's jobs call the same ``run`` in children of the job server (matrixrl/jobs/forked.py).
"""

from __future__ import annotations

import sys


def log(message: str) -> None:
    print(message, flush=True)


def main(argv: list[str]) -> None:
    """``KIND SPEC ARGS``: the function of the job's kind, with its spec and arguments (matrixrl.dag.call)."""
    from matrixrl.dag import call

    call(argv, log)


def run(argv: list[str]) -> None:
    """``main`` with the errors a user can fix reported as one line (exit 1), not a traceback.

    The job's log (the run names it) ends with that line; a full disk or a permission
    problem keeps its traceback above the line, which says what it is and the fix.
    """
    import traceback

    from matrixrl.errors import UserError, disk_error_message

    try:
        main(argv)
    except UserError as exc:
        print(f"Error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    except Exception as exc:
        message = disk_error_message(exc)
        if message is None:
            raise
        traceback.print_exc()
        print(f"Error: {message}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


if __name__ == "__main__":
    run(sys.argv[1:])
