"""Seconds of scoring per GRPO step on the pyfunc task, against the whole step.

A training step of the default grid scores every answer its episodes propose or
judge: ``problems_per_step`` (8) × ``group_size`` (8) episodes, each with up to 4–5
answers (voting: 3 generators and the aggregator; eval_opt: up to 3 drafts). The
pyfunc task scores them with one ``score_batch`` call. This script runs real
``grpo_step`` updates of a warm-started tiny base model on every workflow and times
the scoring inside each step, in two ways on the same answers:

- ``in-process + sandbox`` (the task as shipped): answers that do not parse fail at
  once, integer arithmetic on ``x`` is computed by walking its syntax tree, any other
  expression runs in the sandbox;
- ``sandbox only``: every parseable answer runs in the sandbox (``run_many``, the
  task's ``workers``), its verdict cache cleared first.

For each workflow it prints the mean step seconds (generation, scoring, advantages,
the optimizer update), the distinct answers scored per step (and those sent to the
sandbox), and each way's scoring seconds per step with its share of the step
(mean step seconds of that way's own run: the sandbox-only run's steps are longer).

    python bench/pyfunc_scoring.py --base results/base/tiny-s/model [--steps 3]

``--base`` is a warm-started tiny model folder (``matrixrl run`` writes one per scale
under ``results/base/``); without it one is warm-started first from experiments.yaml's
``tiny-s`` (minutes).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent


def warm_started_base(folder: Path) -> Path:
    from matrixrl.config import load_config
    from matrixrl.grid import base_spec
    from matrixrl.jobs.prepare_base import prepare_base

    cfg = load_config(REPO / "experiments.yaml")
    print("warm-starting tiny-s from experiments.yaml (minutes)...", flush=True)
    prepare_base(base_spec(cfg, "tiny-s"), folder / "model", folder / "base.json", log=lambda message: None)
    return folder / "model"


class TimedScores:
    """Wraps a task's ``score_batch`` to add up its seconds and count its (distinct) answers."""

    def __init__(self, task):
        self.task, self.seconds, self.answers = task, 0.0, 0
        self.inner = task.score_batch
        task.score_batch = self

    def __call__(self, problems, answers):
        began = time.perf_counter()
        scores = self.inner(problems, answers)
        self.seconds += time.perf_counter() - began
        self.answers += len(answers)  # score_episodes sends each (problem, answer) once
        return scores


def sandboxed_count(task, problems, answers) -> int:
    from matrixrl.tasks.pyfunc import arithmetic, is_expression

    pairs = set(zip((p.id for p in problems), answers))
    return sum(1 for _, a in pairs if is_expression(a) and arithmetic(a) is None)


def run_workflow(base: Path, name: str, steps: int, arithmetic_in_process: bool) -> dict:
    import torch

    from matrixrl import sandbox
    from matrixrl.config import load_config
    from matrixrl.models.hf import load_causal_lm
    from matrixrl.models.policies import build_policy
    from matrixrl.tasks import build_task
    from matrixrl.train.rollout import make_generate
    from matrixrl.train.trainer import GrpoRun, grpo_step, make_optimizers
    from matrixrl.workflows import build_workflow
    from transformers import AutoTokenizer

    cfg = load_config(REPO / "experiments.yaml")
    torch.set_num_threads(1)
    sandbox.clear_cache()
    task = build_task("pyfunc", cfg.tasks["pyfunc"])
    task.arithmetic_in_process = arithmetic_in_process
    tokenizer = AutoTokenizer.from_pretrained(base)
    workflow = build_workflow(name, getattr(cfg.workflows, name))
    policy = build_policy("shared", load_causal_lm(base), workflow.roles, cfg.policies)
    optimizers = make_optimizers(policy, cfg.train)
    generate = make_generate(
        policy, tokenizer, max_new_tokens=cfg.train.max_new_tokens, temperature=cfg.train.temperature, sample=True
    )
    timer = TimedScores(task)
    seen: list = []
    original = timer.inner

    def recording(problems, answers):
        seen.append((list(problems), list(answers)))
        return original(problems, answers)

    timer.inner = recording
    run = GrpoRun(
        seed=0, policy=policy, optimizers=optimizers, workflow=workflow, task=task, generate=generate,
        pad_token_id=tokenizer.pad_token_id, cfg=cfg.train,
    )
    step_seconds = []
    for step in range(steps):
        row, _, _ = grpo_step(run, step)
        step_seconds.append(row["seconds"])
    return {
        "step": statistics.mean(step_seconds),
        "scoring": timer.seconds / steps,
        "answers": timer.answers / steps,
        "sandboxed": sum(sandboxed_count(task, p, a) for p, a in seen) / steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, help="a warm-started tiny model folder")
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps timed per workflow and way")
    args = parser.parse_args()
    if args.base is not None and not (args.base / "config.json").is_file():
        parser.error(f"--base {args.base}: no model folder there (no config.json); run `matrixrl run` first, or leave --base out")
    with tempfile.TemporaryDirectory() as scratch:
        base = args.base or warm_started_base(Path(scratch))
        print(f"base model: {base}; {args.steps} steps per workflow; pyfunc task of experiments.yaml\n")
        header = f"{'workflow':13} {'step s':>7} {'answers':>8} {'to sandbox':>10}   {'scoring s (share of step)':>28}   {'sandbox only s (share)':>24}   {'ratio':>6}"
        print(header)
        from matrixrl.workflows import WORKFLOWS

        for name in WORKFLOWS:
            shipped = run_workflow(base, name, args.steps, arithmetic_in_process=True)
            sandbox_only = run_workflow(base, name, args.steps, arithmetic_in_process=False)
            print(
                f"{name:13} {shipped['step']:7.2f} {shipped['answers']:8.0f} "
                f"{shipped['sandboxed']:10.1f}   {shipped['scoring']:17.3f} ({shipped['scoring'] / shipped['step']:5.1%})"
                f"   {sandbox_only['scoring']:13.2f} ({sandbox_only['scoring'] / sandbox_only['step']:5.1%})"
                f"   {sandbox_only['scoring'] / max(shipped['scoring'], 1e-9):6.0f}x",
                flush=True,
            )
        print(
            "\nanswers: distinct (problem, answer) pairs scored per step; to sandbox: those the shipped task runs"
            "\nin the sandbox; ratio: sandbox-only scoring seconds over shipped scoring seconds, same answers."
        )


if __name__ == "__main__":
    main()
