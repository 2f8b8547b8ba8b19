"""eval_opt's rollout by continuous batching, against matrixrl's staged rollout.

The issue on performance asked to keep eval_opt's batches full as episodes finish. A
staged rollout (``workflows.base.lockstep`` over ``EvalOpt.play``) makes one batched
call per role and round: every episode's draft, then every judge, then the refines of
the episodes the judge sent back, and so on; within a call, rows that ended leave the
batch. Continuous batching, built here on the same plays, decodes every episode's
turns in one running batch instead: a turn that ends hands its episode's next request
to a queue, and queued prompts join the batch (a forward pass encodes them, all but
their last token, sharing prefixes as ``prompt_cache.prefilled_cache`` does) once they are
at least as many as the rows still decoding, or when nothing is. After that a pass
feeds every row one token, whatever turn of whatever episode it is at. Rows of roles
with different parameters (isolated policies) cannot share a pass: each parameter set
has a batch of its own, stepped in turn.

It prints, per scheduler, completion tokens per CPU second (one torch thread, median of
``--repeats`` after a warm-up, sampling at temperature 1 from torch's generator) and
the forward passes one rollout made; ``chain`` is the slowest episode's turns' tokens
summed, the fewest passes any scheduler could make if joining cost no pass. Then a
check of the engine: decoding greedily, continuous batching and the staged rollout give
the same turns (up to rounding: a joining row is left-padded to the batch's width).

Tokens are chosen as the staged path chooses them, except that sampling draws noise
for the rows computed only (a staged call draws it for its whole batch, to match
``generate``); the samples follow the same distributions, the draws differ.

    python bench/continuous_batching.py [--problems 16] [--group 8] [--tokens 8] [--warmstart 150] [--repeats 3]
    python bench/continuous_batching.py --model smollm2 [--problems 2] [--group 4] [--tokens 24]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from transformers import DynamicCache  # noqa: E402
from trl.trainer.utils import entropy_from_logits  # noqa: E402

from matrixrl.train.prompt_cache import _encode, prefilled_cache, tokenize_prompts  # noqa: E402
from matrixrl.train.rollout import COMPACT_SHARE  # noqa: E402
from matrixrl.workflows.base import Completion, Episode, Play  # noqa: E402


@dataclass
class Rows:
    """The rows one model decodes: ``rollout.decode``'s layout (``cache`` holds all but the
    newest position of ``mask``; ``inputs`` is that position's token) plus each row's own
    progress, since rows join at different times."""

    cache: DynamicCache
    mask: torch.Tensor  # (rows, cached + 1)
    inputs: torch.Tensor  # (rows, 1)
    positions: torch.Tensor  # (rows, 1)
    steps: torch.Tensor  # (rows,) tokens generated so far
    tokens: torch.Tensor  # (rows, max_new_tokens)
    entropy: torch.Tensor  # (rows,) summed entropy of the sampled tokens
    live: torch.Tensor  # (rows,) still generating
    owners: list[int]  # the play each row answers
    prompt_ids: list[list[int]]

    TENSORS = ("mask", "inputs", "positions", "steps", "tokens", "entropy", "live")

    def select(self, keep: torch.Tensor) -> None:
        """Keep the rows ``keep``, and drop the cache columns none of them attends to."""
        self.cache.batch_select_indices(keep)
        for name in self.TENSORS:
            setattr(self, name, getattr(self, name)[keep])
        self.owners = [self.owners[i] for i in keep.tolist()]
        self.prompt_ids = [self.prompt_ids[i] for i in keep.tolist()]
        first = int(self.mask.any(0).nonzero()[0]) if self.owners else 0
        if first:
            self.mask = self.mask[:, first:]
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]


def left_pad(x: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    shape = list(x.shape)
    shape[dim] = n
    return torch.cat([x.new_zeros(shape), x], dim=dim) if n else x


def join(old: Rows, new: Rows) -> Rows:
    """The two batches as one: the shorter cache left-padded (and masked) to the longer."""
    width = max(old.mask.shape[1], new.mask.shape[1])
    pad_old, pad_new = width - old.mask.shape[1], width - new.mask.shape[1]
    for a, b in zip(old.cache.layers, new.cache.layers):
        a.keys = torch.cat([left_pad(a.keys, pad_old, 2), left_pad(b.keys, pad_new, 2)])
        a.values = torch.cat([left_pad(a.values, pad_old, 2), left_pad(b.values, pad_new, 2)])
    tensors = {name: torch.cat([getattr(old, name), getattr(new, name)]) for name in Rows.TENSORS if name != "mask"}
    mask = torch.cat([left_pad(old.mask, pad_old, 1), left_pad(new.mask, pad_new, 1)])
    return Rows(old.cache, mask=mask, owners=old.owners + new.owners, prompt_ids=old.prompt_ids + new.prompt_ids, **tensors)


def choose(scores: torch.Tensor, rows: Rows, temperature: float | None) -> torch.Tensor:
    """Each computed row's next token: greedy (``temperature`` None), or sampled from torch's
    generator, as ``samplers.SampledChooser`` samples, adding each live row's entropy."""
    if temperature is None:
        return scores.argmax(dim=-1)
    scaled = scores / temperature
    rows.entropy += torch.where(rows.live, entropy_from_logits(scaled), 0.0)
    probs = torch.softmax(scaled, dim=-1)
    return (probs / torch.empty_like(probs).exponential_(1)).argmax(dim=-1)


@torch.no_grad()
def serve(
    plays: list[Play], policy, tokenizer, *, max_new_tokens: int, temperature: float | None, joins: list[int] | None = None
) -> list[Episode]:
    """Run every play to its episode, all their turns decoded in running batches, one per
    parameter set. ``joins``, when given, gets the number of rows still decoding at each
    time prompts joined (0: they started a batch)."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    episodes: list[Episode | None] = [None] * len(plays)
    queue: dict[str, list[tuple[int, str]]] = {}  # parameter set -> (play, prompt) waiting to join
    batches: dict[str, Rows] = {}
    role_of = {policy.set_of(role): role for role in reversed(policy.roles)}

    def advance(play: int, completion: Completion | None) -> None:
        try:
            role, prompt = plays[play].send(completion)
        except StopIteration as stop:
            episodes[play] = stop.value
        else:
            queue.setdefault(policy.set_of(role), []).append((play, prompt))

    for i in range(len(plays)):
        advance(i, None)
    while queue or batches:
        for name in list(dict.fromkeys([*batches, *queue])):
            model = policy.model_for(role_of[name])
            rows, waiting = batches.pop(name, None), queue.get(name, [])
            live = int(rows.live.sum()) if rows is not None else 0
            if waiting and len(waiting) >= live:  # half the batch or more would be waiting: join
                del queue[name]
                new = prefill(model, tokenizer, waiting, max_new_tokens)
                if joins is not None:
                    joins.append(live)
                if rows is not None:
                    rows.select(rows.live.nonzero().squeeze(1))
                rows = new if rows is None else join(rows, new)
            if rows is None:
                continue
            ended = step(model, rows, temperature, eos, pad, max_new_tokens)
            ids = [rows.tokens[i, : int(rows.steps[i])].tolist() for i in ended]
            texts = tokenizer.batch_decode([t[:-1] if t[-1] == eos else t for t in ids], skip_special_tokens=False)
            for i, completion_ids, text in zip(ended, ids, texts):
                advance(rows.owners[i], Completion(text, rows.prompt_ids[i], completion_ids, float(rows.entropy[i])))
            going = int(rows.live.sum())
            if going:
                if len(rows.owners) - going >= max(1, len(rows.owners) * COMPACT_SHARE):
                    rows.select(rows.live.nonzero().squeeze(1))
                batches[name] = rows
    return episodes


def prefill(model, tokenizer, waiting: list[tuple[int, str]], max_new_tokens: int) -> Rows:
    """The prompts ``waiting`` as new rows: encoded but for their last token, which the next
    pass feeds with the other rows' latest tokens."""
    device = next(model.parameters()).device
    prompts = [prompt for _, prompt in waiting]
    tokenized = tokenize_prompts(tokenizer, prompts)
    prefilled = prefilled_cache(model, tokenizer, prompts, device, tokenized)
    if prefilled is not None:
        cache, ids, mask = prefilled.cache, prefilled.ids, prefilled.mask
    else:
        ids, mask = tokenized.input_ids.to(device), tokenized.attention_mask.to(device)
        cache = DynamicCache(config=model.config)
        _encode(model, ids[:, :-1], mask[:, :-1], (mask[:, :-1].cumsum(-1) - 1).clamp(min=0), cache)
    n = len(waiting)
    return Rows(
        cache=cache,
        mask=mask,
        inputs=ids[:, -1:],
        positions=mask.sum(-1, keepdim=True) - 1,
        steps=torch.zeros(n, dtype=torch.long, device=device),
        tokens=torch.zeros((n, max_new_tokens), dtype=torch.long, device=device),
        entropy=torch.zeros(n, dtype=torch.float32, device=device),
        live=torch.ones(n, dtype=torch.bool, device=device),
        owners=[play for play, _ in waiting],
        prompt_ids=[list(tokenized.distinct[r]) for r in tokenized.rows],
    )


def step(model, rows: Rows, temperature: float | None, eos: int, pad: int, max_new_tokens: int) -> list[int]:
    """One forward pass over ``rows``: each live row's next token. Returns the rows whose turn ended."""
    logits = model(
        input_ids=rows.inputs,
        attention_mask=rows.mask.bool()[:, None, None, :],
        position_ids=rows.positions,
        cache=rows.cache,
        use_cache=True,
        logits_to_keep=1,
    ).logits[:, -1].float()
    chosen = choose(logits, rows, temperature)
    live = rows.live
    rows.tokens[live.nonzero().squeeze(1), rows.steps[live]] = chosen[live]
    rows.steps += live.long()
    ended = live & ((chosen == eos) | (rows.steps == max_new_tokens))
    rows.live = live & ~ended
    rows.inputs = torch.where(rows.live, chosen, pad)[:, None]
    rows.positions = rows.positions + 1
    rows.mask = torch.cat([rows.mask, rows.mask.new_ones((len(rows.owners), 1))], dim=-1)
    return ended.nonzero().squeeze(1).tolist()


def main() -> None:
    from rollout import add_step_arguments, load_source, step_shape  # bench/rollout.py, beside this script

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_step_arguments(parser)
    parser.add_argument("--policy", choices=("shared", "isolated"), default="shared")
    args = parser.parse_args()
    problems_per_step, group, max_new_tokens = step_shape(args)
    warnings.filterwarnings("ignore")

    import numpy as np

    from matrixrl.config import Policies
    from matrixrl.models.policies import build_policy
    from matrixrl.tasks.arith import ArithTask
    from matrixrl.tasks.arith import Settings as ArithSettings
    from matrixrl.train.rollout import make_generate
    from matrixrl.workflows import build_workflow
    from matrixrl.workflows.base import lockstep
    from matrixrl.workflows.styles import build_style

    torch.set_num_threads(1)
    task = ArithTask("arith", ArithSettings(kind="arith", digits=1, terms=3, n_eval=16))
    with tempfile.TemporaryDirectory() as tmp:
        source, label = load_source(args, Path(tmp))
        tokenizer = source.load_tokenizer()
        workflow = build_workflow("eval_opt", None, build_style("chat" if args.model == "smollm2" else "compact", "math", tokenizer))
        policy = build_policy(args.policy, source.load_model(), workflow.roles, Policies())
        passes: list[int] = []
        for model in {id(policy.model_for(r)): policy.model_for(r) for r in workflow.roles}.values():
            model.register_forward_pre_hook(lambda module, inputs: passes.append(1))

        def staged(batch, groups, temperature):
            generate = make_generate(policy, tokenizer, max_new_tokens=max_new_tokens, temperature=temperature or 1.0, sample=temperature is not None)
            return lockstep([workflow.play(p, g) for p, g in zip(batch, groups)], generate)

        def continuous(batch, groups, temperature, joins=None):
            plays = [workflow.play(p, g) for p, g in zip(batch, groups)]
            return serve(plays, policy, tokenizer, max_new_tokens=max_new_tokens, temperature=temperature, joins=joins)

        print(
            f"{label}; eval_opt (max_iterations {workflow.max_iterations}), {args.policy} policy; {problems_per_step} problems "
            f"x group {group}, max {max_new_tokens} new tokens, 1 thread, CPU seconds, median of {args.repeats}"
        )
        print(f"{'scheduler':11s} {'tok/s':>7s} {'passes':>6s} {'chain':>5s} {'turns':>5s} {'tokens':>6s}")
        rates: dict[str, list[float]] = {"staged": [], "continuous": []}
        counts: dict[str, list[tuple[int, int, int, int]]] = {"staged": [], "continuous": []}
        same = total = 0
        joins: list[int] = []  # greedy: rows still decoding at each join
        for repeat in range(args.repeats + 1):  # the first repeat warms up
            rng = np.random.default_rng(repeat)
            batch = [p for p in task.train_problems(rng, problems_per_step) for _ in range(group)]
            groups = [g for g in range(problems_per_step) for _ in range(group)]
            greedy = {}
            for name, run in (("staged", staged), ("continuous", continuous)):
                torch.manual_seed(repeat)
                passes.clear()
                began = time.process_time()
                episodes = run(batch, groups, 1.0)
                seconds = time.process_time() - began
                lengths = [[len(t.completion.completion_ids) for t in e.turns] for e in episodes]
                tokens = sum(map(sum, lengths))
                if repeat:
                    rates[name].append(tokens / seconds)
                    counts[name].append((len(passes), max(map(sum, lengths)), sum(map(len, lengths)), tokens))
                greedy_episodes = staged(batch, groups, None) if name == "staged" else continuous(batch, groups, None, joins)
                greedy[name] = [[t.completion.completion_ids for t in e.turns] for e in greedy_episodes]
            same += sum(a == b for a, b in zip(greedy["staged"], greedy["continuous"]))
            total += len(batch)
        for name, values in rates.items():
            middle = sorted(counts[name])[len(counts[name]) // 2]
            print(f"{name:11s} {statistics.median(values):7.0f} {middle[0]:6d} {middle[1]:5d} {middle[2]:5d} {middle[3]:6d}")
        ratio = statistics.median(rates["continuous"]) / statistics.median(rates["staged"])
        print(f"continuous/staged tokens per second: {ratio:.2f}")
        running = sum(live > 0 for live in joins)
        print(
            f"greedy: continuous batching and the staged rollout decoded the same turns in {same} of {total} episodes "
            f"(prompts joined a running batch {running} times)"
        )


if __name__ == "__main__":
    main()
