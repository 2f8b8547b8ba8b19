"""Job entry points: one function per Snakemake rule, files in → file out.

``python -m matrixrl.jobs RULE SPEC_JSON PATHS...`` runs one by hand. Modules import torch only
inside functions, so the Snakefile stays quick to load.
"""
