"""Which checkpoints of a cell stay once its evaluations are done (``train.keep_checkpoints``).

docs/configuration.md, "Checkpoint retention and the disk it needs".
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matrixrl import layout as L
from matrixrl.errors import ResultFileError
from matrixrl.results import EvalResult, ResultModel, read_result, write_result
from matrixrl.train.checkpoints import DELETING, complete_checkpoints, finish_removals, folder_bytes, remove_checkpoint

KEEP_MODES = ("key", "all")


class KeptCheckpoint(ResultModel):
    step: int
    why: list[str]
    bytes: int


def retention_digest(keep: str) -> str:
    """What a retain job's record is computed from, beyond its inputs (matrixrl.status)."""
    from matrixrl.settings import settings_digest

    return settings_digest({"keep_checkpoints": keep})


class RetentionRecord(ResultModel):
    """``cells/CELL/retained.json``: the retain job's account of a cell's checkpoints."""

    spec_digest: str | None = None  # retention_digest(keep_checkpoints)
    cell: str
    keep_checkpoints: str
    resume_digest: str  # the training whose checkpoints these are
    kept: list[KeptCheckpoint]
    deleted: list[int]  # removed by this job (or by its run a kill stopped)
    # Evaluated steps without a checkpoint once this job is done: deleted by it or before it
    # (Snakemake removes this file before the job reruns, so it cannot remember on its own).
    pruned: list[int]
    bytes_freed: int
    peak_step: int | None = None
    cliff_onset: int | None = None


def key_checkpoints(
    steps: Sequence[int],
    accuracies: Sequence[float],
    n: Sequence[int],
    se: Sequence[float | None] | None,
    latest: int | None,
    analysis,
) -> dict[int, list[str]]:
    """Step → why ``key`` keeps it, for one cell's evaluated curve (step 0 first) and its
    latest complete checkpoint ``latest``. Peak and cliff are the report's
    (``matrixrl.analysis.curves.summarize_curve`` under ``analysis``)."""
    from matrixrl.analysis.curves import summarize_curve

    order = sorted(range(len(steps)), key=lambda i: steps[i])
    steps = [int(steps[i]) for i in order]
    curve = summarize_curve(
        steps, [accuracies[i] for i in order], [n[i] for i in order], analysis, None if se is None else [se[i] for i in order]
    )
    reasons: dict[int, list[str]] = {}

    def keep(step: int, why: str) -> None:
        reasons.setdefault(step, []).append(why)

    if latest is not None:
        keep(latest, "resume")
    keep(curve.peak_step, "peak")
    keep(steps[-1], "final")
    if curve.cliff_onset is not None:
        at = steps.index(curve.cliff_onset)
        keep(steps[at - 1], "before cliff onset")  # the onset comes after the peak, so at >= 1
        keep(curve.cliff_onset, "cliff onset")
        if at + 1 < len(steps):
            keep(steps[at + 1], "after cliff onset")
    return dict(sorted(reasons.items()))


def retain(
    cell: str, cell_dir: Path, evaluations: Sequence[EvalResult], keep: str, analysis, resume_digest: str, log=print
) -> RetentionRecord:
    """Delete the checkpoints of ``cell_dir`` that ``keep`` does not keep; write and return its record.

    Only complete checkpoints of this training (``resume_digest``) are considered; others
    are the trainer's to remove. Safe to rerun after a kill: a removal it interrupted is
    finished, and the rest is decided afresh.
    """
    if keep not in KEEP_MODES:
        raise ValueError(f"keep_checkpoints {keep!r}: use one of {', '.join(KEEP_MODES)}")
    unfinished = finish_removals(cell_dir)  # a kill stopped this job mid-delete: those are pruned too
    if unfinished:
        log(f"finished removing {', '.join(f'step_{s}{DELETING}' for s in unfinished)}: a stopped run's removals")
    ours = sorted(step for step, digest in complete_checkpoints(cell_dir).items() if digest == resume_digest)
    peak_step = cliff_onset = None
    if keep == "all":
        reasons = {step: ["all"] for step in ours}
    else:
        curve = sorted(evaluations, key=lambda e: e.step)
        reasons = key_checkpoints(
            [e.step for e in curve], [e.accuracy for e in curve], [e.n for e in curve], [e.se for e in curve],
            max(ours, default=None), analysis,
        )  # fmt: skip
        peak_step = next((s for s, why in reasons.items() if "peak" in why), None)
        cliff_onset = next((s for s, why in reasons.items() if "cliff onset" in why), None)
    kept = [
        KeptCheckpoint(step=step, why=reasons[step], bytes=folder_bytes(L.checkpoint_dir(cell_dir, step)))
        for step in ours
        if step in reasons
    ]
    deleted, freed = list(unfinished), sum(unfinished.values())
    for step in ours:
        if step not in reasons:
            freed += remove_checkpoint(cell_dir, step)
            deleted.append(step)
    present = set(complete_checkpoints(cell_dir))
    record = RetentionRecord(
        spec_digest=retention_digest(keep),
        cell=cell,
        keep_checkpoints=keep,
        resume_digest=resume_digest,
        kept=kept,
        deleted=sorted(deleted),
        pruned=sorted({e.step for e in evaluations} - present),
        bytes_freed=freed,
        peak_step=peak_step,
        cliff_onset=cliff_onset,
    )
    write_result(Path(cell_dir) / L.RETENTION_FILE, record)
    summary = ", ".join(f"{k.step} ({', '.join(k.why)})" for k in kept) or "none"
    log(f"{cell}: kept checkpoints {summary}; deleted {len(deleted)}, freeing {format_bytes(freed)}")
    return record


def _read_record(path: Path) -> RetentionRecord | None:
    try:
        return read_result(path, RetentionRecord)
    except ResultFileError:  # missing or unreadable: nothing is known to have been pruned
        return None


def pruned_steps(cell_dir: str | Path, resume_digest: str) -> set[int]:
    """The evaluated steps of ``cell_dir`` whose checkpoints were gone when retention last ran
    (for this training), and still are."""
    record = _read_record(Path(cell_dir) / L.RETENTION_FILE)
    if record is None or record.resume_digest != resume_digest:
        return set()
    return set(record.pruned) - set(complete_checkpoints(Path(cell_dir)))


def format_bytes(n: float) -> str:
    """``n`` bytes in decimal units: 0 B, 812 kB, 1.2 GB, 340 GB."""
    units = ("B", "kB", "MB", "GB", "TB", "PB")
    i = 0
    while abs(n) >= 1000 and i < len(units) - 1:
        n /= 1000
        i += 1
    return f"{n:.0f} {units[i]}" if i <= 1 or abs(n) >= 100 else f"{n:.1f} {units[i]}"
