"""Talking to Snakemake: its command line, its log, its process, its profiles (one module each).

Re-exported for the Snakefile: follow_run.
"""

from matrixrl.snake.process import follow_run

__all__ = ["follow_run"]
