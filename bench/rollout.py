"""Throughput of a full multi-agent rollout step against plain batched ``generate``.

A workflow's rollout is several dependent role calls (voting: generators, then the
aggregator; eval_opt: draft, judge, refine...), each batched over the whole group.
This measures, on the same tiny model in one run, the completion tokens per second
of one rollout step of each workflow, and of a single ``generate`` call producing the
same number of completions at the same maximum length: the ratio is what the
workflow's structure (stages, prompt building, shrinking batches) costs. The last
columns time the same rollout with prompts that repeat within a call encoded once
per row instead of once per distinct prompt (``rollout.prefilled_cache`` off): what
the shared prompt cache saves.

    python bench/rollout.py [--problems 16] [--group 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=16)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import numpy as np
    import torch
    from transformers import AutoTokenizer

    from matrixrl.config import Policies, TinyScale
    from matrixrl.models.policies import build_policy, load_causal_lm
    from matrixrl.models.tiny import build_char_tokenizer, build_tiny_model
    from matrixrl.tasks.arith import ArithTask
    from matrixrl.tasks.arith import Settings as ArithSettings
    from matrixrl.train import rollout
    from matrixrl.train.rollout import make_generate
    from matrixrl.workflows import WORKFLOWS, build_workflow

    shared_cache = rollout.prefilled_cache

    torch.set_num_threads(1)
    max_new_tokens = 4
    task = ArithTask("arith", ArithSettings(kind="arith", digits=1, terms=3, n_eval=16))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        tokenizer = build_char_tokenizer()
        scale = TinyScale(kind="tiny", hidden_size=128, num_layers=2, intermediate_size=256, max_length=48)
        build_tiny_model(scale, tokenizer, seed=0).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        tokenizer = AutoTokenizer.from_pretrained(folder)

        print(f"tiny-s (random init), {args.problems} problems x group {args.group}, max {max_new_tokens} new tokens, 1 thread")
        print(
            f"{'workflow':14s} {'calls':>5s} {'completions':>11s} {'tokens':>7s} {'tok/s':>8s} {'plain tok/s':>11s} "
            f"{'ratio':>6s} {'uncached tok/s':>14s} {'cache speedup':>13s}"
        )
        for name in WORKFLOWS:
            workflow = build_workflow(name)
            policy = build_policy("shared", load_causal_lm(folder), workflow.roles, Policies())
            calls: list[int] = []
            generate = make_generate(policy, tokenizer, max_new_tokens=max_new_tokens, temperature=1.0, sample=True)

            def counted(role, prompts, generate=generate):
                calls.append(len(prompts))
                return generate(role, prompts)

            rollout_rates, plain_rates, uncached_rates = [], [], []
            for repeat in range(args.repeats + 1):  # the first repeat warms up
                rng = np.random.default_rng(repeat)
                torch.manual_seed(repeat)
                problems = [p for p in task.train_problems(rng, args.problems) for _ in range(args.group)]
                groups = [g for g in range(args.problems) for _ in range(args.group)]
                calls.clear()
                began = time.perf_counter()
                episodes = workflow.run(problems, groups, counted)
                seconds = time.perf_counter() - began
                tokens = sum(len(t.completion.completion_ids) for e in episodes for t in e.turns)
                n_completions = sum(calls)

                # The reference: one generate call for the same number of completions.
                prompts = [f"{p.question}=" for p in problems] * (n_completions // len(problems) + 1)
                began = time.perf_counter()
                plain = generate("generator", prompts[:n_completions])
                plain_seconds = time.perf_counter() - began
                plain_tokens = sum(len(c.completion_ids) for c in plain)

                # The same rollout (same seed) with every row's prompt encoded for itself.
                rollout.prefilled_cache = lambda *args: None
                torch.manual_seed(repeat)
                began = time.perf_counter()
                uncached = workflow.run(problems, groups, generate)
                uncached_seconds = time.perf_counter() - began
                rollout.prefilled_cache = shared_cache
                uncached_tokens = sum(len(t.completion.completion_ids) for e in uncached for t in e.turns)
                if repeat:
                    rollout_rates.append(tokens / seconds)
                    plain_rates.append(plain_tokens / plain_seconds)
                    uncached_rates.append(uncached_tokens / uncached_seconds)
            rate, plain_rate = statistics.median(rollout_rates), statistics.median(plain_rates)
            uncached_rate = statistics.median(uncached_rates)
            print(
                f"{name:14s} {len(calls):5d} {n_completions:11d} {tokens:7d} {rate:8.0f} {plain_rate:11.0f} "
                f"{rate / plain_rate:6.2f} {uncached_rate:14.0f} {rate / uncached_rate:12.2f}x"
            )


if __name__ == "__main__":
    main()
