"""``python -m matrixrl.jobs RULE ...``: the process entry of the shell rules."""

from __future__ import annotations

import sys
from pathlib import Path

from matrixrl.grid import BaseSpec, CellSpec


def log(message: str) -> None:
    print(message, flush=True)


def main(argv: list[str]) -> None:
    rule, spec_json, *paths = argv
    if rule == "prepare_base":
        from matrixrl.jobs.prepare_base import prepare_base

        model_dir, output = map(Path, paths)
        prepare_base(BaseSpec.model_validate_json(spec_json), model_dir, output, log=log)
    elif rule == "train":
        from matrixrl.jobs.train import train

        base_dir, cell_dir, output = map(Path, paths)
        train(CellSpec.model_validate_json(spec_json), base_dir, cell_dir, output, log=log)
    else:
        raise SystemExit(f"unknown job rule {rule!r}")


if __name__ == "__main__":
    from matrixrl.models.devices import GpuClaimError
    from matrixrl.models.hf import ModelLoadError

    try:
        main(sys.argv[1:])
    except (ModelLoadError, GpuClaimError) as exc:
        # The job log (the run names it) ends with the one line that says what to fix.
        print(f"Error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
