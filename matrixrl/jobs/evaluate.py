"""evaluate: score one checkpoint on the task's fixed evaluation set, as the study does.

Accuracy, its standard error, pass@j and the base model's one evaluation: docs/design.md §3.
The cell is built as training builds it; under a memory, ``jobs.memcollab.Guide`` is its guide.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np

from matrixrl import grid as G
from matrixrl import layout as L
from matrixrl.errors import UserError
from matrixrl.grid import CellSpec, MemoryEvalSpec
from matrixrl.jobs.cost import Meter
from matrixrl.models.devices import claimed_gpu
from matrixrl.results import EvalResult, MemoryEvalResult, read_result, write_result
from matrixrl.workflows.styles import PromptGuide


def eval_seed(seed: int, step: int) -> int:
    """The sampling key of one checkpoint's evaluation (distinct from any training step's seed)."""
    return int(np.random.SeedSequence([seed, step, 0xE7A1]).generate_state(1, dtype=np.uint32)[0])


def pass_at(correct: np.ndarray, samples: int) -> dict[str, float]:
    """Mean unbiased pass@j over problems for j = 1, 2, 4, ... and ``samples``: 1 - C(k-c, j) / C(k, j)."""
    ks = sorted({j for j in (2**i for i in range(samples.bit_length())) if j <= samples} | {samples})
    return {
        str(j): float(np.mean([1.0 - math.comb(samples - int(c), j) / math.comb(samples, j) for c in correct]))
        for j in ks
    }


def evaluate(spec: CellSpec, step: int, checkpoint: Path, base_dir: Path, output: Path, log=print) -> EvalResult:
    _check_checkpoint(spec, step, checkpoint)
    with claimed_gpu(spec.scale, log=log) as device:
        return _evaluate(spec, step, checkpoint, base_dir, output, log, device=device)


def _check_checkpoint(spec: CellSpec, step: int, checkpoint: Path) -> None:
    if not Path(checkpoint).is_dir():
        from matrixrl.retention import pruned_steps

        cell_dir = L.cell_dir_of(checkpoint)
        train_file = (cell_dir / L.TRAIN_FILE).resolve()
        what = f"the checkpoint of step {step} is missing ({Path(checkpoint).resolve()})"
        if step in pruned_steps(cell_dir, spec.resume_digest()):  # `matrixrl run` would have retrained the cell
            record = (cell_dir / L.RETENTION_FILE).resolve()
            what = f"the checkpoint of step {step} was deleted after its evaluation ({record})"
        raise UserError(
            f"{what}, so it cannot be evaluated; delete "
            f"{train_file} and run `matrixrl run` again: the cell rebuilds it from its last checkpoint before"
        )


def evaluate_base(spec: CellSpec, base_dir: Path, output: Path, log=print) -> EvalResult:
    """Evaluate the base model of ``spec``'s (workflow, task, scale) once: the step 0 of
    every cell that shares it (``grid.base_eval_science``), sampled with seed 0's key."""
    shared = G.base_eval_spec(spec)
    name = f"the base model of {spec.cell.workflow}-{spec.cell.task}-{spec.cell.scale}"
    with claimed_gpu(spec.scale, log=log) as device:
        return _evaluate(shared, 0, None, base_dir, output, log, device=device, name=name, digest=G.base_eval_digest(spec))


def copy_base_eval(spec: CellSpec, source: Path, output: Path, log=print) -> EvalResult:
    """A cell's step 0: the shared evaluation of its base model (``evaluate_base``), under the cell's name."""
    base = read_result(Path(source), EvalResult)
    result = base.model_copy(
        update={"cell": spec.cell.id, "seconds": 0.0, "cost": None, "spec_digest": spec.eval_digest(), "base_eval": base.spec_digest}
    )
    write_result(output, result)
    log(f"{spec.cell.id} step 0: accuracy {result.accuracy:.3f}, the base model's evaluation ({source})")
    return result


def evaluate_memory(
    spec: MemoryEvalSpec, step: int, checkpoint: Path, base_dir: Path, bank: Path, labels: Path, output: Path, log=print
) -> MemoryEvalResult:
    """A checkpoint's evaluation with the memory ``spec`` names in its guided roles' prompts."""
    from matrixrl.jobs.memcollab import Guide

    _check_checkpoint(spec.cell, step, checkpoint)
    guide = Guide.read(spec.mode, bank, labels, spec.retrieval)
    with claimed_gpu(spec.cell.scale, log=log) as device:
        return _evaluate(
            spec.cell, step, checkpoint, base_dir, output, log, device=device, digest=spec.digest(), guide=guide
        )


def evaluate_base_memory(
    spec: MemoryEvalSpec, base_dir: Path, bank: Path, labels: Path, output: Path, log=print
) -> MemoryEvalResult:
    """The base model's evaluation under a memory: every cell's memory step 0, as ``evaluate_base``."""
    from matrixrl.jobs.memcollab import Guide

    guide = Guide.read(spec.mode, bank, labels, spec.retrieval)
    cell = spec.cell.cell
    with claimed_gpu(spec.cell.scale, log=log) as device:
        return _evaluate(
            G.base_eval_spec(spec.cell), 0, None, base_dir, output, log, device=device,
            name=f"the base model of {cell.workflow}-{cell.task}-{cell.scale}", digest=spec.base_digest(), guide=guide,
        )


def copy_base_memory_eval(spec: MemoryEvalSpec, source: Path, output: Path, log=print) -> MemoryEvalResult:
    """A cell's memory step 0: the base model's evaluation under the memory, under the cell's name."""
    base = read_result(Path(source), MemoryEvalResult)
    # The base evaluation serves every mode that reads its bank (own of one scale, transfer of the
    # other, when both load one model): the copy names this cell's mode.
    update = {"cell": spec.cell.cell.id, "memory": spec.mode, "seconds": 0.0, "cost": None, "spec_digest": spec.digest()}
    result = base.model_copy(update={**update, "base_eval": base.spec_digest})
    write_result(output, result)
    log(f"{spec.cell.cell.id} step 0 with {spec.mode}: accuracy {result.accuracy:.3f}, the base model's ({source})")
    return result


def _evaluate(
    spec: CellSpec, step: int, checkpoint: Path | None, base_dir: Path, output: Path, log, device: str | None,
    name: str | None = None, digest: str | None = None, guide: PromptGuide | None = None,
) -> EvalResult:
    """``checkpoint`` None: the base model itself (a fresh policy: adapters at zero); ``guide``:
    applied to the prompts before the rollouts, and what it returns recorded in a
    MemoryEvalResult (``evaluate_memory`` passes a memory's, jobs.memcollab.Guide)."""
    import torch

    from matrixrl.train.cell import build_cell
    from matrixrl.train.metrics import role_metrics
    from matrixrl.train.rewards import score_episodes
    from matrixrl.workflows.base import rollout

    torch.set_num_threads(spec.eval.threads)
    meter = Meter(spec.cell.scale)
    cell = build_cell(spec, base_dir, device=device)
    task, workflow = cell.task, cell.workflow
    policy = cell.new_policy() if checkpoint is None else cell.load_policy(checkpoint)
    cfg = spec.eval
    sampled = cfg.temperature > 0
    generate = cell.make_generate(
        policy,
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature if sampled else 1.0,
        sample=sampled,
        batch_size=cfg.batch_size,
        seed=eval_seed(spec.cell.seed, step) if sampled else None,
    )
    problems = task.eval_problems()
    recorded = guide.apply(cell.style, problems) if guide is not None else {}
    k = cfg.samples
    batch = [p for p in problems for _ in range(k)]  # a problem's k samples side by side
    episodes = rollout(workflow, batch, [i // k for i in range(len(batch))], generate)
    scores = score_episodes(task, episodes)  # every answer of the evaluation in one batch
    correct = np.array([scores(e.problem, e.answer) for e in episodes]).reshape(len(problems), k).sum(axis=1)
    per_problem = correct / k
    n = len(problems)
    result = (MemoryEvalResult if guide is not None else EvalResult)(
        cell=name or spec.cell.id,
        step=step,
        accuracy=float(per_problem.mean()),
        n=n,
        samples=k,
        n_correct=int(correct.sum()),
        se=float(per_problem.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0,
        pass_at=pass_at(correct, k),
        seconds=time.perf_counter() - meter.began,
        cost=meter.cost(tokens=sum(len(t.completion.completion_ids) for e in episodes for t in e.turns)),
        roles=role_metrics(episodes, task, scores),
        spec_digest=digest or spec.eval_digest(),
        response_tokens=float(np.mean([sum(len(t.completion.completion_ids) for t in e.turns) for e in episodes])),
        **recorded,
    )
    write_result(output, result)
    with_memory = f" with memory {result.memory} ({result.entries_mean:.1f} constraints shown per problem)" if guide else ""
    log(
        f"{name or spec.cell.id} step {step}{with_memory}: accuracy {result.accuracy:.3f} ± {result.se:.3f} "
        f"({result.n_correct}/{n * k} completions, {k} per problem, temperature {cfg.temperature})"
    )
    return result
