"""Job entry points: one function per Snakemake rule, files in → file out.

The Snakefile's rules call them through ``matrixrl.jobs.execute``, forked from the job
server (``forked.py``) or in Snakemake's process as ``matrixrl.dag.KINDS`` says;
``python -m matrixrl.jobs RULE SPEC_JSON PATHS...`` runs one by hand. Modules import torch
only inside functions, so the Snakefile stays quick to load.
"""
