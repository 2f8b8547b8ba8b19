"""The memory jobs (collect, label, distill, bank) and a memory's prompt guides (Guide, TrainingGuide).

docs/memcollab.md, "The jobs".
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from matrixrl.errors import UserError
from matrixrl.jobs.cost import Meter
from matrixrl.memcollab import (
    Entry,
    Label,
    MemoryBank,
    Trajectory,
    completed,
    distiller_messages,
    guidance_block,
    labeller_messages,
    pairs_for,
    parse_entries,
    parse_label,
    prompt_digest,
    retrieve,
)
from matrixrl.memcollab.specs import BankSpec, CollectSpec, DistillSpec, LabelSpec, ModelRef, Retrieval, TrainMemory
from matrixrl.models.devices import claimed_gpu
from matrixrl.results import (
    BankResult,
    DistilledResult,
    DistillPrompt,
    LabelsResult,
    Retrieval as RetrievalRow,
    TrajectoriesResult,
    read_result,
    write_result,
)
from matrixrl.settings import settings_digest
from matrixrl.tasks.base import Problem, checked_scores

_BUILDING_KEY = 0x3E3C  # the building problems' stream, apart from any training draw


def building_problems(task, n: int, seed: int, task_name: str) -> list[Problem]:
    """``n`` distinct training problems of ``task`` (never evaluation ones), drawn with ``seed``."""
    rng = np.random.default_rng([seed, _BUILDING_KEY])
    found: dict[str, Problem] = {}
    for _ in range(50):
        for problem in task.train_problems(rng, n):
            found.setdefault(problem.id, problem)
            if len(found) == n:
                return list(found.values())
    raise UserError(
        f"memory.problems: task {task_name!r} gave only {len(found)} distinct training problems in 50 draws of "
        f"{n}; lower memory.problems"
    )


@dataclass
class _Model:
    tokenizer: object
    style: object
    generate_with: object  # (max_new_tokens, temperature, seed) -> generate
    tokens: int = 0  # generated so far: the job's cost

    def replies(self, prompts: list[str], max_new_tokens: int, temperature: float = 0.0, seed: int | None = None):
        generate = self.generate_with(max_new_tokens, temperature, seed)
        completions = generate("generator", prompts)
        self.tokens += sum(len(c.completion_ids) for c in completions)
        return completions


def _load(ref: ModelRef, base_dir: Path, family: str, prompts, batch_size: int, threads: int) -> _Model:
    import torch

    from matrixrl.config import Policies
    from matrixrl.models.hf import model_source
    from matrixrl.models.policies import build_policy
    from matrixrl.train.rollout import make_generate
    from matrixrl.workflows.styles import build_style

    torch.set_num_threads(threads)
    source = model_source(ref.name, ref.scale, base_dir)
    tokenizer = source.load_tokenizer()
    model = source.load_model(frozen=stored_in_compute_dtype(source))
    policy = build_policy("shared", model, ("generator",), Policies())
    style = build_style("chat", family, tokenizer, prompts)

    def generate_with(max_new_tokens: int, temperature: float, seed: int | None):
        sampled = temperature > 0
        return make_generate(
            policy, tokenizer, max_new_tokens=max_new_tokens, temperature=temperature if sampled else 1.0,
            sample=sampled, batch_size=batch_size, seed=seed if sampled else None,
        )

    return _Model(tokenizer, style, generate_with)


def stored_in_compute_dtype(source) -> bool:
    """Whether a memory job's model (or a training's labeller) is stored in its compute dtype:
    on a GPU yes, on CPU no (docs/memcollab.md, "The jobs": the models' dtype)."""
    return source.device.startswith("cuda")


def _on_its_gpu(job):
    """``job`` (collect, label, distill) holding, until it ends, a GPU it claims for its model's
    scale when that needs one: what ``_load`` loads lands there, not on the first GPU, beside
    whichever training claimed it."""

    @functools.wraps(job)
    def run(spec, *args, log=print, **kwargs):
        with claimed_gpu(spec.model.scale, log=log):
            return job(spec, *args, log=log, **kwargs)

    return run


def _task(spec):
    from matrixrl.tasks import build_task

    return build_task(spec.task_name, spec.task)


def collect_seed(seed: int, scale: str) -> int:
    """The sampling key of ``scale``'s trajectories: by name, so two scales of one model differ."""
    return int(np.random.SeedSequence([seed, int(settings_digest(scale), 16), 0xC011]).generate_state(1)[0])


@_on_its_gpu
def collect(spec: CollectSpec, base_dir: Path, output: Path, log=print) -> TrajectoriesResult:
    meter = Meter(spec.model.name)
    began = meter.began
    task = _task(spec)
    problems = building_problems(task, spec.problems, spec.seed, spec.task_name)
    model = _load(spec.model, base_dir, task.family, spec.prompts, spec.batch_size, spec.threads)
    k = spec.samples
    batch = [p for p in problems for _ in range(k)]
    completions = model.replies(
        [model.style.generator(p) for p in batch], spec.max_new_tokens, spec.temperature,
        collect_seed(spec.seed, spec.model.name),
    )
    answers = [model.style.answer(c.text) for c in completions]
    scores = checked_scores(task, batch, answers)
    trajectories = [
        Trajectory(p.id, p.question, spec.model.name, c.text, a, s == 1.0, len(c.completion_ids), i % k)
        for i, (p, c, a, s) in enumerate(zip(batch, completions, answers, scores))
    ]
    result = TrajectoriesResult(
        task=spec.task_name, scale=spec.model.name, samples=k, trajectories=[t.to_dict() for t in trajectories],
        accuracy=float(np.mean(scores)), seconds=time.perf_counter() - began, spec_digest=spec.digest(),
        cost=meter.cost(tokens=model.tokens),
    )
    write_result(output, result)
    log(
        f"{spec.model.name} on {spec.task_name}: {len(problems)} building problems x {k}, "
        f"accuracy {result.accuracy:.3f}, {result.seconds:.1f} s"
    )
    return result


@_on_its_gpu
def label(spec: LabelSpec, base_dir: Path, output: Path, log=print) -> LabelsResult:
    meter = Meter(spec.model.name)
    began = meter.began
    task = _task(spec)
    problems = building_problems(task, spec.problems, spec.seed, spec.task_name) + task.eval_problems()
    problems = list({p.id: p for p in problems}.values())
    model = _load(spec.model, base_dir, task.family, spec.prompts, spec.batch_size, spec.threads)
    replies = _label_replies(model, problems, task.family, spec.max_new_tokens)
    labels = {p.id: parse_label(reply, task.family) for p, reply in zip(problems, replies)}
    result = LabelsResult(
        task=spec.task_name, labeller=spec.model.name, labels={pid: lab.to_dict() for pid, lab in labels.items()},
        replies={p.id: reply for p, reply in zip(problems, replies)}, seconds=time.perf_counter() - began,
        spec_digest=spec.digest(), cost=meter.cost(tokens=model.tokens),
    )
    write_result(output, result)
    distinct = len({str(lab) for lab in labels.values()})
    log(f"{spec.task_name}: {len(problems)} problems labelled by {spec.model.name}, {distinct} distinct labels")
    return result


def _label_replies(model: _Model, problems: list[Problem], family: str, max_new_tokens: int) -> list[str]:
    """The labeller's greedy reply for each problem (``label``, and training with a memory)."""
    prompts = [model.style.render(*labeller_messages(p.question, family)) for p in problems]
    return [c.text for c in model.replies(prompts, max_new_tokens)]


@_on_its_gpu
def distill(spec: DistillSpec, base_dir: Path, collections: list[Path], output: Path, log=print) -> DistilledResult:
    meter = Meter(spec.model.name)
    began = meter.began
    task = _task(spec)
    answers = {p.id: p for p in building_problems(task, spec.problems, spec.seed, spec.task_name)}
    trajectories = [
        Trajectory.from_dict(t) for path in collections for t in read_result(path, TrajectoriesResult).trajectories
    ]
    pairs = pairs_for(spec.mode, spec.consumer, spec.weak, spec.strong, trajectories)
    model = _load(spec.model, base_dir, task.family, spec.prompts, spec.batch_size, spec.threads)
    messages = [
        distiller_messages(pair, task.family, spec.entries_per_problem, spec.prompts.quote_chars) for pair in pairs
    ]
    rendered = [model.style.render(*m) + spec.prefix for m in messages]  # the reply prefilled with the prefix
    replies = [completed(spec.prefix, c.text) for c in model.replies(rendered, spec.max_new_tokens)]
    entries, prompts, dropped = [], [], {}
    for pair, (system, user), reply in zip(pairs, messages, replies):
        problem = answers.get(pair.problem_id) or Problem(pair.problem_id, pair.question, "")
        parsed = parse_entries(reply, problem, spec.entries_per_problem)
        digest = prompt_digest(system, user, spec.prefix)
        entries += [
            {"text": text, "problem_id": pair.problem_id, "question": pair.question, "models": list(pair.models),
             "distiller": digest}
            for text in parsed.entries
        ]
        prompts.append(DistillPrompt(
            problem_id=pair.problem_id, digest=digest, system=system, user=user, reply=reply,
            kept=len(parsed.entries), dropped=parsed.dropped,
        ))
        for reason, count in parsed.dropped.items():
            dropped[reason] = dropped.get(reason, 0) + count
    result = DistilledResult(
        task=spec.task_name, memory=spec.bank, mode=spec.mode, distiller=spec.model.name, pairs=len(pairs),
        entries=entries, prompts=prompts, dropped=dropped, seconds=time.perf_counter() - began,
        spec_digest=spec.digest(), cost=meter.cost(tokens=model.tokens),
    )
    write_result(output, result)
    log(
        f"{spec.bank} on {spec.task_name}: {len(pairs)} pairs, {len(entries)} constraints kept, "
        f"dropped {json.dumps(dropped, sort_keys=True)}, {result.seconds:.1f} s"
    )
    return result


def bank(spec: BankSpec, distilled: Path, labels: Path, output: Path, log=print) -> BankResult:
    found = read_result(distilled, DistilledResult)
    labelled = read_result(labels, LabelsResult).labels
    entries = []
    for e in found.entries:
        label = Label.from_dict(labelled[e["problem_id"]]) if e["problem_id"] in labelled else Label("other", "other")
        entries.append(Entry(e["text"], e["problem_id"], e["question"], label, tuple(e["models"]), found.mode, e["distiller"]))
    result = BankResult(
        task=spec.task_name, memory=spec.bank, mode=found.mode, entries=[e.to_dict() for e in entries],
        spec_digest=spec.digest(),
    )
    write_result(output, result)
    log(f"{spec.bank} on {spec.task_name}: {len(entries)} constraints from {len({e.problem_id for e in entries})} problems")
    return result


def show(style, bank: MemoryBank, problems: list[Problem], labels: dict[str, Label], r: Retrieval) -> dict[str, list[Entry]]:
    """Retrieve each problem's constraints (by its label; unlabelled: other / other) and guide
    ``style``'s prompts of ``r.roles`` with them; returns them by problem id."""
    other = Label("other", "other")
    shown = {p.id: retrieve(bank, p, labels.get(p.id, other), r.top_p, r.per_problem, r.limit) for p in problems}
    style.guide({pid: guidance_block(entries) for pid, entries in shown.items()}, r.roles)
    return shown


@dataclass(frozen=True)
class Guide:
    """A memory applied to an evaluation (a ``workflows.styles.PromptGuide``): what each
    problem is shown, in which roles."""

    mode: str
    bank_name: str
    entries: list[Entry]
    labels: dict[str, Label]
    retrieval: Retrieval

    @classmethod
    def read(cls, mode: str, bank_file: Path, labels_file: Path, retrieval: Retrieval) -> Guide:
        found = read_result(bank_file, BankResult)
        labels = {pid: Label.from_dict(d) for pid, d in read_result(labels_file, LabelsResult).labels.items()}
        return cls(mode, found.memory, [Entry.from_dict(e) for e in found.entries], labels, retrieval)

    @functools.cached_property
    def bank(self) -> MemoryBank:
        """The entries' bank, fitted once however many times the guide is applied."""
        return MemoryBank(self.entries)

    def apply(self, style, problems: list[Problem]) -> dict:
        """Guide ``style``'s prompts for ``problems``; the result fields that record it."""
        index = {id(e): i for i, e in enumerate(self.entries)}
        shown = show(style, self.bank, problems, self.labels, self.retrieval)
        rows = [
            RetrievalRow(
                problem_id=p.id, label=str(self.labels.get(p.id, Label("other", "other"))),
                entries=[index[id(e)] for e in shown[p.id]],
            )
            for p in problems
        ]
        mean = float(np.mean([len(row.entries) for row in rows])) if rows else 0.0
        return {"memory": self.mode, "bank": self.bank_name, "entries_mean": mean, "retrievals": rows}


class TrainingGuide:
    """A memory in a cell's training prompts (a ``workflows.styles.PromptGuide``, which
    ``train.trainer.train_cell`` applies to each step's problems before the rollouts): the
    problems not seen yet are labelled by the labeller (greedy, once per problem), then every
    one is shown its constraints as an evaluation shows them (:class:`Guide`)."""

    def __init__(self, spec: TrainMemory, entries: list[Entry], labeller: _Model, family: str):
        self.spec = spec
        self.labeller = labeller
        self.family = family
        self.labels: dict[str, Label] = {}
        self.guide = Guide(spec.mode, spec.bank.bank, entries, self.labels, spec.retrieval)  # reads self.labels

    @property
    def entries(self) -> list[Entry]:
        return self.guide.entries

    @classmethod
    def load(cls, spec: TrainMemory, bank_file: Path, labeller_dir: Path, family: str, prompts) -> TrainingGuide:
        """The bank's constraints and the labeller (a model: its loading draws from torch's RNG,
        so a trainer loads it under ``torch.random.fork_rng``). A labeller of a GPU scale loads
        onto the training job's GPU (``jobs.train`` claims it for both)."""
        entries = [Entry.from_dict(e) for e in read_result(Path(bank_file), BankResult).entries]
        labeller = _load(spec.labeller, Path(labeller_dir), family, prompts, batch_size=64, threads=1)
        return cls(spec, entries, labeller, family)

    def apply(self, style, problems: list[Problem]) -> dict:
        """Label ``problems`` not seen yet, and guide ``style`` with their constraints; what
        :meth:`Guide.apply` records of it (training records none of it)."""
        new = list({p.id: p for p in problems if p.id not in self.labels}.values())
        if new:
            replies = _label_replies(self.labeller, new, self.family, self.spec.label_max_new_tokens)
            self.labels.update({p.id: parse_label(reply, self.family) for p, reply in zip(new, replies)})
        return self.guide.apply(style, problems)
