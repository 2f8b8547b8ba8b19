"""ResultModel files: what each job writes, read back with clear errors.

Jobs never touch the store; each writes its own small JSON file atomically, and
the ingest step reads them. A file that is unreadable or has the wrong shape
raises ``ResultFileError`` naming the file and the fix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from matrixrl import atomic
from matrixrl.errors import ResultFileError


class ResultModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BaseResult(ResultModel):
    scale: str
    params: int
    warmstart_loss: float | None  # None for a pretrained (hf) scale: it is not warm-started
    seconds: float
    model: str | None = None  # an hf scale's folder or hub id
    spec_digest: str | None = None  # BaseSpec.digest() of the spec it was prepared under


class RoleMetric(ResultModel):
    """A role's own performance (see matrixrl.train.metrics); ``step`` only in training."""

    step: int | None = None
    role: str
    metric: str
    value: float


class EvalResult(ResultModel):
    """One checkpoint's evaluation (see matrixrl.jobs.evaluate)."""

    cell: str
    step: int
    accuracy: float  # mean pass@1 over problems and samples
    n: int  # problems
    n_correct: int  # correct completions, out of n * samples
    seconds: float
    roles: list[RoleMetric] = []
    samples: int = 1  # completions per problem
    se: float | None = None  # std of per-problem accuracies / sqrt(n); None in files written before it
    pass_at: dict[str, float] = {}  # unbiased pass@j, j = "1", "2", "4", ... up to samples
    spec_digest: str | None = None  # CellSpec.eval_digest() of the spec it was computed under
    base_eval: str | None = None  # a step 0 copied from the base model's evaluation: its spec_digest
    response_tokens: float | None = None  # mean completion tokens per episode, all turns; None before it was recorded


class Retrieval(ResultModel):
    """What one evaluation problem was shown under a memory (see matrixrl.memory.retrieval)."""

    problem_id: str
    label: str  # the query's "category / subcategory"
    entries: list[int]  # indices into the bank's entries, in the order shown


class MemoryEvalResult(EvalResult):
    """One checkpoint's evaluation with a memory's guidance in the guided roles' prompts."""

    memory: str  # the mode (own, transfer, self_contrast, memcollab)
    bank: str  # the memory it read (its name: own-SCALE, self_contrast-SCALE, memcollab)
    entries_mean: float  # entries shown per evaluation problem, mean
    retrievals: list[Retrieval] = []


class TrajectoriesResult(ResultModel):
    """One model's trajectories on a task's memory-building problems (collect)."""

    task: str
    scale: str
    samples: int  # per problem: 1 greedy (or at memory.temperature), more sampled for self-contrast
    trajectories: list[dict]  # matrixrl.memory.Trajectory.to_dict()
    accuracy: float
    seconds: float
    spec_digest: str | None = None


class LabelsResult(ResultModel):
    """(category, subcategory) labels of a task's memory-building and evaluation problems (label)."""

    task: str
    labeller: str
    labels: dict[str, dict]  # problem id -> matrixrl.memory.Label.to_dict()
    replies: dict[str, str]  # problem id -> the labeller's reply, as read
    seconds: float
    spec_digest: str | None = None


class DistillPrompt(ResultModel):
    """One distiller call: its prompt, its reply and what was read from it."""

    problem_id: str
    digest: str  # matrixrl.memory.prompt_digest of (system, user, prefix)
    system: str
    user: str
    reply: str  # the prefilled prefix and what the distiller wrote after it
    kept: int
    dropped: dict[str, int] = {}


class DistilledResult(ResultModel):
    """A memory's constraints, distilled from its pairs, before labelling (distill)."""

    task: str
    memory: str  # own-SCALE, self_contrast-SCALE, memcollab
    mode: str  # own, self_contrast, memcollab (transfer reads another model's own)
    distiller: str  # the scale that distilled
    pairs: int
    entries: list[dict]  # {text, problem_id, question, models, distiller}: Entry less label and mode
    prompts: list[DistillPrompt]
    dropped: dict[str, int] = {}  # candidate lines dropped, by parse_entries' reason
    seconds: float
    spec_digest: str | None = None


class BankResult(ResultModel):
    """A memory ready for retrieval: its entries with their source problems' labels (bank)."""

    task: str
    memory: str
    mode: str
    entries: list[dict]  # matrixrl.memory.Entry.to_dict()
    spec_digest: str | None = None


class StepMetrics(ResultModel):
    step: int
    reward_mean: float
    reward_std: float
    loss: float
    entropy: float
    response_length: float
    grad_norm: float
    clip_fraction: float
    group_size: int
    seconds: float
    completion_tokens: int = 0  # absent from files written before it was recorded


class DiagnosticRow(ResultModel):
    """One gradient diagnostic of one update (see matrixrl.train.diagnostics)."""

    step: int
    kind: str
    role: str | None
    agent: str | None
    other: str | None
    value: float


class TrainResult(ResultModel):
    cell: str
    axes: dict[str, str | int]
    steps: int
    spec_digest: str | None = None  # CellSpec.train_digest() of the spec it was trained under
    metrics: list[StepMetrics]
    diagnostics: list[DiagnosticRow] = []  # absent from files written before diagnostics existed
    roles: list[RoleMetric] = []


R = TypeVar("R", bound=ResultModel)


def write_result(path: Path, result: ResultModel) -> None:
    """Write atomically: readers never see a half-written file."""
    atomic.write_text(path, result.model_dump_json(indent=1))


def read_result(path: Path, kind: type[R]) -> R:
    fix = "delete it and run `matrixrl run` to recompute it"
    try:
        return kind.model_validate(json.loads(path.read_text()))
    except FileNotFoundError:
        raise ResultFileError(f"{path}: result file is missing; run `matrixrl run` to compute it")
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ResultFileError(f"{path}: corrupt result file (not valid JSON); {fix}")
    except ValidationError as exc:
        where = ".".join(map(str, exc.errors()[0]["loc"])) or "top level"
        raise ResultFileError(f"{path}: corrupt result file ({where}: {exc.errors()[0]['msg']}); {fix}")
