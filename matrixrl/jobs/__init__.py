"""Job entry points: one function per Snakemake rule, files in → file out.

The Snakefile's ``run:`` rules call them: ``evaluate`` and ``analyse`` inside the
Snakemake process, ``train`` and ``prepare_base`` in a child forked from a
pre-imported server (``forked.py``). ``python -m matrixrl.jobs RULE SPEC_JSON PATHS...``
runs one training or warm-start by hand. Modules import torch only inside
functions, so the Snakefile itself stays quick to load.
"""
