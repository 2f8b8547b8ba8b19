"""The results directory's layout: where each job's files live under ``results_dir``.

The tree: docs/architecture.md, "The job graph, defined once".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

STORE_FILE = "matrixrl.sqlite"
SUMMARY_FILE = "summary.json"
CONFIG_FILE = ".matrixrl/config.yaml"
PLOTS_DIR = "plots"
SNAKEMAKE_LOGS = "logs/snakemake"
RUNS_DIR = ".matrixrl/runs"
RUN_LOCK_FILE = ".matrixrl/run.lock"
"""Held (``flock``) by the `matrixrl run` that uses the folder, from its first look at it to its end."""
LAST_RUN_FILE = ".matrixrl/last-run.json"
"""What the last `matrixrl run` took beyond its jobs (Snakemake's start, the job server's imports): plan's estimate adds it."""
SNAKEMAKE_LOCKS = ".snakemake/locks"

TRAIN_RESULTS = "cells/*/train.json"
"""Glob of every cell's training result."""
EVAL_RESULTS = "cells/*/eval/step_*.json"
"""Glob of every checkpoint's evaluation."""
MEMORY_EVAL_RESULTS = "cells/*/memory/*/step_*.json"
"""Glob of every checkpoint's evaluation under a memory."""
TRAJECTORY_RESULTS = "memory/*/trajectories/*.json"
LABEL_RESULTS = "memory/*/labels.json"
DISTILLED_RESULTS = "memory/*/distilled/*.json"
BANK_RESULTS = "memory/*/banks/*.json"


def base_model_dir(scale: str) -> str:
    return f"base/{scale}/model"


def base_result(scale: str) -> str:
    return f"base/{scale}/base.json"


def base_eval_result(scale: str, name: str) -> str:
    return f"base/{scale}/eval/{name}.json"


def cell_dir(cell_id: str) -> str:
    return f"cells/{cell_id}"


TRAIN_FILE = "train.json"


def train_result(cell_id: str) -> str:
    return f"cells/{cell_id}/{TRAIN_FILE}"


def eval_result(cell_id: str, step: int | str) -> str:
    return f"cells/{cell_id}/eval/step_{step}.json"


def memory_eval_result(cell_id: str, mode: str, step: int | str) -> str:
    return f"cells/{cell_id}/memory/{mode}/step_{step}.json"


def base_memory_eval_result(scale: str, bank: str, name: str) -> str:
    return f"base/{scale}/memory/{bank}/{name}.json"


def trajectories_result(task: str, scale: str, samples: int | str) -> str:
    return f"memory/{task}/trajectories/{scale}-k{samples}.json"


def labels_result(task: str) -> str:
    return f"memory/{task}/labels.json"


def distilled_result(task: str, bank: str) -> str:
    return f"memory/{task}/distilled/{bank}.json"


def bank_result(task: str, bank: str) -> str:
    return f"memory/{task}/banks/{bank}.json"


RETENTION_FILE = "retained.json"


def retention_record(cell_id: str) -> str:
    return f"cells/{cell_id}/{RETENTION_FILE}"


@dataclass(frozen=True)
class ResultFile:
    """What a result file is, as its place in the layout says (:func:`result_file`).

    ``kind`` names the function above that builds such a path; ``name`` is the file's name less
    ``.json``; the folders name the rest (``cell``, ``scale``, ``task``, ``mode``, ``bank``).
    """

    kind: str
    name: str
    cell: str | None = None
    scale: str | None = None
    task: str | None = None
    mode: str | None = None
    bank: str | None = None

    @property
    def step(self) -> str:
        """An evaluation's step as its name says it (``N`` of ``step_N``; the whole name if not so)."""
        return self.name.removeprefix("step_")


_RESULT_PATHS = (
    # The builders' paths by their last parts: "{field}", a folder whose name is that field of
    # the ResultFile; "{name}", the file's name less .json. Longer ones first: a path is the
    # first one it ends in.
    ("memory_eval", ("cells", "{cell}", "memory", "{mode}", "{name}")),
    ("base_memory_eval", ("base", "{scale}", "memory", "{bank}", "{name}")),
    ("eval", ("cells", "{cell}", "eval", "{name}")),
    ("base_eval", ("base", "{scale}", "eval", "{name}")),
    ("trajectories", ("memory", "{task}", "trajectories", "{name}")),
    ("distilled", ("memory", "{task}", "distilled", "{name}")),
    ("bank", ("memory", "{task}", "banks", "{name}")),
    ("labels", ("memory", "{task}", "labels.json")),
    ("train", ("cells", "{cell}", TRAIN_FILE)),
    ("retained", ("cells", "{cell}", RETENTION_FILE)),
    ("base", ("base", "{scale}", "base.json")),
)


def result_file(path: str | Path) -> ResultFile | None:
    """What the result file at ``path`` is: ``path`` relative to the results folder, or any
    path that ends in one (a job's input); None if it is no result file's path."""
    path = Path(path)
    parts = path.parts
    for kind, pattern in _RESULT_PATHS:
        tail = parts[-len(pattern) :]
        if len(parts) < len(pattern) or any(p != t for p, t in zip(pattern, tail) if not p.startswith("{")):
            continue
        folders = {p[1:-1]: t for p, t in zip(pattern[:-1], tail) if p.startswith("{")}
        return ResultFile(kind, path.stem, **folders)
    return None


MEMORY_OWNER = "memory:"
"""A memory-building result's owner in the store (its ``cell`` in ingested_files and
memory_inputs): ``memory:TASK`` (no cell id has a colon)."""


def result_key(path: str | Path) -> tuple[str, str]:
    """The store's key of the result in the result file at ``path`` (as :func:`result_file`
    reads it): ``(owner, part)``, its cell (``memory:TASK`` for a memory-building result)
    and its key among that owner's results: ``train``, ``eval/step_N``,
    ``memory/MODE/step_N``; ``trajectories/SCALE-kN``, ``labels``, ``distilled/BANK``,
    ``bank/BANK``. ValueError for a path of no result the store holds."""
    found = result_file(path)
    kind = found.kind if found is not None else None
    if kind == "train":
        return found.cell, "train"
    if kind == "eval":
        return found.cell, f"eval/{found.name}"
    if kind == "memory_eval":
        return found.cell, f"memory/{found.mode}/{found.name}"
    if kind == "labels":
        return f"{MEMORY_OWNER}{found.task}", "labels"
    if kind in ("trajectories", "distilled", "bank"):
        return f"{MEMORY_OWNER}{found.task}", f"{kind}/{found.name}"
    raise ValueError(f"{path}: not the path of a result the store holds")


def checkpoints_dir(cell_dir: str | Path) -> Path:
    """Where a cell's trainer writes its checkpoints (``cell_dir`` as a job receives it)."""
    return Path(cell_dir) / "checkpoints"


def checkpoint_of(cell_id: str, step: int | str) -> str:
    """A cell's checkpoint folder, relative to the results folder, as a string (what a job is
    handed; the same folder as :func:`checkpoint_dir` of the cell's folder, without a Path)."""
    return f"cells/{cell_id}/checkpoints/step_{step}"


def checkpoint_dir(cell_dir: str | Path, step: int | str) -> Path:
    return checkpoints_dir(cell_dir) / f"step_{step}"


def cell_dir_of(checkpoint: str | Path) -> Path:
    """The cell folder a checkpoint folder belongs to."""
    return Path(checkpoint).parent.parent


def run_record(pid: int) -> str:
    """Where a `matrixrl run` with this pid records itself while its Snakemake runs."""
    return f"{RUNS_DIR}/{pid}.json"


def job_log(
    rule: str, cell: str = "{cell}", scale: str = "{scale}", step: int | str = "{step}", name: str = "{name}"
) -> str:
    """A job's log; with the defaults, the Snakemake pattern with its wildcards."""
    return {
        "prepare_base": f"logs/prepare_base/{scale}.log",
        "evaluate_base": f"logs/evaluate_base/{scale}/{name}.log",
        "train": f"logs/train/{cell}.log",
        "copy_base_eval": f"logs/evaluate/{cell}/step_0.log",
        "evaluate": f"logs/evaluate/{cell}/step_{step}.log",
        "retain": f"logs/retain/{cell}.log",
        "collect": "logs/memory/{task}/collect/{scale}-k{samples}.log",
        "label": "logs/memory/{task}/label.log",
        "distill": "logs/memory/{task}/distill/{bank}.log",
        "bank": "logs/memory/{task}/bank/{bank}.log",
        "evaluate_base_memory": "logs/evaluate_base_memory/{scale}/{bank}/{name}.log",
        "copy_base_memory_eval": "logs/evaluate_memory/{cell}/{mode}/step_0.log",
        "evaluate_memory": f"logs/evaluate_memory/{cell}/{{mode}}/step_{step}.log",
        "analyse": "logs/analyse.log",
    }[rule]


_STORE_STAND_INS: dict[Path, Path] = {}
"""results_dir → a private copy of its store that this process reads and writes instead: set by an
ingest that had results to read into a store it cannot write (a read-only archive or shared copy)."""


def store_path(results_dir: str | Path) -> Path:
    """The store of ``results_dir`` (``results_dir/matrixrl.sqlite``), or this process's stand-in for it."""
    results = Path(results_dir)
    return _STORE_STAND_INS.get(results.absolute(), results / STORE_FILE)


def stand_in_store(results_dir: str | Path, copy: Path | None) -> None:
    """Read and write ``copy`` as ``results_dir``'s store in this process from now on (None: its own again)."""
    results = Path(results_dir).absolute()
    if copy is None:
        _STORE_STAND_INS.pop(results, None)
    else:
        _STORE_STAND_INS[results] = copy


def has_results(results_dir: str | Path) -> bool:
    """Whether any result is there to report: an evaluation file or a store."""
    results = Path(results_dir)
    return (results.is_dir() and any(results.glob(EVAL_RESULTS))) or store_path(results).exists()
