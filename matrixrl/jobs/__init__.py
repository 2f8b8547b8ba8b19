"""Job entry points: one function per Snakemake rule, files in → file out.

Run as ``python -m matrixrl.jobs RULE SPEC_JSON OUTPUT`` from a ``shell:`` rule, or
called in-process from a ``run:`` rule. Modules import torch only inside
functions, so the Snakefile itself stays quick to load.
"""
