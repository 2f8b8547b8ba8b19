"""``python -m matrixrl.jobs RULE ...``: a job's process entry.

The Snakefile runs these jobs in children of a pre-imported fork server
(matrixrl/jobs/forked.py), which call ``run`` with the same arguments; the command
line stays for running one job by hand.
"""

from __future__ import annotations

import sys
from pathlib import Path

from matrixrl.grid import BaseSpec, CellSpec, MemoryEvalSpec


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

        base_dir, cell_dir, output, *memory = map(Path, paths)
        train(CellSpec.model_validate_json(spec_json), base_dir, cell_dir, output, log=log, memory=tuple(memory) or None)
    elif rule == "evaluate":
        from matrixrl.jobs.evaluate import evaluate

        step, checkpoint, base_dir, output = paths
        evaluate(CellSpec.model_validate_json(spec_json), int(step), Path(checkpoint), Path(base_dir), Path(output), log=log)
    elif rule == "evaluate_base":
        from matrixrl.jobs.evaluate import evaluate_base

        base_dir, output = map(Path, paths)
        evaluate_base(CellSpec.model_validate_json(spec_json), base_dir, output, log=log)
    elif rule in ("collect", "label"):
        from matrixrl.jobs import memory
        from matrixrl.memory.specs import CollectSpec, LabelSpec

        base_dir, output = map(Path, paths)
        kind = CollectSpec if rule == "collect" else LabelSpec
        getattr(memory, rule)(kind.model_validate_json(spec_json), base_dir, output, log=log)
    elif rule == "distill":
        from matrixrl.jobs.memory import distill
        from matrixrl.memory.specs import DistillSpec

        base_dir, output, *collections = map(Path, paths)
        distill(DistillSpec.model_validate_json(spec_json), base_dir, collections, output, log=log)
    elif rule == "evaluate_memory":
        from matrixrl.jobs.evaluate import evaluate_memory

        step, checkpoint, base_dir, bank, labels, output = paths
        evaluate_memory(
            MemoryEvalSpec.model_validate_json(spec_json), int(step), Path(checkpoint), Path(base_dir), Path(bank),
            Path(labels), Path(output), log=log,
        )
    elif rule == "evaluate_base_memory":
        from matrixrl.jobs.evaluate import evaluate_base_memory

        base_dir, bank, labels, output = map(Path, paths)
        evaluate_base_memory(MemoryEvalSpec.model_validate_json(spec_json), base_dir, bank, labels, output, log=log)
    else:
        raise SystemExit(f"unknown job rule {rule!r}")


def run(argv: list[str]) -> None:
    """``main`` with the errors a user can fix reported as one line (exit 1), not a traceback.

    The job's log (the run names it) ends with that line; a full disk or a permission
    problem keeps its traceback above the line, which says what it is and the fix.
    """
    import traceback

    from matrixrl.errors import UserError, disk_error_message

    try:
        main(argv)
    except UserError as exc:
        print(f"Error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    except Exception as exc:
        message = disk_error_message(exc)
        if message is None:
            raise
        traceback.print_exc()
        print(f"Error: {message}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


if __name__ == "__main__":
    run(sys.argv[1:])
