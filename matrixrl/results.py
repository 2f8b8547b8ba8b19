"""ResultModel files: what each job writes, read back with clear errors (``ResultFileError``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from matrixrl import atomic
from matrixrl import layout as L
from matrixrl.errors import ResultFileError

INT64_MAX = 2**63 - 1
"""The largest integer SQLite stores (the store holds every count and step)."""

Count = Annotated[int, Field(ge=0, le=INT64_MAX)]
"""A step, a count, a size: at least 0, and within SQLite's integers."""
Positive = Annotated[int, Field(ge=1, le=INT64_MAX)]
"""A count that is at least 1 (problems evaluated, samples per problem, a group's size)."""
Fraction = Annotated[float, Field(ge=0, le=1)]
"""An accuracy, a pass@j, a fraction: within [0, 1]."""
NonNegative = Annotated[float, Field(ge=0)]
"""Seconds, a length, a norm, a standard deviation or error."""


_NAMED = "result_field"
"""The error type of a model validator's error whose message names its field itself."""


class ResultModel(BaseModel):
    # allow_inf_nan: JSON has no NaN or Infinity; matrixrl writes a non-finite float as null,
    # so one in a file was put there by hand (and a NaN cannot be stored: SQLite reads it as NULL).
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Cost(ResultModel):
    """What the job that wrote a result cost (matrixrl.jobs.cost): plan's estimates and
    ``report --table cost`` read it. Written near the top of its file, where ``plan``
    reads a result's digests without parsing the rest."""

    seconds: NonNegative  # the job process's wall time, loading included
    scale: str  # the scale (model) it ran
    device: str  # "cpu", or the name of the GPU it ran on
    peak_rss_bytes: Count  # the process's peak resident memory (its server's preloaded modules included)
    peak_gpu_bytes: Count | None = None  # torch.cuda.max_memory_allocated, on a GPU
    tokens: Count = 0  # tokens generated (every role's completions)
    steps: Count | None = None  # a training: the steps this job ran (a resumed one ran the last of them)


class BaseResult(ResultModel):
    scale: str
    params: Count
    warmstart_loss: float | None  # None for a pretrained (hf) scale: it is not warm-started
    seconds: NonNegative
    model: str | None = None  # an hf scale's folder or hub id
    spec_digest: str | None = None  # BaseSpec.digest() of the spec it was prepared under
    cost: Cost | None = None  # None in files written before costs were recorded


class RoleMetric(ResultModel):
    """A role's own performance (see matrixrl.train.metrics); ``step`` only in training."""

    step: Count | None = None
    role: str
    metric: str
    value: float


class EvalResult(ResultModel):
    """One checkpoint's evaluation (see matrixrl.jobs.evaluate)."""

    cell: str
    step: Count
    accuracy: Fraction  # mean pass@1 over problems and samples
    n: Positive  # problems
    n_correct: Count  # correct completions, out of n * samples
    seconds: NonNegative
    cost: Cost | None = None  # None for a copy of the base model's evaluation, and in files from before costs
    roles: list[RoleMetric] = []
    samples: Positive = 1  # completions per problem
    se: NonNegative | None = None  # std of per-problem accuracies / sqrt(n); None in files written before it
    pass_at: dict[str, Fraction] = {}  # unbiased pass@j, j = "1", "2", "4", ... up to samples
    spec_digest: str | None = None  # CellSpec.eval_digest() of the spec it was computed under
    base_eval: str | None = None  # a step 0 copied from the base model's evaluation: its spec_digest
    response_tokens: NonNegative | None = None  # mean completion tokens per episode, all turns; None before it was recorded

    @model_validator(mode="after")
    def _correct_within_completions(self):
        if self.n_correct > self.n * self.samples:
            raise PydanticCustomError(
                _NAMED, "n_correct: {n_correct}, more than n * samples = {completions}",
                {"n_correct": self.n_correct, "completions": self.n * self.samples},
            )
        return self


class Retrieval(ResultModel):
    """What one evaluation problem was shown under a memory (see matrixrl.memcollab.retrieval)."""

    problem_id: str
    label: str  # the query's "category / subcategory"
    entries: list[Count]  # indices into the bank's entries, in the order shown


class MemoryEvalResult(EvalResult):
    """One checkpoint's evaluation with a memory's guidance in the guided roles' prompts."""

    memory: str  # the mode (own, transfer, self_contrast, memcollab)
    bank: str  # the memory it read (its name: own-SCALE, self_contrast-SCALE, memcollab)
    entries_mean: NonNegative  # entries shown per evaluation problem, mean
    retrievals: list[Retrieval] = []


class TrajectoriesResult(ResultModel):
    """One model's trajectories on a task's memory-building problems (collect)."""

    task: str
    scale: str
    samples: Positive  # per problem: 1 greedy (or at memory.temperature), more sampled for self-contrast
    cost: Cost | None = None
    trajectories: list[dict]  # matrixrl.memcollab.Trajectory.to_dict()
    accuracy: Fraction
    seconds: NonNegative
    spec_digest: str | None = None


class LabelsResult(ResultModel):
    """(category, subcategory) labels of a task's memory-building and evaluation problems (label)."""

    task: str
    labeller: str
    cost: Cost | None = None
    labels: dict[str, dict]  # problem id -> matrixrl.memcollab.Label.to_dict()
    replies: dict[str, str]  # problem id -> the labeller's reply, as read
    seconds: NonNegative
    spec_digest: str | None = None


class DistillPrompt(ResultModel):
    """One distiller call: its prompt, its reply and what was read from it."""

    problem_id: str
    digest: str  # matrixrl.memcollab.prompt_digest of (system, user, prefix)
    system: str
    user: str
    reply: str  # the prefilled prefix and what the distiller wrote after it
    kept: Count
    dropped: dict[str, Count] = {}


class DistilledResult(ResultModel):
    """A memory's constraints, distilled from its pairs, before labelling (distill)."""

    task: str
    memory: str  # own-SCALE, self_contrast-SCALE, memcollab
    mode: str  # own, self_contrast, memcollab (transfer reads another model's own)
    distiller: str  # the scale that distilled
    cost: Cost | None = None
    pairs: Count
    entries: list[dict]  # {text, problem_id, question, models, distiller}: Entry less label and mode
    prompts: list[DistillPrompt]
    dropped: dict[str, Count] = {}  # candidate lines dropped, by parse_entries' reason
    seconds: NonNegative
    spec_digest: str | None = None


class BankResult(ResultModel):
    """A memory ready for retrieval: its entries with their source problems' labels (bank)."""

    task: str
    memory: str
    mode: str
    entries: list[dict]  # matrixrl.memcollab.Entry.to_dict()
    spec_digest: str | None = None


class StepMetrics(ResultModel):
    step: Count
    reward_mean: float
    reward_std: NonNegative
    loss: float
    entropy: float
    response_length: NonNegative
    grad_norm: NonNegative
    clip_fraction: Fraction
    group_size: Positive
    seconds: NonNegative
    completion_tokens: Count = 0  # absent from files written before it was recorded


DIAGNOSTIC_KINDS = (
    "agent_norm",
    "agent_tokens",
    "role_norm",
    "role_tokens",
    "role_share",
    "agent_cosine",
    "role_cosine",
    "amplification",
    "role_total_cosine",
)
"""The kinds of :class:`DiagnosticRow` (matrixrl.train.diagnostics computes them)."""


class DiagnosticRow(ResultModel):
    """One gradient diagnostic of one update (see matrixrl.train.diagnostics)."""

    step: Count
    kind: str
    role: str | None
    agent: str | None
    other: str | None
    value: float


class TrainResult(ResultModel):
    cell: str
    axes: dict[str, str | int]  # the five axes of its cell (matrixrl.store checks them: config is no import here)
    steps: Count
    spec_digest: str | None = None  # CellSpec.train_digest() of the spec it was trained under
    cost: Cost | None = None  # None in files written before costs were recorded
    metrics: list[StepMetrics]
    diagnostics: list[DiagnosticRow] = []  # absent from files written before diagnostics existed
    roles: list[RoleMetric] = []


R = TypeVar("R", bound=ResultModel)


def write_result(path: Path, result: ResultModel) -> None:
    """Write atomically: readers never see a half-written file."""
    atomic.write_text(path, result.model_dump_json(indent=1))


def read_result(path: Path, kind: type[R]) -> R:
    """The result in ``path``; ResultFileError naming the file and the fix if it is missing,
    unreadable, not a ``kind`` or another result than its path names (:func:`path_mismatch`)."""
    fix = "delete it and run `matrixrl run` to recompute it"
    try:
        result = kind.model_validate(json.loads(path.read_text()))
    except FileNotFoundError:
        raise ResultFileError(f"{path}: result file is missing; run `matrixrl run` to compute it")
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ResultFileError(f"{path}: corrupt result file (not valid JSON); {fix}")
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(map(str, error["loc"]))
        problem = error["msg"] if error["type"] == _NAMED and not where else f"{where or 'top level'}: {error['msg']}"
        raise ResultFileError(f"{path}: corrupt result file ({problem}); {fix}")
    mismatch = path_mismatch(path, result)
    if mismatch is not None:
        raise ResultFileError(f"{path}: corrupt result file ({mismatch}); {fix}")
    return result


def path_mismatch(path: Path, result: ResultModel) -> str | None:
    """What ``result`` names otherwise than its file's place in the results folder does
    (``"step": 7`` in ``cells/CELL/eval/step_1.json``), in words; None if nothing.

    The store keys a result by what it holds, so one that disagrees with its path (matrixrl.layout)
    would be stored as another result. A file elsewhere is not checked."""
    where = L.result_file(path)
    if where is None:
        return None
    said: dict[str, str] = {}  # field -> the value its path says
    if isinstance(result, EvalResult):
        if isinstance(result, MemoryEvalResult) and where.kind == "memory_eval":
            said = {"cell": where.cell, "memory": where.mode, "step": where.step}
        elif isinstance(result, MemoryEvalResult) and where.kind == "base_memory_eval":
            said = {"bank": where.bank}
        elif where.kind == "eval":
            said = {"cell": where.cell, "step": where.step}
        if where.kind in ("base_eval", "base_memory_eval"):
            if result.step != 0:
                return f"step: {result.step}, but a base model's evaluation is step 0"
    elif isinstance(result, TrajectoriesResult) and where.kind == "trajectories":
        said = {"task": where.task, "scale and samples": where.name}
    elif isinstance(result, LabelsResult) and where.kind == "labels":
        said = {"task": where.task}
    elif isinstance(result, (DistilledResult, BankResult)) and where.kind in ("distilled", "bank"):
        said = {"task": where.task, "memory": where.name}
    elif "cell" in type(result).model_fields and where.kind in ("train", "retained"):
        said = {"cell": where.cell}
    for field, text in said.items():
        held = f"{result.scale}-k{result.samples}" if field == "scale and samples" else getattr(result, field)
        if str(held) != text:
            shown = text if field == "step" and text.isdigit() else json.dumps(text)
            return f"{field}: {json.dumps(held)}, but its path says {shown}"
    return None
