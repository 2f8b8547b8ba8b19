"""evaluate: score one checkpoint greedily on the task's fixed evaluation set.

A checkpoint of a GPU scale is evaluated on a GPU this job claims (one per job; the
jobs are threads of one process, so the claim names ``cuda:N`` rather than hiding
the other GPUs).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from matrixrl.grid import CellSpec
from matrixrl.results import EvalResult, write_result

# evaluate jobs run as threads of one Snakemake process, and transformers' lazy
# imports are not thread-safe ("cannot import name 'AutoTokenizer'" was seen), so
# importing and loading happen one job at a time; generation runs concurrently.
_LOAD_LOCK = threading.Lock()


def evaluate(spec: CellSpec, step: int, checkpoint: Path, base_dir: Path, output: Path, log=print) -> EvalResult:
    from matrixrl.models.devices import claim_gpu, gpu_count
    from matrixrl.models.hf import needs_gpu

    claim = claim_gpu() if needs_gpu(spec.scale) and gpu_count() else None
    try:
        return _evaluate(spec, step, checkpoint, base_dir, output, log, device=claim.device if claim else None)
    finally:
        if claim is not None:
            claim.release()


def _evaluate(spec: CellSpec, step: int, checkpoint: Path, base_dir: Path, output: Path, log, device: str | None) -> EvalResult:
    with _LOAD_LOCK:
        from matrixrl.models.hf import model_source
        from matrixrl.models.policies import load_policy
        from matrixrl.tasks import build_task
        from matrixrl.train.metrics import role_metrics, score_episodes
        from matrixrl.train.rollout import make_generate
        from matrixrl.workflows import build_workflow
        from matrixrl.workflows.styles import build_style

        began = time.perf_counter()
        source = model_source(spec.cell.scale, spec.scale, base_dir, device=device)
        task = build_task(spec.cell.task, spec.task)
        tokenizer = source.load_tokenizer()
        style = build_style(spec.scale.prompt_style, task.family, tokenizer, spec.prompts)
        workflow = build_workflow(spec.cell.workflow, spec.workflow, style)
        policy = load_policy(spec.cell.policy, checkpoint, workflow.roles, spec.policies, source)
    generate = make_generate(
        policy,
        tokenizer,
        max_new_tokens=spec.eval.max_new_tokens,
        temperature=1.0,
        sample=False,
        batch_size=spec.eval.batch_size,
    )
    problems = task.eval_problems()
    episodes = workflow.run(problems, list(range(len(problems))), generate)
    scores = score_episodes(task, episodes)  # every answer of the evaluation in one batch
    n_correct = int(sum(scores(e.problem, e.answer) for e in episodes))
    roles = role_metrics(episodes, task, scores)
    result = EvalResult(
        cell=spec.cell.id,
        step=step,
        accuracy=n_correct / len(problems),
        n=len(problems),
        n_correct=n_correct,
        seconds=time.perf_counter() - began,
        roles=roles,
    )
    write_result(output, result)
    log(f"{spec.cell.id} step {step}: accuracy {result.accuracy:.3f} ({n_correct}/{len(problems)})")
    return result


def evaluate_job(spec_json: str, step: int, checkpoint: str, base_dir: str, output: str, log_path: str) -> None:
    """The ``evaluate`` rule's body (runs inside the Snakemake process)."""
    from matrixrl.jobs.logfile import file_logger

    spec = CellSpec.model_validate_json(spec_json)
    evaluate(spec, step, Path(checkpoint), Path(base_dir), Path(output), log=file_logger(log_path))
