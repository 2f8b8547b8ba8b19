"""The ``matrixrl`` command (``python -m matrixrl`` too).

Kept apart from :mod:`matrixrl.cli` so that a Ctrl-C while the CLI and its
libraries load, or while a command that holds no signal handler of its own runs
(``run`` has its own), ends with one line and exit 130, never a traceback.
"""

import sys


def main() -> None:
    try:
        from matrixrl.cli import main as cli_main

        cli_main()
    except KeyboardInterrupt:
        sys.stderr.write("Interrupted.\n")
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
