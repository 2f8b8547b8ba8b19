"""Seconds per GRPO update: matrixrl's three policy variants against TRL's ``GRPOTrainer``.

All four variants train the same tiny-s model (Qwen3 architecture, hidden 128, 2
layers, 4 heads, 2 KV heads, intermediate 256, the character tokenizer), warm-started
on arith for ``--warmstart`` steps so that some answers are right and advantages are
not all zero, on the ``single`` workflow of the arith task ("4+8+9=" → "21"),
one optimizer step per update over 16 problems × a group of 8 = 128 sampled
completions of at most 8 new tokens, with one torch thread each:

- ``matrixrl shared (full)``: one full model for every role (``policy: shared``).
- ``matrixrl isolated-full``: one full copy per role (``single`` has one role, so
  this measures the isolated code path, not extra models).
- ``matrixrl isolated-lora``: PEFT LoRA adapters (rank 8, attention projections)
  on a frozen base, one adapter per role.
- ``TRL GRPOTrainer``: the reference, configured as matrixrl trains (token-mean
  ``dapo`` loss, ``beta=0``, ``num_iterations=1``, clip 0.2 / 0.28, temperature 1,
  top-k/top-p off, AdamW lr 5e-4 betas (0.9, 0.99), grad-norm clip 1, fp32, CPU).

A matrixrl update is timed as ``grpo_step``, the body of ``train_cell``'s loop: draw
the problems, roll out (``make_generate`` + ``workflow.run``), score
(``assign_rewards`` + ``role_metrics``), group advantages (``assign_advantages``) and
``update_policy`` (backward per agent with its gradient diagnostics, clipping, optimizer
step). Checkpointing is left out. A TRL update is
one optimizer step, timed from ``on_step_begin`` to ``on_step_end`` with a
``TrainerCallback``; it includes TRL's generation, reward, advantage, loss and
optimizer work, and its per-step metric bookkeeping.

Every variant runs one warm-up update (untimed), then ``--steps`` timed ones; the
table gives the median seconds per update, the completion tokens per update (EOS
included, as both trainers count it in the loss) and the mean completion length,
and the ratio of each median to TRL's (below 1: faster than TRL). Compare rows only
when their token counts are close. matrixrl skips the forward and backward passes
of turns whose advantage is 0 (a group whose rollouts all scored alike adds no
gradient), while TRL computes them; the ``zero adv`` column gives the share of
matrixrl's turns that were skipped, the source of most of any difference.

    python bench/train_step.py [--steps 5] [--warmstart 150]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

PROBLEMS = 16
GROUP = 8
MAX_NEW_TOKENS = 8
SEED = 0


ARITH = dict(kind="arith", digits=1, terms=3, warmstart_terms=2, warmstart_digits=1, warmstart_hard_fraction=0.2, n_eval=256, seed=0)


def build_base(folder: Path, warmstart_steps: int) -> None:
    """Warm-start a tiny-s model on arith alone (the ``prepare_base`` job) into ``folder``."""
    from matrixrl.config import TinyScale, Workflows
    from matrixrl.grid import BaseSpec
    from matrixrl.jobs.prepare_base import prepare_base

    scale = TinyScale(
        kind="tiny", hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=256, max_length=32,
        warmstart={"steps": warmstart_steps, "batch_size": 64, "lr": 3.0e-3, "seed": SEED},
    )
    spec = BaseSpec(scale_name="tiny-s", scale=scale, tasks={"arith": ARITH}, workflows=Workflows())
    prepare_base(spec, folder, folder.parent / "base.json", log=lambda message: None)


def build_random_base(folder: Path) -> None:
    """Save a random-init tiny-s model and the character tokenizer to ``folder``."""
    from matrixrl.config import TinyScale
    from matrixrl.models.tiny import build_char_tokenizer, build_tiny_model

    scale = TinyScale(kind="tiny", hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=256, max_length=32)
    tokenizer = build_char_tokenizer()
    build_tiny_model(scale, tokenizer, seed=SEED).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def build_arith():
    from matrixrl.tasks.arith import Settings as ArithSettings
    from matrixrl.tasks import build_task

    # The experiments.yaml task: three one-digit operands.
    return build_task("arith", ArithSettings(**ARITH))


@contextlib.contextmanager
def zero_advantage_shares():
    """While active, the trainer's ``update_policy`` records each update's share of zero-advantage turns."""
    import matrixrl.train.trainer as trainer

    shares: list[float] = []
    update = trainer.update_policy

    def counting(policy, optimizers, episodes, *args, **kwargs):
        turns = [t for e in episodes for t in e.turns]
        shares.append(sum(t.advantage == 0.0 for t in turns) / len(turns))
        return update(policy, optimizers, episodes, *args, **kwargs)

    trainer.update_policy = counting
    try:
        yield shares
    finally:
        trainer.update_policy = update


def train_config():
    from matrixrl.config import Train

    return Train(problems_per_step=PROBLEMS, group_size=GROUP, max_new_tokens=MAX_NEW_TOKENS, threads=1)


def time_matrixrl(base_dir: Path, mode: str, adapter: str, steps: int) -> tuple[list[float], list[int], list[float]]:
    """Seconds, completion tokens and zero-advantage share of each timed update (warm-up excluded)."""
    import torch
    from transformers import AutoTokenizer

    from matrixrl.config import Policies
    from matrixrl.models.policies import build_policy, load_causal_lm
    from matrixrl.train.rollout import make_generate
    from matrixrl.train.trainer import GrpoRun, grpo_step, make_optimizers
    from matrixrl.workflows import build_workflow

    cfg = train_config()
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    workflow = build_workflow("single")
    task = build_arith()
    policy = build_policy(mode, load_causal_lm(base_dir), workflow.roles, Policies(adapter=adapter))
    optimizers = make_optimizers(policy, cfg)
    generate = make_generate(policy, tokenizer, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, sample=True)
    run = GrpoRun(
        seed=SEED, policy=policy, optimizers=optimizers, workflow=workflow, task=task, generate=generate,
        pad_token_id=tokenizer.pad_token_id, cfg=cfg,
    )

    seconds, tokens = [], []
    with zero_advantage_shares() as zero_advantage:
        for step in range(1 + steps):
            row, _, _ = grpo_step(run, step)
            if step > 0:  # the first update warms up
                seconds.append(row["seconds"])
                tokens.append(row["completion_tokens"])
    return seconds, tokens, zero_advantage[1:]


def time_trl(base_dir: Path, steps: int, out_dir: Path) -> tuple[list[float], list[int]]:
    """Seconds and completion tokens of each timed TRL optimizer step (warm-up excluded)."""
    import numpy as np
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer

    from matrixrl.models.policies import load_causal_lm
    from matrixrl.tasks.base import Problem
    from matrixrl.workflows.styles.compact import generator_compact

    cfg = train_config()
    torch.set_num_threads(1)
    task = build_arith()
    total = 1 + steps
    problems = task.train_problems(np.random.default_rng(SEED), PROBLEMS * total)
    dataset = Dataset.from_dict(
        {
            "prompt": [generator_compact(p) for p in problems],
            "question": [p.question for p in problems],
            "answer": [p.answer for p in problems],
        }
    )
    step_tokens: list[int] = []

    def arith_reward(prompts, completions, completion_ids, question, answer, **kwargs):
        step_tokens.append(sum(len(ids) for ids in completion_ids))
        return [task.score(Problem(id=q, question=q, answer=a), c) for q, a, c in zip(question, answer, completions)]

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.seconds: list[float] = []
            self._began = 0.0

        def on_train_begin(self, args, state, control, **kwargs):
            torch.set_num_threads(1)  # in case the trainer's setup changed it

        def on_step_begin(self, args, state, control, **kwargs):
            self._began = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.seconds.append(time.perf_counter() - self._began)
            self.threads = torch.get_num_threads()

    args = GRPOConfig(
        output_dir=str(out_dir),
        use_cpu=True,
        bf16=False,
        fp16=False,
        seed=SEED,
        max_steps=total,
        per_device_train_batch_size=PROBLEMS * GROUP,  # completions per device per step
        gradient_accumulation_steps=1,
        num_generations=GROUP,
        generation_batch_size=PROBLEMS * GROUP,  # one generation round per optimizer step
        max_completion_length=cfg.max_new_tokens,
        num_iterations=1,
        beta=0.0,
        loss_type="dapo",
        epsilon=cfg.epsilon_low,
        epsilon_high=cfg.epsilon_high,
        scale_rewards="group",
        temperature=cfg.temperature,
        top_k=0,
        top_p=1.0,
        learning_rate=cfg.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta1=0.9,
        adam_beta2=0.99,
        weight_decay=0.0,
        max_grad_norm=cfg.max_grad_norm,
        report_to=[],
        logging_strategy="no",
        save_strategy="no",
        dataloader_num_workers=0,
        log_completions=False,
    )
    timer = StepTimer()
    trainer = GRPOTrainer(
        model=load_causal_lm(base_dir),
        reward_funcs=arith_reward,
        args=args,
        train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(base_dir),
        callbacks=[timer],
    )
    # No progress bar or end-of-training metrics printout: the table is the output.
    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    if timer.threads != 1:
        raise RuntimeError(f"TRL ran with {timer.threads} torch threads, not 1")
    if len(timer.seconds) != total or len(step_tokens) != total:
        raise RuntimeError(f"expected {total} steps, timed {len(timer.seconds)} with {len(step_tokens)} reward calls")
    return timer.seconds[1:], step_tokens[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="timed updates per variant (after one warm-up)")
    parser.add_argument("--warmstart", type=int, default=150, help="warm-start steps of the shared base model")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()

    rows: dict[str, tuple | str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        base_dir = Path(tmp) / "base"
        build_base(base_dir, args.warmstart)
        for label, mode, adapter in (
            ("matrixrl shared (full)", "shared", "full"),
            ("matrixrl isolated-full", "isolated", "full"),
            ("matrixrl isolated-lora", "isolated", "lora"),
        ):
            rows[label] = time_matrixrl(base_dir, mode, adapter, args.steps)
        try:
            rows["TRL GRPOTrainer"] = time_trl(base_dir, args.steps, Path(tmp) / "trl")
        except Exception as error:  # report why instead of a number
            rows["TRL GRPOTrainer"] = f"{type(error).__name__}: {error}".splitlines()[0]

    reference = rows["TRL GRPOTrainer"]
    trl_median = statistics.median(reference[0]) if isinstance(reference, tuple) else None
    completions = PROBLEMS * GROUP
    print(
        f"GRPO update, single workflow, arith, tiny-s warm-started {args.warmstart} steps, {PROBLEMS} problems x {GROUP} = "
        f"{completions} completions, max {MAX_NEW_TOKENS} new tokens, 1 thread; median of {args.steps} updates after 1 warm-up:"
    )
    print(f"  {'variant':24s} {'s/update':>9s} {'tokens/update':>14s} {'mean len':>9s} {'zero adv':>9s} {'vs TRL':>7s}")
    for label, result in rows.items():
        if isinstance(result, str):
            print(f"  {label:24s} not run: {result}")
            continue
        seconds, tokens, *zero_advantage = result
        median = statistics.median(seconds)
        mean_tokens = statistics.mean(tokens)
        skipped = f"{statistics.mean(zero_advantage[0]):8.0%}" if zero_advantage else "     n/a"
        ratio = f"{median / trl_median:6.2f}x" if trl_median else "    n/a"
        print(f"  {label:24s} {median:9.3f} {mean_tokens:14.1f} {mean_tokens / completions:9.2f} {skipped:>9s} {ratio:>7s}")


if __name__ == "__main__":
    main()
