"""Talking to Snakemake: its command line, its log, its process, its profiles (one module each).

- command: the Snakefile and its rule names (RULES, LOCAL_RULES), the resolved
  ``--configfile``, the environment and command line of a run, dry-runs and plan's job list
- events: Snakemake's log read as run events, and the time a run has left
- process: a run's Snakemake process: stopped on a signal, recorded while it runs,
  stopped by Snakemake itself once its run is gone (follow_run)
- profiles: a profile's options and each rule's resources, for ``plan`` and ``run``
- __main__: ``python -m matrixrl.snake CONFIGFILE WORKDIR [STALE...]``, the dry-run's process

Re-exported here, for the Snakefile's ``from matrixrl.snake import LOCAL_RULES, RULES,
follow_run``: RULES, LOCAL_RULES and follow_run. Everything else is imported from its module.
"""

from matrixrl.snake.command import LOCAL_RULES, RULES
from matrixrl.snake.process import follow_run

__all__ = ["LOCAL_RULES", "RULES", "follow_run"]
