# The rules live in the package (matrixrl/workflow/Snakefile) so that a
# pip-installed matrixrl finds them; this file lets `snakemake` run from here too.
include: "matrixrl/workflow/Snakefile"
