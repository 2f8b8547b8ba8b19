"""The grid: cells, their ids, the runs that compute them, their specs and digests.

What reruns what, and why: docs/design.md §6. Files live where ``matrixrl.layout`` says;
the memory jobs' specs are ``matrixrl.memcollab.specs``'s (which never imports the grid).
"""
from __future__ import annotations

import functools
import itertools
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from matrixrl import layout as L
from matrixrl.config import (
    AXES,
    Analysis,
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
from matrixrl.config.sweeps import canonical, key_parts, value_at, with_settings
from matrixrl.memcollab.specs import (
    BankSpec,
    MemoryPlan,
    ModelRef,
    Retrieval,
    TrainMemory,
    bank_name,
    memory_eval_digest,
    memory_plan,
    train_memory,
)
from matrixrl.settings import ADDED, RUNTIME, settings_digest
from matrixrl.workflows import WORKFLOWS


@dataclass(frozen=True, order=True)
class Cell:
    """One combination of the grid's values: the five fixed axes, and the values of the
    extra axes (``grid:``'s dotted keys) that change this cell's computation."""

    workflow: str
    task: str
    scale: str
    policy: str
    seed: int
    sweep: tuple[tuple[str, str], ...] = field(default=(), metadata=RUNTIME)
    """``(dotted key, canonical JSON value)`` per extra axis whose setting the cell reads, in
    the grid's order: the values its spec is computed under (:func:`cell_spec`), the file's
    own for an axis that does not multiply the cell. Not science on its own: the swept
    settings are in the cell's spec."""
    label: str = field(default="", compare=False, metadata=RUNTIME)
    """What the id shows of ``sweep``: the values that differ from the file's own setting."""
    settings: tuple[tuple[str, str], ...] | None = field(default=None, compare=False, metadata=RUNTIME)
    """The same keys, each with the value the cell's spec has (:func:`setting_of`): under a
    ``train.loss_type`` axis, a scale whose own ``train:`` sets the loss has its cells' loss
    here, not the file's. What :meth:`sweep_values`, and so the report, shows; None: ``sweep``."""

    @property
    def id(self) -> str:
        return f"{self.workflow}-{self.task}-{self.scale}-{self.policy}-s{self.seed}{self.label}"

    def axes(self) -> dict:
        """The five fixed axes."""
        return {axis: getattr(self, axis) for axis in AXES}

    def sweep_values(self) -> dict[str, Any]:
        """The extra axes' settings as this cell computes with them, by dotted key (``settings``)."""
        return {key: json.loads(value) for key, value in (self.sweep if self.settings is None else self.settings)}


def cells(config: Config) -> list[Cell]:
    """Every combination of the grid's axes, in the order the axes list their values.

    An extra axis multiplies only the cells whose spec it changes, so each distinct
    computation is one cell (docs/sweeps.md); ``Cell.settings`` holds the value each
    cell's spec has for every axis.
    """
    grid = config.grid
    fixed = [Cell(*values) for values in itertools.product(*(getattr(grid, a) for a in AXES))]
    if not grid.sweeps:
        return fixed
    sweeps = _sweeps(config)
    found = []
    settings: dict[tuple, tuple[tuple[str, str], ...] | None] = {}  # a scale's, per sweep and the axes held
    distinct: dict[tuple, list] = {}  # _distinct's, per cell but its seed (which overrides nothing)
    for cell in fixed:
        axes = [key for key in sweeps.keys if sweeps.reads(key, cell)]
        own = _science_digest(cell_spec(config, cell))
        multiplies = {key: sweeps.affects(key, cell, own) for key in axes}
        choices = [sweeps.values[key] if multiplies[key] else (sweeps.own[key],) for key in axes]
        held = tuple(key for key in axes if not multiplies[key])
        combined = [tuple(zip(axes, combination)) for combination in itertools.product(*choices)]
        if sum(multiplies.values()) > 1:  # two axes may be one computation: one can override the other
            key = (cell.workflow, cell.task, cell.scale, cell.policy)
            if key not in distinct:
                distinct[key] = _distinct(config, cell, combined, sweeps.own, held)
            for sweep, shown in distinct[key]:
                found.append(replace(cell, sweep=sweep, label=sweeps.label(sweep), settings=shown))
            continue
        for sweep in combined:
            swept = replace(cell, sweep=sweep, label=sweeps.label(sweep))
            known = (cell.scale, sweep, held)  # what setting_of reads of the cell
            if known not in settings:
                settings[known] = _settings(config, swept, held)
            found.append(replace(swept, settings=settings[known]))
    return found


def _distinct(config: Config, cell: Cell, combined: list, own: dict[str, str], held: tuple[str, ...]) -> list[tuple[tuple, tuple | None]]:
    """The combinations of two or more axes that multiply ``cell`` that compute distinct things,
    each with the settings the report shows (None: its sweep). An axis another overrides
    (``scales.tiny-s.train.lr`` over ``train.lr``) is put back to the file's own value."""
    def digest(sweep):
        return _science_digest(cell_spec(config, replace(cell, sweep=sweep)))

    found: dict[tuple, set[str]] = {}  # each distinct sweep -> the axes put back to their own value
    for sweep in combined:
        computed, canonical, put_back = digest(sweep), list(sweep), set()
        for i, (key, value) in enumerate(sweep):
            trial = [*canonical[:i], (key, own[key]), *canonical[i + 1 :]]
            if value != own[key] and digest(tuple(trial)) == computed:
                canonical, put_back = trial, put_back | {key}
        found.setdefault(tuple(canonical), set(held)).update(put_back)
    return [(sweep, _settings(config, replace(cell, sweep=sweep), sorted(keys))) for sweep, keys in found.items()]


def setting_of(config: Config, cell: Cell, key: str) -> Any:
    """The value (JSON data) that ``cell``'s spec has for the setting at dotted ``key``
    (``"train.loss_type"``): a training setting as ``CellSpec.train`` has it, the scale's
    own ``train:`` over ``train:``."""
    swept = swept_config(config, cell.sweep)
    section = key.split(".")[0].strip()
    if section == "scales":
        _, scale, *rest = key_parts(key, swept.model_dump(mode="json"))
        if scale == cell.scale and rest[:1] == ["train"] and len(rest) > 1:
            key, section = ".".join(["train", *rest[1:]]), "train"
    if section == "train":
        swept = swept.model_copy(update={"train": swept.train_for(cell.scale)})
    return value_at(swept, key)


def _settings(config: Config, cell: Cell, keys: Sequence[str]) -> tuple[tuple[str, str], ...] | None:
    """``cell.sweep`` with each of ``keys`` (axes held at the file's own value) as the cell's spec
    has it; None where that is ``sweep`` itself."""
    if not keys:
        return None
    settings = tuple((key, canonical(setting_of(config, cell, key)) if key in keys else v) for key, v in cell.sweep)
    return None if settings == cell.sweep else settings


@dataclass(frozen=True)
class _Sweeps:
    """The grid's extra axes, as :func:`cells` expands them."""

    config: Config
    keys: tuple[str, ...]
    values: dict[str, tuple[str, ...]]  # canonical JSON texts
    own: dict[str, str]  # the file's own value of each key
    short: dict[str, str]  # what an id calls each key

    def reads(self, key: str, cell: Cell) -> bool:
        """Is ``key`` among the settings ``cell`` computes from? A workflow's, task's or scale's
        settings belong to its cells, the prompts to chat-style scales, the rest to every cell."""
        section, name, *_ = key.split(".") + [""]
        owner = {"workflows": cell.workflow, "tasks": cell.task, "scales": cell.scale}.get(section)
        if owner is not None:
            return name == owner
        if section == "prompts":
            return self.config.scales[cell.scale].prompt_style == "chat"
        return True

    def affects(self, key: str, cell: Cell, own: str) -> bool:
        """Does ``key`` change what ``cell`` computes? Its spec under some value differs from
        ``own``, its spec's digest under the file's own value (so ``--only`` narrowing the
        axis to one value still labels the cells that value changes)."""
        return any(
            _science_digest(cell_spec(self.config, replace(cell, sweep=((key, value),)))) != own
            for value in self.values[key]
            if value != self.own[key]
        )

    def label(self, sweep: tuple[tuple[str, str], ...]) -> str:
        return "".join(f"-{self.short[key]}={_id_text(value)}" for key, value in sweep if value != self.own[key])


def _science_digest(spec: CellSpec) -> str:
    return settings_digest(science(spec))


def _sweeps(config: Config) -> _Sweeps:
    keys = tuple(config.grid.sweeps)
    return _Sweeps(
        config=config,
        keys=keys,
        values={key: tuple(canonical(v) for v in values) for key, values in config.grid.sweeps.items()},
        own={key: canonical(value_at(config, key)) for key in keys},
        short=_short_names(keys),
    )


def _short_names(keys: Sequence[str]) -> dict[str, str]:
    """Each key's last part, with as many parts before it as it takes to tell it from the others."""
    names = {}
    for key in keys:
        parts = key.split(".")
        for n in range(1, len(parts) + 1):
            name = ".".join(parts[-n:])
            if not any(other != key and other.split(".")[-n:] == parts[-n:] for other in keys):
                break
        names[key] = name
    return names


def _id_text(value_json: str) -> str:
    """A value as an id shows it: short and safe in a file name (``5e-05``, ``lora``, ``true``)."""
    value = json.loads(value_json)
    text = value if isinstance(value, str) else value_json
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", text).strip("_") or "_"


def run_of(cell: Cell) -> Cell:
    """The cell whose computation ``cell`` is: a one-role workflow's isolated cell is its
    shared cell (docs/design.md §6, "No job repeats another")."""
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

    Its science (the spec without runtime settings) is its jobs' Snakemake ``params``
    and its digests are written into checkpoints and result files (docs/design.md §6).
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
    memory: TrainMemory | None = Field(None, json_schema_extra=ADDED)  # memory.train's bank in training prompts
    # The source digests of a plugin task kind's and workflow's code ({"task": ..., "workflow": ...}):
    # results computed with old plugin code are not reused with new. Empty for built-ins, and then
    # left out of the science (ADDED), so their digests stay what they were.
    plugin_code: dict[str, str] = Field(default_factory=dict, json_schema_extra=ADDED)

    @functools.cached_property
    def science(self) -> dict:
        """:func:`matrixrl.config.science` of this spec, computed once (a plan reads it per job)."""
        return science(self)

    def training(self) -> dict:
        """The science the ``train`` job computes from (no evaluation settings)."""
        return {name: value for name, value in self.science.items() if name != "eval"}

    def train_digest(self) -> str:
        """Digest of :meth:`training`: written into the cell's ``train.json``."""
        return settings_digest(self.training())

    def resume_digest(self) -> str:
        """Digest of :meth:`training` without ``train.steps``: a checkpoint written under the
        same digest may seed a resume, so a run extended to more steps continues."""
        training = self.training()
        return settings_digest({**training, "train": {k: v for k, v in training["train"].items() if k != "steps"}})

    def eval_digest(self) -> str:
        """Digest of the whole science, its ``eval`` as :func:`eval_science`: written into each
        evaluation's result file."""
        return settings_digest({**self.science, "eval": eval_science(self)})


def eval_science(spec: CellSpec) -> dict:
    """The evaluation settings ``spec``'s evaluations compute from: ``eval``'s science, and on a
    GPU scale a non-default ``batch_size`` too (docs/design.md §3, keyed samples).
    """
    from matrixrl.models.hf import needs_gpu

    own = {name: value for name, value in spec.science["eval"].items() if name != "base_samples"}  # the base's alone
    if needs_gpu(spec.scale) and spec.eval.batch_size != Evaluate.model_fields["batch_size"].default:
        return {**own, "batch_size": spec.eval.batch_size}
    return own


def base_eval_science(spec: CellSpec) -> dict:
    """What the evaluation of a cell's step 0, its base model, is computed from: not the
    cell's seed, policy mode or training settings (docs/design.md, "The base model's evaluation").
    """
    own = {**spec.science, "eval": {**eval_science(spec), "samples": spec.eval.base_samples_in_effect}}
    names = {"workflow_name": spec.cell.workflow, "task_name": spec.cell.task}
    keys = ("base", "scale", "task", "workflow", "policies", "prompts", "eval", "plugin_code")
    return {**names, **{key: own[key] for key in keys if key in own}}  # plugin_code: a plugin's cells only


def base_eval_digest(spec: CellSpec) -> str:
    return settings_digest(base_eval_science(spec))


def base_eval_key(config: Config, spec: CellSpec, base: str | None = None) -> tuple[str, str]:
    """``(base scale, name)`` of the shared evaluation of ``spec``'s base model (layout.base_eval_result);
    ``base``: the cell's :func:`base_scale`, where the caller has it."""
    name = f"{spec.cell.workflow}-{spec.cell.task}-{base_eval_digest(spec)[:10]}"
    return base or base_scale(config, spec.cell.scale), name


def base_eval_spec(spec: CellSpec) -> CellSpec:
    """The spec a base evaluation runs under: ``spec`` as its seed-0 shared cell, sampled ``base_samples`` times."""
    cell = Cell(spec.cell.workflow, spec.cell.task, spec.cell.scale, "shared", 0)
    evaluate = spec.eval.model_copy(update={"samples": spec.eval.base_samples_in_effect, "base_samples": None})
    # A new spec, not model_copy: that would carry over the cached science of the original.
    return CellSpec(cell=cell, eval=evaluate, **{name: getattr(spec, name) for name in CellSpec.model_fields if name not in ("cell", "eval")})


def _without_train(scale):
    """A scale without its own ``train:`` section (a cell spec carries the merged settings)."""
    return scale.model_copy(update={"train": TrainOverrides()})


def cell_spec(config: Config, cell: Cell, base: str | None = None) -> CellSpec:
    """What ``cell`` computes from: ``config`` with the cell's extra-axis values set, over the
    file's own base model (``base``: its digest, where the caller has it).
    """
    swept = swept_config(config, cell.sweep)
    scale = swept.scales[cell.scale]
    return CellSpec(
        cell=cell,
        base=base_digest(config, cell.scale) if base is None else base,
        scale=_without_train(scale),
        task=swept.tasks[cell.task],
        workflow=getattr(swept.workflows, cell.workflow).model_dump(),
        policies=swept.policies,
        # Only the chat style reads these: compact cells keep the defaults, so tuning them reruns nothing else.
        prompts=swept.prompts if scale.prompt_style == "chat" else PromptSettings(),
        train=swept.train_for(cell.scale),
        eval=swept.eval,
        memory=train_memory(swept, cell.task, cell.scale, ref=functools.partial(memory_model, swept)),
        plugin_code=plugin_code(kind=swept.tasks[cell.task].kind, workflow=cell.workflow),
    )


def plugin_code(kind: str | None = None, workflow: str | None = None) -> dict[str, str]:
    """The source digests of task kind ``kind`` and ``workflow`` where a plugin registered them."""
    from matrixrl.tasks import task_code_digest
    from matrixrl.workflows import workflow_code_digest

    found = {"task": task_code_digest(kind) if kind else None, "workflow": workflow_code_digest(workflow) if workflow else None}
    return {part: digest for part, digest in found.items() if digest is not None}


def memory_model(config: Config, scale: str) -> ModelRef:
    """``scale`` as a memory job loads it: its definition, its base model's digest and folder."""
    return ModelRef(
        name=scale, scale=_without_train(config.scales[scale]), base=base_digest(config, scale),
        base_scale=base_scale(config, scale),
    )


def plan_memory(config: Config, training: Iterable[tuple[str, str, str]] = ()) -> MemoryPlan:
    """:func:`matrixrl.memcollab.specs.memory_plan` of ``config``, its models as the grid digests them
    (:func:`memory_model`); ``training``: the banks cells trained with a memory read
    (``memcollab.specs.training_needs``)."""
    return memory_plan(config, training, ref=functools.partial(memory_model, config))


class MemoryEvalSpec(BaseModel):
    """A cell's evaluation under a memory mode: the cell's spec, the bank it reads, how it retrieves."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cell: CellSpec
    mode: str
    bank: BankSpec
    retrieval: Retrieval

    def digest(self) -> str:
        """A checkpoint's evaluation under this memory."""
        return memory_eval_digest(self.cell.eval_digest(), self.mode, self.bank, self.retrieval)

    def base_digest(self) -> str:
        """The base model's (step 0), shared by every cell of the base evaluation (:func:`base_eval_science`)."""
        return memory_eval_digest(base_eval_digest(self.cell), self.mode, self.bank, self.retrieval)


def memory_evals(config: Config, specs: dict[str, CellSpec], plan: MemoryPlan) -> dict[tuple[str, str], MemoryEvalSpec]:
    """Each run's evaluation spec under each memory mode, by (cell id, mode), in grid order."""
    found = {}
    memory = config.memory
    for cell_id, spec in specs.items():
        for mode in plan.modes:
            bank = bank_name(mode, spec.cell.scale, memory.weak, memory.strong)
            found[(cell_id, mode)] = MemoryEvalSpec(
                cell=spec, mode=mode, bank=plan.banks[L.bank_result(spec.cell.task, bank)], retrieval=plan.retrieval
            )
    return found


def spec_digests(config: Config, cells: Sequence[Cell]) -> dict[str, tuple[str, str]]:
    """Each cell's ``(train_digest(), eval_digest())`` of its :func:`cell_spec`, by id,
    computing the science once per part that cells differing only in policy or seed share.
    """
    bases: dict[str, str] = {}
    shared: dict[tuple, dict] = {}
    digests = {}
    for cell in cells:
        key = (cell.workflow, cell.task, cell.scale, cell.sweep)
        if key not in shared:
            if cell.scale not in bases:
                bases[cell.scale] = base_digest(config, cell.scale)
            spec = cell_spec(config, cell, base=bases[cell.scale])
            own = {name: value for name, value in spec.science.items() if name != "cell"}
            shared[key] = {**own, "eval": eval_science(spec)}
        whole = {**shared[key], "cell": science(cell)}
        training = {name: value for name, value in whole.items() if name != "eval"}
        digests[cell.id] = (settings_digest(training), settings_digest(whole))
    return digests


def swept_config(config: Config, sweep: tuple[tuple[str, str], ...]) -> Config:
    """``config`` with the extra-axis values ``sweep`` set (validated once per distinct ``sweep``)."""
    if not sweep:
        return config
    key = (id(config), sweep)
    cached = _SWEPT.get(key)
    if cached is None or cached[0] is not config:  # held here, so its id is not reused meanwhile
        if len(_SWEPT) > 4096:
            _SWEPT.clear()
        cached = _SWEPT[key] = (config, with_settings(config, [(k, json.loads(v)) for k, v in sweep]))
    return cached[1]


_SWEPT: dict[tuple[int, tuple], tuple[Config, Config]] = {}


class BaseSpec(BaseModel):
    """What a scale's base model is computed from: its definition and every task and workflow
    defined (not just the grid's), so ``--only`` never re-prepares a base model.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    scale_name: str
    scale: Scale
    tasks: dict[str, TaskConfig]
    workflows: Workflows
    # The warm-start draws every task's problems and every workflow's role formats: the source
    # digests of those a plugin registered (name → digest; none: left out of the science).
    plugin_code: dict[str, str] = Field(default_factory=dict, json_schema_extra=ADDED)

    def digest(self) -> str:
        """Digest of the whole science: written into the base model's ``base.json``."""
        return settings_digest(science(self))


def base_spec(config: Config, scale: str) -> BaseSpec:
    return BaseSpec(
        scale_name=scale,
        scale=_without_train(config.scales[scale]),  # training settings do not change the base
        tasks=dict(sorted(config.tasks.items())),
        workflows=config.workflows,
        plugin_code=_base_plugin_code(config),
    )


def _base_plugin_code(config: Config) -> dict[str, str]:
    found = {f"task {name}": plugin_code(kind=task.kind).get("task") for name, task in config.tasks.items()}
    found |= {f"workflow {name}": plugin_code(workflow=name).get("workflow") for name in WORKFLOWS}
    return {part: digest for part, digest in sorted(found.items()) if digest is not None}


def base_digest(config: Config, scale: str) -> str:
    """Digest of what ``scale``'s base model is computed from (not the scale's name: the
    warm-start does not depend on it). Computed once per config and scale: a validated config
    never changes, and a plan of thousands of cells asks for it per cell."""
    key = (id(config), scale)
    held = _BASE_DIGESTS.get(key)
    if held is None or held[0] is not config:  # the config is held here, so its id is not reused meanwhile
        if len(_BASE_DIGESTS) > 256:
            _BASE_DIGESTS.clear()
        spec = science(base_spec(config, base_scale(config, scale)))
        held = _BASE_DIGESTS[key] = (config, settings_digest({k: v for k, v in spec.items() if k != "scale_name"}))
    return held[1]


_BASE_DIGESTS: dict[tuple[int, str], tuple[Config, str]] = {}


def base_scale(config: Config, scale: str) -> str:
    """The scale whose prepared base model ``scale`` uses: the first scale under ``scales:``
    with the same base definition (one that differs only in its ``train:`` shares it)."""
    wanted = science(_without_train(config.scales[scale]))
    return next(name for name, other in config.scales.items() if science(_without_train(other)) == wanted)


def base_scales(config: Config) -> list[str]:
    """The base models the grid's scales need, one per distinct base definition, in grid order."""
    return list(dict.fromkeys(base_scale(config, scale) for scale in config.grid.scale))


class RetainSpec(BaseModel):
    """What a cell's retention (``retain``) reads besides its evaluations: the rule, the
    thresholds that place a cliff's onset, and the digest of the checkpoints' training."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cell: str
    keep: str  # train.keep_checkpoints
    analysis: Analysis
    resume_digest: str


class AnalyseSpec(BaseModel):
    """What the summary (``analyse``) is computed from: the grid's runs (``cell`` and its
    axes), the thresholds, each run's current evaluation digest, and ``digest``, the whole
    of it with the result files read (matrixrl.dag.analyse_digest), recorded in the summary."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cells: list[dict]
    analysis: Analysis
    eval_digests: dict[str, str]
    digest: str
