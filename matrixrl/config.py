"""The experiments.yaml schema, overrides (``--set``, ``--only``) and one-line errors.

experiments.yaml holds the science: the grid's axes and the settings that define
what a cell computes. Runtime matters (cores, cluster, profile) never live here.
Every model forbids unknown keys, and every error names its key path.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

AXES = ("workflow", "task", "scale", "policy", "seed")
WORKFLOWS = ("single",)
POLICIES = ("shared",)


class ConfigError(Exception):
    """A user-facing configuration problem; the message is one line and says how to fix it."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Grid(Strict):
    """The axes of the experiment matrix; every combination is one cell."""

    workflow: list[str] = Field(min_length=1)
    task: list[str] = Field(min_length=1)
    scale: list[str] = Field(min_length=1)
    policy: list[str] = Field(min_length=1)
    seed: list[Annotated[int, Field(ge=0)]] = Field(min_length=1)


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

    @model_validator(mode="after")
    def _heads_divide(self):
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} must be a multiple of num_heads {self.num_heads}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads {self.num_heads} must be a multiple of num_kv_heads {self.num_kv_heads}"
            )
        return self


Scale = Annotated[Union[TinyScale], Field(discriminator="kind")]


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


TaskConfig = Annotated[Union[ArithTaskConfig], Field(discriminator="kind")]


class Train(Strict):
    """GRPO settings shared by every cell (see matrixrl.train.trainer)."""

    steps: int = Field(40, ge=1, description="optimizer updates per cell")
    eval_every: int = Field(10, ge=1, description="checkpoint interval in steps (step 0 always)")
    problems_per_step: int = Field(16, ge=1)
    group_size: int = Field(8, ge=2, description="rollouts per problem (GRPO group)")
    lr: float = Field(5e-4, gt=0)
    temperature: float = Field(1.0, gt=0)
    max_new_tokens: int = Field(8, ge=1)
    epsilon_low: float = Field(0.2, ge=0)
    epsilon_high: float = Field(0.28, ge=0)
    scale_rewards: bool = True
    max_grad_norm: float = Field(1.0, gt=0)
    threads: int = Field(1, ge=1, description="torch threads per training job")


class Evaluate(Strict):
    """How each checkpoint is scored: greedy decoding on the task's fixed eval set."""

    max_new_tokens: int = Field(8, ge=1)
    batch_size: int = Field(256, ge=1)


class Analysis(Strict):
    """Thresholds of the summary tables (design.md §2)."""

    cliff_delta: float = Field(0.10, ge=0, le=1, description="drop below peak that counts")
    cliff_noise_se: float = Field(2.0, ge=0, description="binomial SEs the drop must exceed")
    final_tail_k: int = Field(3, ge=1, description="checkpoints averaged into final_tail")


class Config(Strict):
    results_dir: str = "results"
    grid: Grid
    scales: dict[str, Scale]
    tasks: dict[str, TaskConfig]
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


# ---------------------------------------------------------------------------------------
# Loading, overrides and error messages


def _describe(model: type[BaseModel] | None, loc: tuple) -> type[BaseModel] | None:
    """The pydantic model that owns the field at ``loc`` (to list valid keys)."""
    for part in loc[:-1]:
        if model is None:
            return None
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            # Inside a dict or discriminated union: the key after it is a value, not a field.
            continue
        annotation = field.annotation
        model = _model_in(annotation)
    return model


def _model_in(annotation) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _format_validation_error(err: ValidationError, source: str) -> str:
    first = err.errors()[0]
    loc = tuple(p for p in first["loc"] if not (isinstance(p, str) and p in ("tiny", "arith")))
    path = ".".join(str(p) for p in loc) or "(top level)"
    kind = first["type"]
    if kind == "extra_forbidden":
        owner = _describe(Config, loc)
        allowed = f"; valid keys here: {', '.join(owner.model_fields)}" if owner else ""
        return f"{source}: {path}: unknown key{allowed}"
    if kind == "missing":
        return f"{source}: {path}: required key is missing; add it"
    if kind == "union_tag_invalid" or kind == "union_tag_not_found":
        return f"{source}: {path}: 'kind' must be one of {first['ctx'].get('expected_tags', '')}"
    message = first["msg"]
    if isinstance(first.get("ctx"), dict) and isinstance(first["ctx"].get("error"), ConfigError):
        return f"{source}: {first['ctx']['error']}"
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    got = first.get("input")
    shown = "" if isinstance(got, (dict, list)) else f" (got {got!r})"
    return f"{source}: {path}: {message[0].lower()}{message[1:]}{shown}"


def parse_set(assignment: str) -> tuple[list[str], Any]:
    key, sep, raw = assignment.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {assignment!r}: expected dotted.key=VALUE, e.g. --set train.steps=4")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        raise ConfigError(f"--set {assignment}: the value is not valid YAML; quote it or fix its syntax")
    return key.strip().split("."), value


def apply_set(raw: dict, assignment: str) -> None:
    path, value = parse_set(assignment)
    node = raw
    for i, part in enumerate(path[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            where = ".".join(path[: i + 1])
            raise ConfigError(f"--set {assignment}: {where} is not a mapping, so it has no key {path[i + 1]!r}")
        node = child
    node[path[-1]] = value


def parse_only(assignment: str) -> tuple[str, list[str]]:
    axis, sep, raw = assignment.partition("=")
    axis = axis.strip()
    if not sep or axis not in AXES or not raw.strip():
        raise ConfigError(
            f"--only {assignment!r}: expected AXIS=V1,V2 with AXIS one of {', '.join(AXES)}, "
            "e.g. --only seed=0,1"
        )
    return axis, [v.strip() for v in raw.split(",") if v.strip()]


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
            f"--only {assignment}: {', '.join(missing)} not in grid.{axis} "
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
        raise ConfigError(f"{source}: not valid YAML{where}: {problem}")
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping of sections (grid:, scales:, ...) at the top level")
    for assignment in sets:
        apply_set(raw, assignment)
    for assignment in only:
        apply_only(raw, assignment)
    config = validate(raw, source)
    base = path.resolve().parent
    return config.model_copy(update={"results_dir": str((base / config.results_dir).resolve())})


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
