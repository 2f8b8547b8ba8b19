"""The ``matrixrl`` command (``python -m matrixrl`` too).

Kept apart from :mod:`matrixrl.cli` so that a Ctrl-C while it loads ends with one line and exit
130, and a plugin that cannot be imported is one line and exit 2.
"""

import sys


def main() -> None:
    from matrixrl.errors import UserError

    try:
        try:
            from matrixrl.cli import main as cli_main
        except UserError as exc:  # a plugin's (PluginError), met as the CLI imports the registries
            sys.stderr.write(f"Error: {exc}\n")
            raise SystemExit(exc.exit_code) from None
        cli_main()
    except KeyboardInterrupt:
        sys.stderr.write("Interrupted.\n")
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
