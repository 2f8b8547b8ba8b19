"""Job entry points: one function per Snakemake rule, files in → file out (torch imported inside functions)."""
