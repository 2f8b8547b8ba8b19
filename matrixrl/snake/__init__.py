"""Talking to Snakemake: its command line, its log, its process, its profiles (one module each).

``command``, ``events``, ``process``, ``profiles`` and ``__main__`` (the dry-run's process);
the rules themselves are matrixrl.dag's. Re-exported for the Snakefile: follow_run.
"""

from matrixrl.snake.process import follow_run

__all__ = ["follow_run"]
