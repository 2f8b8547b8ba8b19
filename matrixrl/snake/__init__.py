"""Talking to Snakemake: its command line, its log, its process, its profiles (one module each).

- command: the Snakefile, the resolved ``--configfile``, the environment and command
  line of a run, dry-runs and plan's job list (the rules themselves: matrixrl.dag)
- events: Snakemake's log read as run events, and the time a run has left
- process: a run's Snakemake process: stopped on a signal, recorded while it runs,
  stopped by Snakemake itself once its run is gone (follow_run)
- profiles: a profile's options and each rule's resources, for ``plan`` and ``run``
- __main__: ``python -m matrixrl.snake CONFIGFILE WORKDIR [STALE...]``, the dry-run's process

Re-exported here, for the Snakefile: follow_run. Everything else is imported from its module.
"""

from matrixrl.snake.process import follow_run

__all__ = ["follow_run"]
