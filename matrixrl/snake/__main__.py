"""``python -m matrixrl.snake``: Snakemake's dry-run in a fresh process, the one ``pending_jobs`` starts.

Prints the JSON list of the pending jobs on stdout.
"""

import json
import sys
from pathlib import Path

from matrixrl.snake.command import dry_run_in_this_process

if __name__ == "__main__":
    print(json.dumps(dry_run_in_this_process(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:])))
