"""The memory jobs' specs: which memory jobs a config asks for, and what each computes from.

This module never imports the grid (a scale as a memory job loads it comes in as ``ref``). Each
spec holds exactly what its job's result is computed from: docs/memcollab.md, "The jobs".
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from matrixrl import layout as L
from matrixrl.config import ANSWER_ROLES, Config, Memory, PromptSettings, Scale, TaskConfig, science
from matrixrl.settings import settings_digest


def bank_name(mode: str, consumer: str, weak: str, strong: str) -> str:
    """The memory ``mode`` shows ``consumer`` (a scale name)."""
    other = strong if consumer == weak else weak
    return {
        "own": f"own-{consumer}",
        "transfer": f"own-{other}",
        "self_contrast": f"self_contrast-{consumer}",
        "memcollab": "memcollab",
    }[mode]


def bank_mode(bank: str) -> tuple[str, str | None]:
    """A bank's distillation mode and model: ``own-x`` → (own, x); ``memcollab`` → (memcollab, None)."""
    if bank == "memcollab":
        return "memcollab", None
    mode, _, model = bank.partition("-")
    return mode, model


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @functools.cached_property
    def science(self) -> dict:
        return science(self)

    def digest(self) -> str:
        return settings_digest(self.science)


class ModelRef(BaseModel):
    """A scale as a memory job loads it: its name (a consumer's identity), definition and base digest."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    scale: Scale
    base: str  # grid.base_digest: what its base model was prepared from
    base_scale: str  # the scale whose prepared base it loads (layout.base_model_dir)

    def science_view(self) -> dict:
        return {"scale": science(self.scale), "base": self.base}


class _ModelJob(_Spec):
    """What every memory job that runs a model on a task's problems computes from."""

    task_name: str
    task: TaskConfig
    model: ModelRef  # the model the job runs
    prompts: PromptSettings
    problems: int  # the building problems: drawn from the task's training problems with ``seed``
    seed: int
    max_new_tokens: int
    batch_size: int = 16
    threads: int = 1

    @functools.cached_property
    def science(self) -> dict:
        from matrixrl.models.hf import needs_gpu

        data = {k: v for k, v in science(self).items() if k not in ("batch_size", "threads", "model")}
        # On a GPU the batch's shape picks the kernels, and so the bf16 rounding of the logits; at the
        # default it stays out, so results computed there keep their digests (as grid.eval_science).
        if needs_gpu(self.model.scale) and self.batch_size != Memory.model_fields["batch_size"].default:
            data["batch_size"] = self.batch_size
        return data | {"model": self.model.science_view()}


class CollectSpec(_ModelJob):
    """A model's trajectories on a task's memory-building problems."""

    samples: int  # 1: one trajectory per problem at ``temperature``; more: self-contrast's samples
    temperature: float

    @functools.cached_property
    def science(self) -> dict:
        # The model's identity is its definition, not its name, unless sampled outputs are keyed by the name.
        named = {"name": self.model.name} if self.temperature > 0 else {}
        return super().science | {"model": self.model.science_view() | named}


class LabelSpec(_ModelJob):
    """The labeller's (category, subcategory) of a task's building and evaluation problems."""


class DistillSpec(_ModelJob):
    """A bank's constraints, distilled by ``model`` from the trajectories its mode pairs (the
    building problems' reference answers keep answers out of the constraints)."""

    bank: str
    mode: str  # own, self_contrast or memcollab
    consumer: str  # the scale whose memory it is; memcollab: the weak scale (either reads it)
    weak: str
    strong: str
    collections: dict[str, str]  # trajectories file -> its CollectSpec digest
    entries_per_problem: int
    prefix: str  # the reply's prefill (memory.distill_prefix)


class BankSpec(_Spec):
    """A bank: its distilled constraints with their source problems' labels."""

    task_name: str
    bank: str
    distilled: str  # DistillSpec digest
    labels: str  # LabelSpec digest


class Retrieval(BaseModel):
    """How an evaluation retrieves and shows a bank's constraints."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    top_p: int
    per_problem: int
    limit: int | None
    roles: tuple[str, ...]


def retrieval_of(memory: Memory) -> Retrieval:
    return Retrieval(
        top_p=memory.top_p,
        per_problem=memory.entries_per_problem,
        limit=memory.limit,
        roles=tuple(memory.roles if memory.roles is not None else ANSWER_ROLES),
    )


@dataclass(frozen=True)
class MemoryPlan:
    """Every memory job of a config, by output path (relative to the results directory)."""

    collects: dict[str, CollectSpec]
    labels: dict[str, LabelSpec]  # by task's labels file
    distills: dict[str, DistillSpec]
    banks: dict[str, BankSpec]
    retrieval: Retrieval | None
    modes: tuple[str, ...]  # grid.memory less none


def memory_plan(
    config: Config, training: Iterable[tuple[str, str, str]] = (), *, ref: Callable[[str], ModelRef]
) -> MemoryPlan:
    """The memory jobs ``config`` asks for: the banks of ``grid.memory``'s modes for every task and
    scale, and those of ``training``'s (task, scale, mode) (cells trained with a memory, whose
    spec says which: :func:`training_needs`); None when neither asks for a memory. ``ref``: a
    scale as its jobs load it (``grid.memory_model``)."""
    modes = tuple(m for m in config.grid.memory if m != "none")
    memory = config.memory
    needs = [(task, scale, mode) for task in config.grid.task for scale in config.grid.scale for mode in modes]
    needs += list(training)
    if not needs or memory is None:
        return MemoryPlan({}, {}, {}, {}, None, ())

    collects: dict[str, CollectSpec] = {}
    labels: dict[str, LabelSpec] = {}
    distills: dict[str, DistillSpec] = {}
    banks: dict[str, BankSpec] = {}
    runtime = {"batch_size": memory.batch_size, "threads": memory.threads}

    def collection(task: str, scale: str, samples: int) -> str:
        path = L.trajectories_result(task, scale, samples)
        if path not in collects:
            contrast = samples > 1
            collects[path] = CollectSpec(
                task_name=task, task=config.tasks[task], model=ref(scale), prompts=config.prompts,
                problems=memory.problems, seed=memory.seed, samples=samples,
                temperature=memory.contrast_temperature if contrast else memory.temperature,
                max_new_tokens=memory.max_new_tokens, **runtime,
            )
        return path

    for task, scale, mode in needs:
        label_file = L.labels_result(task)
        if label_file not in labels:
            labels[label_file] = LabelSpec(
                task_name=task, task=config.tasks[task], model=ref(memory.labeller_scale),
                prompts=config.prompts, problems=memory.problems, seed=memory.seed,
                max_new_tokens=memory.label_max_new_tokens, **runtime,
            )
        bank = bank_name(mode, scale, memory.weak, memory.strong)
        path = L.distilled_result(task, bank)
        if path in distills:
            continue
        kind, model = bank_mode(bank)
        if kind == "own":
            needed = [(model, 1)]
        elif kind == "self_contrast":
            needed = [(model, memory.samples)]
        else:
            needed = [(memory.weak, 1), (memory.strong, 1)]
        files = [collection(task, m, k) for m, k in needed]
        distills[path] = DistillSpec(
            task_name=task, task=config.tasks[task], bank=bank, mode=kind, consumer=model or memory.weak,
            weak=memory.weak, strong=memory.strong,
            collections={f: collects[f].digest() for f in files},
            problems=memory.problems, seed=memory.seed,
            model=ref(memory.distiller_scale), prompts=config.prompts,
            entries_per_problem=memory.entries_per_problem, max_new_tokens=memory.distill_max_new_tokens,
            prefix=memory.distill_prefix, **runtime,
        )
        banks[L.bank_result(task, bank)] = BankSpec(
            task_name=task, bank=bank, distilled=distills[path].digest(), labels=labels[label_file].digest()
        )
    return MemoryPlan(collects, labels, distills, banks, retrieval_of(memory), modes)


class TrainMemory(_Spec):
    """A cell trained with a memory: the bank its guided roles' training prompts read, the
    labeller that labels each training problem as it is drawn, and how constraints are shown."""

    mode: str
    bank: BankSpec
    labeller: ModelRef
    label_max_new_tokens: int
    retrieval: Retrieval

    @functools.cached_property
    def science(self) -> dict:
        data = {k: v for k, v in science(self).items() if k != "labeller"}
        return data | {"labeller": self.labeller.science_view()}


def train_memory(config: Config, task: str, scale: str, *, ref: Callable[[str], ModelRef]) -> TrainMemory | None:
    """What a cell of (task, scale) trains with under ``memory.train`` (None: no memory)."""
    memory = config.memory
    if memory is None or memory.train is None:
        return None
    plan = memory_plan(config, [(task, scale, memory.train)], ref=ref)
    bank = bank_name(memory.train, scale, memory.weak, memory.strong)
    return TrainMemory(
        mode=memory.train, bank=plan.banks[L.bank_result(task, bank)],
        labeller=ref(memory.labeller_scale), label_max_new_tokens=memory.label_max_new_tokens,
        retrieval=retrieval_of(memory),
    )


def training_needs(specs: Iterable) -> list[tuple[str, str, str]]:
    """The (task, scale, mode) banks that cells trained with a memory read (CellSpec.memory)."""
    return list(dict.fromkeys((s.cell.task, s.cell.scale, s.memory.mode) for s in specs if s.memory is not None))


def memory_eval_digest(eval_digest: str, mode: str, bank: BankSpec, retrieval: Retrieval) -> str:
    """What an evaluation under a memory computes from: the plain evaluation's spec (its digest,
    or a base evaluation's), the mode, the bank and how it is retrieved and shown."""
    return settings_digest({"eval": eval_digest, "mode": mode, "bank": bank.digest(), "retrieval": science(retrieval)})
