"""The grid: cells, their ids, their checkpoints, and where their results live.

Every path here is relative to ``results_dir``, which is Snakemake's working
directory, so the Snakefile, the jobs and the store agree on one layout:

    base/{scale}/model/                 warm-started base model (prepare_base)
    base/{scale}/base.json              its summary: the rule's declared output
    cells/{cell}/checkpoints/step_{N}/  trainer checkpoints (not Snakemake outputs,
                                        so a rerun after a kill resumes from them)
    cells/{cell}/train.json             per-step training metrics (train)
    cells/{cell}/eval/step_{N}.json     one checkpoint's accuracy (evaluate)
    summary.json                        per-cell summary (analyse, after ingest)
    matrixrl.sqlite                     the store
    logs/{rule}/...                     one log per job
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from matrixrl.config import AXES, Config, Evaluate, Policies, PromptSettings, Scale, TaskConfig, Train, Workflows

STORE_FILE = "matrixrl.sqlite"
SUMMARY_FILE = "summary.json"


@dataclass(frozen=True, order=True)
class Cell:
    workflow: str
    task: str
    scale: str
    policy: str
    seed: int

    @property
    def id(self) -> str:
        return f"{self.workflow}-{self.task}-{self.scale}-{self.policy}-s{self.seed}"

    def axes(self) -> dict:
        return {axis: getattr(self, axis) for axis in AXES}


def cells(config: Config) -> list[Cell]:
    """Every combination of the grid's axes, in the order the axes list their values."""
    grid = config.grid
    return [Cell(*values) for values in itertools.product(*(getattr(grid, a) for a in AXES))]


def checkpoint_steps(train: Train) -> list[int]:
    """The evaluated checkpoints: step 0 (the base model), every ``eval_every`` steps, and the last step."""
    steps = list(range(0, train.steps + 1, train.eval_every))
    if steps[-1] != train.steps:
        steps.append(train.steps)
    return steps


def save_steps(train: Train) -> list[int]:
    """Every checkpoint the trainer writes: the evaluated ones plus resume points every ``checkpoint_every``."""
    extra = range(0, train.steps + 1, train.checkpoint_every) if train.checkpoint_every else ()
    return sorted(set(checkpoint_steps(train)) | set(extra))


def job_gpus(scale) -> int:
    """GPUs one training or evaluation job of ``scale`` asks Snakemake for (``resources: gpu``)."""
    from matrixrl.models.hf import needs_gpu

    return int(needs_gpu(scale))


class CellSpec(BaseModel):
    """Everything one cell's jobs compute from, and nothing else.

    It is the Snakemake ``params`` of the cell's jobs: changing a setting reruns
    exactly the cells it affects, while adding a seed or a scale leaves the
    existing cells' specs, and so their results, untouched.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    cell: Cell
    scale: Scale
    task: TaskConfig
    workflow: dict  # this cell's workflow settings (not every workflow's)
    policies: Policies
    prompts: PromptSettings
    train: Train
    eval: Evaluate


def cell_spec(config: Config, cell: Cell) -> CellSpec:
    scale = config.scales[cell.scale]
    return CellSpec(
        cell=cell,
        scale=scale,
        task=config.tasks[cell.task],
        workflow=getattr(config.workflows, cell.workflow).model_dump(),
        policies=config.policies,
        # Only the chat style reads these: compact cells keep the defaults, so tuning them reruns nothing else.
        prompts=config.prompts if scale.prompt_style == "chat" else PromptSettings(),
        train=config.train,
        eval=config.eval,
    )


class BaseSpec(BaseModel):
    """What a scale's base model is computed from: its definition and the tasks it warm-starts on.

    It names every task defined under ``tasks:`` and every workflow (not just the
    grid's), because the warm-start teaches all their role formats, so that
    narrowing the grid with ``--only`` never re-prepares a base model.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    scale_name: str
    scale: Scale
    tasks: dict[str, TaskConfig]
    workflows: Workflows


def base_spec(config: Config, scale: str) -> BaseSpec:
    return BaseSpec(
        scale_name=scale,
        scale=config.scales[scale],
        tasks=dict(sorted(config.tasks.items())),
        workflows=config.workflows,
    )


# Paths, relative to results_dir ---------------------------------------------------------


def base_model_dir(scale: str) -> str:
    return f"base/{scale}/model"


def base_result(scale: str) -> str:
    return f"base/{scale}/base.json"


def cell_dir(cell_id: str) -> str:
    return f"cells/{cell_id}"


def train_result(cell_id: str) -> str:
    return f"cells/{cell_id}/train.json"


def eval_result(cell_id: str, step: int | str) -> str:
    return f"cells/{cell_id}/eval/step_{step}.json"
