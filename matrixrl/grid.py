"""The grid: cells, their ids, the runs that compute them, their specs and digests.

Where a cell's files live is ``matrixrl.layout``'s business.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from pydantic import BaseModel, ConfigDict

from matrixrl.config import (
    AXES,
    Config,
    Evaluate,
    Policies,
    PromptSettings,
    Scale,
    TaskConfig,
    Train,
    TrainOverrides,
    Workflows,
    science,
)
from matrixrl.settings import settings_digest
from matrixrl.workflows import WORKFLOWS


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


def run_of(cell: Cell) -> Cell:
    """The cell whose computation ``cell`` is.

    A workflow with one role (``single``) has one parameter set under either policy
    mode, so its isolated cell is the same computation as its shared cell (same
    initial weights, same optimizer, same updates): it is computed once, as the
    shared cell, and reported under both.
    """
    if len(WORKFLOWS[cell.workflow].roles) == 1 and cell.policy != "shared":
        return replace(cell, policy="shared")
    return cell


def run_ids(config: Config) -> dict[str, str]:
    """Each grid cell's id → the id its results are stored under (its run's)."""
    return {cell.id: run_of(cell).id for cell in cells(config)}


def runs(config: Config) -> list[Cell]:
    """The distinct computations of the grid's cells (see :func:`run_of`), in grid order."""
    return list(dict.fromkeys(run_of(cell) for cell in cells(config)))


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

    Its science (:func:`matrixrl.config.science`: the spec without runtime settings
    such as threads, batch sizes or devices) is the Snakemake ``params`` of the
    cell's jobs: changing a setting reruns exactly the cells it affects, while
    adding a seed or a scale leaves the existing cells' specs, and so their
    results, untouched. Its digests are written into checkpoints and result files,
    so a checkpoint only ever resumes the training it belongs to.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    cell: Cell
    base: str  # digest of the base model's spec (BaseSpec): a new warm-start retrains the cell
    scale: Scale
    task: TaskConfig
    workflow: dict  # this cell's workflow settings (not every workflow's)
    policies: Policies
    prompts: PromptSettings
    train: Train  # train: with the scale's own train: over it
    eval: Evaluate

    def training(self) -> dict:
        """The science the ``train`` job computes from (no evaluation settings)."""
        return {name: value for name, value in science(self).items() if name != "eval"}

    def train_digest(self) -> str:
        """Digest of :meth:`training`: written into the cell's ``train.json``."""
        return settings_digest(self.training())

    def resume_digest(self) -> str:
        """Digest of :meth:`training` without ``train.steps``: a checkpoint written under the
        same digest may seed a resume, so a run extended to more steps continues."""
        training = self.training()
        return settings_digest({**training, "train": {k: v for k, v in training["train"].items() if k != "steps"}})

    def eval_digest(self) -> str:
        """Digest of the whole science: written into each evaluation's result file."""
        return settings_digest(science(self))


def _without_train(scale):
    """A scale without its own ``train:`` section (a cell spec carries the merged settings)."""
    return scale.model_copy(update={"train": TrainOverrides()})


def cell_spec(config: Config, cell: Cell) -> CellSpec:
    scale = config.scales[cell.scale]
    return CellSpec(
        cell=cell,
        base=base_digest(config, cell.scale),
        scale=_without_train(scale),
        task=config.tasks[cell.task],
        workflow=getattr(config.workflows, cell.workflow).model_dump(),
        policies=config.policies,
        # Only the chat style reads these: compact cells keep the defaults, so tuning them reruns nothing else.
        prompts=config.prompts if scale.prompt_style == "chat" else PromptSettings(),
        train=config.train_for(cell.scale),
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
        scale=_without_train(config.scales[scale]),  # training settings do not change the base
        tasks=dict(sorted(config.tasks.items())),
        workflows=config.workflows,
    )


def base_digest(config: Config, scale: str) -> str:
    """Digest of what ``scale``'s base model is computed from (not the scale's name: the
    warm-start does not depend on it)."""
    spec = science(base_spec(config, base_scale(config, scale)))
    return settings_digest({k: v for k, v in spec.items() if k != "scale_name"})


def base_scale(config: Config, scale: str) -> str:
    """The scale whose prepared base model ``scale`` uses: the first scale under ``scales:``
    with the same base definition (one that differs only in its ``train:`` shares it)."""
    wanted = science(_without_train(config.scales[scale]))
    return next(name for name, other in config.scales.items() if science(_without_train(other)) == wanted)


def base_scales(config: Config) -> list[str]:
    """The base models the grid's scales need, one per distinct base definition, in grid order."""
    return list(dict.fromkeys(base_scale(config, scale) for scale in config.grid.scale))
