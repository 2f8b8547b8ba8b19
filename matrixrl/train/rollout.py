"""Batched generation for workflows: one call per role and stage, decoded by ``decode``.

Prompts arrive as text, already in their style's final form (a chat prompt is the
rendered chat template, special tokens included), and are tokenized without adding
special tokens, so the prompt ids are exactly what the template wrote. The
tokenizer pads on the left, so every prompt of a batch ends where generation starts.

A completion's text is the decoding of exactly the tokens the trainer scores (its
``completion_ids`` without the closing EOS), special tokens included: a pad token
sampled mid-answer shows in the text the task scores, as it does in the update.

Prompts that repeat within a call (a group's rollouts of one problem, parallel
agents, evaluation samples) are encoded once: their KV cache, all but the last prompt
token, is computed per distinct prompt and copied to every row that repeats it, and
decoding continues from there. It is the same computation as encoding every row.
Distinct prompts that share a long prefix (a chat template's role instructions, a
group's problem) have it encoded once too (``prefilled_cache``): the same computation
up to rounding.

``decode`` makes the model calls transformers' ``generate`` makes and picks the same
tokens, but a row that has emitted its EOS leaves the batch, where generate would
feed it padding until the longest row ends (a workflow's later stages and
evaluations stop most rows early). ``make_generate(use_hf_generate=True)`` decodes
with generate itself: the reference the tests compare to.

Three ways to pick tokens: sampling from torch's global generator (training; each
step seeds it), greedy decoding, and *keyed* sampling (evaluation at a temperature
above 0): the Gumbel-max trick with noise hashed from (seed, call, row, position,
token). Keyed samples are a pure function of the seed and of each prompt's place in
the workflow's calls, so they do not depend on the batch size, on the order of
evaluations or on anything drawn before. (On CPU, bit for bit. On a GPU the batch's
shape picks the kernels, and their rounding can flip a close sample: there a
non-default ``eval.batch_size`` is part of the evaluation's spec, grid.eval_science.)

Training rollouts record each sampled token's log-probability (``SampledChooser``):
the update compares its own with it (the log-probability gap, update.update_policy).
A model computing in bfloat16 decodes inside one ``compute_context`` per call, so
its float32 weights are cast once per call, not once per token.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from transformers import LogitsProcessor, LogitsProcessorList
from trl.trainer.utils import entropy_from_logits

from matrixrl.models.hf import compute_context
from matrixrl.workflows.base import Completion


# splitmix64 (Steele, Lea & Flood 2014) on int64 tensors; multiplication wraps as in C.
_GOLDEN = -7046029254386353131  # 0x9e3779b97f4a7c15
_MIX1 = -4658895280553007687  # 0xbf58476d1ce4e5b9
_MIX2 = -7723592293110705685  # 0x94d049bb133111eb


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def splitmix64(x: torch.Tensor) -> torch.Tensor:
    x = x + _GOLDEN
    x = (x ^ _shift_right(x, 30)) * _MIX1
    x = (x ^ _shift_right(x, 27)) * _MIX2
    return x ^ _shift_right(x, 31)


def keyed_uniform(keys: torch.Tensor, position: int, vocab: int) -> torch.Tensor:
    """Uniform (0, 1) noise of shape (rows, vocab), a pure function of each row's key,
    the position and the token id."""
    at = splitmix64(keys ^ position)
    tokens = torch.arange(vocab, dtype=torch.int64, device=keys.device)
    bits = _shift_right(splitmix64(at[:, None] ^ tokens[None, :]), 11)  # 53 random bits
    return (bits.double() + 0.5) / float(1 << 53)


def keyed_scores(scores: torch.Tensor, keys: torch.Tensor, position: int, temperature: float) -> torch.Tensor:
    """``scores / temperature`` plus Gumbel noise keyed per row: their argmax is a sample
    from softmax(scores / temperature) (the Gumbel-max trick)."""
    noise = keyed_uniform(keys, position, scores.shape[-1])
    gumbel = -torch.log(-torch.log(noise))
    return (scores.double() / temperature + gumbel).to(scores.dtype)


class KeyedSampler(LogitsProcessor):
    """Keyed sampling as a processor of transformers' ``generate`` (which must then decode
    greedily): the reference the decoding loop is tested against."""

    def __init__(self, temperature: float, keys: torch.Tensor):
        self.temperature = temperature
        self.keys = keys
        self.position = 0

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        noised = keyed_scores(scores, self.keys, self.position, self.temperature)
        self.position += 1
        return noised


class EntropyRecorder(LogitsProcessor):
    """Records, for each generated position, the entropy of the distribution sampled from
    (transformers' ``generate``, the reference path).

    Custom processors run before generate's temperature warper, so the scores here
    are the model's logits; dividing by the temperature gives the sampling
    distribution, as the loss sees it (tests/test_policies.py checks this against a
    fresh forward pass, so a transformers release that reorders them fails there).
    """

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.steps.append(entropy_from_logits(scores.float() / self.temperature))
        return scores


# Prompts that share a prefix of at least this many tokens have it encoded once. Below
# it the saving (the prefix's tokens times the other prompts) is less than the extra
# forward call costs on CPU (a call of a few rows of tiny-s costs what ~100 token
# positions do). Compact-style prompts (tiny models) share far less (a default question is at
# most 14 tokens), so they keep the exact layout their recorded results were decoded with.
SHARED_PREFIX_MIN_TOKENS = 32


@dataclass
class Tokenized:
    """A call's prompts, each distinct one tokenized once (a group's rollouts repeat
    theirs; tokenizing every copy cost several percent of a tiny model's rollout step).

    ``distinct``: the distinct prompts' ids, in order of first appearance; ``rows``: each
    prompt's index in ``distinct``; ``distinct_ids``/``distinct_mask``: the distinct
    prompts left-padded to the longest; ``input_ids``/``attention_mask``: the batch, what
    ``tokenizer(prompts, padding=True, add_special_tokens=False)`` returns.
    """

    distinct: list[list[int]]
    rows: list[int]
    distinct_ids: torch.Tensor
    distinct_mask: torch.Tensor
    input_ids: torch.Tensor
    attention_mask: torch.Tensor


def tokenize_prompts(tokenizer, prompts: list[str]) -> Tokenized:
    """The prompts as ``Tokenized``, left-padded whatever the tokenizer's padding side."""
    index: dict[str, int] = {}
    rows = [index.setdefault(prompt, len(index)) for prompt in prompts]
    distinct = tokenizer(list(index), add_special_tokens=False)["input_ids"]
    width = max(map(len, distinct))
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(t)) + t for t in distinct], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(t)) + [1] * len(t) for t in distinct], dtype=torch.long)
    expand = torch.tensor(rows)
    return Tokenized(distinct, rows, ids, mask, ids[expand], mask[expand])


@dataclass
class Prefill:
    """A call's prompts ready to decode: ``cache`` holds every row's prompt but its last
    token; ``ids`` and ``mask`` are the rows as the cache lays them out, ending with
    that last token (a decode step reads ``ids[:, -1:]`` and the whole ``mask``)."""

    cache: object
    ids: torch.Tensor
    mask: torch.Tensor


def prefilled_cache(model, tokenizer, prompts: list[str], device, tokenized: Tokenized | None = None) -> Prefill | None:
    """The prompts' KV cache computed without repeating work, or None when there is none
    to save (every prompt distinct, no long prefix shared).

    - Prompts that repeat (a group's rollouts of one problem, parallel agents,
      evaluation samples) are encoded once and their cache copied to every row that
      repeats them, laid out as the tokenizer padded the batch: the same width and
      positions, so the same arithmetic as encoding every row.
    - Prefixes of at least ``SHARED_PREFIX_MIN_TOKENS`` tokens shared by distinct
      prompts are encoded once (``_prefix_levels``): a chat template's role
      instructions, common to the whole call, then the problem, common to a group's
      judge or aggregator prompts, then what each prompt alone holds, each level one
      forward pass attending to the level above. A row is laid out as its levels'
      segments, each left-padded to its level's width: positions count real tokens
      only and the padding is masked, so each row computes what it would alone, up
      to the rounding of differently shaped products.

    ``tokenized``: the prompts as ``tokenize_prompts`` gives them, when the caller has them already.
    """
    if tokenized is None:
        tokenized = tokenize_prompts(tokenizer, prompts)
    distinct, rows = tokenized.distinct, torch.tensor(tokenized.rows, device=device)
    if len(distinct) > 1 and max(map(len, distinct)) > SHARED_PREFIX_MIN_TOKENS:  # else nothing long to share
        levels = _prefix_levels([d[:-1] for d in distinct])
        if len(levels) > 1:
            return _encode_levels(model, levels, [d[-1] for d in distinct], rows, tokenizer.pad_token_id, device)
    if len(distinct) == len(prompts):
        return None
    from transformers import DynamicCache

    # The distinct prompts padded to the whole batch's width: the same width and positions.
    ids, mask = tokenized.distinct_ids[:, :-1].to(device), tokenized.distinct_mask[:, :-1].to(device)
    if ids.shape[1] == 0:
        return None
    cache = DynamicCache(config=model.config)
    _encode(model, ids, mask, (mask.cumsum(-1) - 1).clamp(min=0), cache)
    cache.batch_select_indices(rows)
    return Prefill(cache, tokenized.input_ids.to(device), tokenized.attention_mask.to(device))


# A level: per node, (its parent node in the level above, its segment of tokens).
Level = list[tuple[int, list[int]]]


def _prefix_levels(bodies: list[list[int]], minimum: int = SHARED_PREFIX_MIN_TOKENS) -> list[Level]:
    """``bodies`` split into levels of a prefix tree whose shared segments are at least
    ``minimum`` tokens; the last level has one node per body, in order. A single level
    means nothing is shared.

    Bodies that agree on their next ``minimum`` tokens form a node of their longest
    common prefix; the others (and what remains) go one level down, a body that
    shares nothing there taking an empty segment until its own last level.
    """
    levels: list[Level] = []
    groups = [(0, list(range(len(bodies))), 0)]  # (parent node, bodies, tokens consumed)
    while True:
        level: Level = []
        next_groups = []
        leaves = True
        for parent, members, start in groups:
            by_key: dict[tuple[int, ...], list[int]] = {}
            for m in members:
                key = tuple(bodies[m][start : start + minimum])
                by_key.setdefault(key if len(key) == minimum else (-1 - m,), []).append(m)
            for sharing in by_key.values():
                if len(sharing) > 1:
                    shared = len(os.path.commonprefix([bodies[m][start:] for m in sharing]))
                    level.append((parent, bodies[sharing[0]][start : start + shared]))
                    next_groups.append((len(level) - 1, sharing, start + shared))
                    leaves = False
                else:
                    level.append((parent, []))  # its own segment waits for the last level
                    next_groups.append((len(level) - 1, sharing, start))
        if leaves:  # nothing shared at this depth: each body's remainder, in order
            node_of = {m: node for node, (_, members, _) in enumerate(groups) for m in members}
            start_of = {m: start for _, members, start in groups for m in members}
            levels.append([(node_of[m], bodies[m][start_of[m] :]) for m in range(len(bodies))])
            return levels
        levels.append(level)
        groups = next_groups


def _encode(model, ids, mask, positions, cache) -> None:
    """Fill ``cache`` with ``ids`` (after what it holds)."""
    # logits_to_keep=1: only the cache is wanted; the logits of every position would be
    # rows x width x vocab floats (gigabytes for a real vocabulary and chat prompts).
    model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1)


def _encode_levels(model, levels: list[Level], last: list[int], rows: torch.Tensor, pad: int, device) -> Prefill:
    """The cache of the distinct prompts ``levels`` splits (their last tokens ``last`` left
    out), one forward pass per level, expanded to the batch's ``rows``."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    ids = torch.zeros((1, 0), dtype=torch.long, device=device)
    mask = torch.zeros((1, 0), dtype=torch.long, device=device)
    for level in levels:
        parents = torch.tensor([parent for parent, _ in level], device=device)
        ids, mask = ids[parents], mask[parents]
        cache.batch_select_indices(parents)
        width = max(len(segment) for _, segment in level)
        segment_ids = torch.tensor([[pad] * (width - len(t)) + t for _, t in level], dtype=torch.long, device=device)
        segment_mask = torch.tensor([[0] * (width - len(t)) + [1] * len(t) for _, t in level], dtype=torch.long, device=device)
        if width:
            positions = mask.sum(-1, keepdim=True) + (segment_mask.cumsum(-1) - 1).clamp(min=0)
            mask = torch.cat([mask, segment_mask], dim=-1)
            _encode(model, segment_ids, mask, positions, cache)
            ids = torch.cat([ids, segment_ids], dim=-1)
    cache.batch_select_indices(rows)
    last_ids = torch.tensor(last, dtype=torch.long, device=device)[:, None]
    ids, mask = torch.cat([ids, last_ids], dim=-1)[rows], torch.cat([mask, torch.ones_like(last_ids)], dim=-1)[rows]
    return Prefill(cache, ids, mask)


# --- choosing tokens -------------------------------------------------------------------
# A chooser picks the next token of the rows computed: ``choose(scores, rows, step)`` with
# their float32 logits, their indices in the batch and the step (0-based). Each row's
# choice is the one transformers' generate makes for it, whatever the other rows.


def greedy_chooser():
    return lambda scores, rows, step: scores.argmax(dim=-1)


def keyed_chooser(temperature: float, keys: torch.Tensor):
    """Keyed sampling: each row's noise depends on its key and the step only."""
    return lambda scores, rows, step: keyed_scores(scores, keys[rows], step, temperature).argmax(dim=-1)


class SampledChooser:
    """Samples from softmax(scores / temperature) with torch's global generator, drawing
    exactly what ``generate``'s ``torch.multinomial`` draws: for one sample it takes
    argmax(p / q), q ~ Exp(1), over a (batch, vocab) tensor of noise. The noise is drawn
    for the whole batch at every step, finished rows included, so the generator
    advances as it does under generate and every row gets the noise generate would give
    it: the same tokens, while finished rows are no longer computed.

    Records, per row and step, the entropy of the sampling distribution (``entropies``)
    and the log-probability of the token chosen (``logps``), both (batch, max_new_tokens).
    """

    def __init__(self, temperature: float, batch: int, max_new_tokens: int, device):
        self.temperature = temperature
        self.batch = batch
        self.entropies = torch.zeros((batch, max_new_tokens), dtype=torch.float32, device=device)
        self.logps = torch.zeros((batch, max_new_tokens), dtype=torch.float32, device=device)

    def __call__(self, scores: torch.Tensor, rows: torch.Tensor, step: int) -> torch.Tensor:
        scaled = scores / self.temperature  # exact for temperature 1, as generate skipping the warper
        self.entropies[rows, step] = entropy_from_logits(scaled)
        probs = torch.softmax(scaled, dim=-1)
        noise = torch.empty((self.batch, probs.shape[-1]), dtype=probs.dtype, device=probs.device).exponential_(1)
        chosen = (probs / noise[rows]).argmax(dim=-1)
        self.logps[rows, step] = torch.log_softmax(scaled, dim=-1).gather(-1, chosen[:, None]).squeeze(-1)
        return chosen


# Below this many rows a matrix product takes other BLAS kernels (MKL on CPU: 1-3 rows),
# whose sums round differently; a batch that shrinks keeps finished rows along up to
# this size, so that a row's logits never depend on how many others are still generating.
MIN_BATCH_ROWS = 4
# Dropping rows copies the whole cache; it waits until this share of the rows computed has finished.
COMPACT_SHARE = 1 / 8


@torch.no_grad()
def decode(model, input_ids, attention_mask, cache, *, max_new_tokens: int, eos: int, pad: int, choose) -> list[list[int]]:
    """Each row's generated tokens (up to and including its EOS, at most
    ``max_new_tokens``), from left-padded prompts and, optionally, a ``cache`` of all
    but their last token (``prefilled_cache``).

    The calls to the model are the ones ``generate`` makes (the same inputs, positions,
    mask, logits of the last position in float32; no mask when nothing is padded, as
    generate drops an all-ones mask), with one difference: rows that have emitted
    their EOS leave the batch and their cache rows are dropped, instead of being fed
    padding to the end of the call (once ``COMPACT_SHARE`` of the batch has finished,
    and down to ``MIN_BATCH_ROWS`` rows, below which finished rows ride along). The
    remaining rows' logits are bit for bit those generate computes (on this project's
    CPUs: the default grid's training and evaluation results reproduce exactly).

    The cache is transformers' ``DynamicCache``: it follows the batch as rows leave
    (``batch_select_indices``) and grows by one position per step. A ``StaticCache``
    (preallocated, for ``torch.compile`` and CUDA graphs) fixes the batch size and the
    length at allocation: rows could not leave, and every call, whose batch and prompt
    width differ from the last one's, would be a new shape to compile for
    (bench/gpu.py times transformers' generate with it, to check the choice on a GPU).
    """
    from transformers import DynamicCache

    batch = input_ids.shape[0]
    device = input_ids.device
    floor = min(batch, MIN_BATCH_ROWS)
    padded = not bool(attention_mask.all())
    mask = attention_mask
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    if cache is None:
        cache = DynamicCache(config=model.config)
        inputs = input_ids
    else:  # the cache holds all but the last prompt token
        inputs, positions = input_ids[:, -1:], positions[:, -1:]
    rows = torch.arange(batch, device=device)  # the batch rows being computed
    live = torch.ones(batch, dtype=torch.bool, device=device)  # ... and which of them still generate
    tokens = torch.zeros((batch, max_new_tokens), dtype=torch.long, device=device)
    lengths = torch.full((batch,), max_new_tokens, dtype=torch.long, device=device)
    for step in range(max_new_tokens):
        attention = None
        if padded:
            # One query token: the boolean mask generate's 2D mask becomes. As a 2D mask, once
            # the padded rows have left, transformers would drop it (nothing masked) and SDPA
            # would take its unmasked path, which rounds differently.
            attention = mask.bool()[:, None, None, :] if inputs.shape[1] == 1 else mask
        logits = model(
            input_ids=inputs,
            attention_mask=attention,
            position_ids=positions,
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits
        # Rows riding along are chosen for too (each row's choice is its own); only live ones count.
        chosen = choose(logits[:, -1].to(dtype=torch.float32), rows, step)
        tokens[rows, step] = chosen
        ended = live & (chosen == eos)
        lengths[rows] = torch.where(ended, step + 1, lengths[rows])
        live &= ~ended
        going = int(live.sum())  # the step's one wait for the device
        if step + 1 == max_new_tokens or going == 0:
            break
        computed = rows.shape[0]
        if computed - max(going, floor) >= max(1, computed * COMPACT_SHARE):
            keep = live.nonzero().squeeze(1)
            if going < floor:  # the first finished rows ride along
                keep = torch.cat([keep, (~live).nonzero().squeeze(1)[: floor - going]]).sort().values
            rows, live, chosen, positions, mask = rows[keep], live[keep], chosen[keep], positions[keep], mask[keep]
            cache.batch_select_indices(keep)
        inputs = torch.where(live, chosen, pad)[:, None]  # finished rows are fed padding, as by generate
        positions = positions[:, -1:] + 1
        if padded:
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=-1)
    return [row[:n] for row, n in zip(tokens.tolist(), lengths.tolist())]


def make_generate(
    policy,
    tokenizer,
    *,
    max_new_tokens: int,
    temperature: float,
    sample: bool,
    batch_size: int = 1 << 30,
    seed: int | None = None,
    use_hf_generate: bool = False,
):
    """A ``Generate`` callable over ``policy``.

    ``sample``: draws at ``temperature`` from torch's generator and records each
    token's entropy (training), or, with ``seed``, keyed sampling (evaluation; see the
    module docstring). Otherwise greedy decoding. ``use_hf_generate``: decode with
    transformers' ``generate`` instead of ``decode`` (the same tokens, slower: the
    reference that tests and bench/rollout.py compare to).
    """
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id
    keyed = sample and seed is not None
    calls = 0

    @torch.no_grad()
    def generate(role: str, prompts: list[str]) -> list[Completion]:
        model = policy.model_for(role)
        with compute_context(model):  # a 16-bit model casts its float32 weights once per call
            return _generate(model, prompts)

    def _generate(model, prompts: list[str]) -> list[Completion]:
        nonlocal calls
        device = next(model.parameters()).device
        if keyed:  # each call's rows get keys of their own
            call_key = splitmix64(splitmix64(torch.tensor([seed], dtype=torch.int64)) ^ calls)
        calls += 1
        out: list[Completion] = []
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start : start + batch_size]
            tokenized = tokenize_prompts(tokenizer, chunk)
            ids, mask = tokenized.input_ids.to(device), tokenized.attention_mask.to(device)
            keys = None
            if keyed:
                rows = torch.arange(start, start + len(chunk), dtype=torch.int64)  # places in this call
                keys = splitmix64(call_key ^ rows).to(device)
            prefill = prefilled_cache(model, tokenizer, chunk, device, tokenized)
            cache = prefill.cache if prefill else None
            if prefill:  # the rows as the cache lays them out
                ids, mask = prefill.ids, prefill.mask
            logps = None
            if use_hf_generate:
                generated, entropies = _hf_generate(model, ids, mask, cache, max_new_tokens, temperature, sample, keys, pad, eos)
            else:
                if keyed:
                    choose = keyed_chooser(temperature, keys)
                elif sample:
                    choose = SampledChooser(temperature, len(chunk), max_new_tokens, device)
                else:
                    choose = greedy_chooser()
                generated = decode(model, ids, mask, cache, max_new_tokens=max_new_tokens, eos=eos, pad=pad, choose=choose)
                if isinstance(choose, SampledChooser):
                    entropies, logps = choose.entropies.tolist(), choose.logps.tolist()
                else:
                    entropies = None
            completions = [_up_to_eos(seq, eos) for seq in generated]
            answers = [tuple(c[:-1]) if c[-1:] == [eos] else tuple(c) for c in completions]
            distinct = list(dict.fromkeys(answers))  # a group's answers often agree: each decoded once
            text_of = dict(zip(distinct, tokenizer.batch_decode([list(a) for a in distinct], skip_special_tokens=False)))
            for i, (row, completion_ids, answer) in enumerate(zip(tokenized.rows, completions, answers)):
                out.append(
                    Completion(
                        text=text_of[answer],
                        prompt_ids=list(tokenized.distinct[row]),
                        completion_ids=completion_ids,
                        entropy_sum=sum(entropies[i][: len(completion_ids)]) if entropies else 0.0,
                        sampled_logps=logps[i][: len(completion_ids)] if logps else None,
                    )
                )
        return out

    return generate


def _up_to_eos(seq: list[int], eos: int) -> list[int]:
    """The tokens up to and including the first EOS: it is part of the action. What follows
    (generate's padding) is not. A pad token sampled before the EOS stays: the later
    tokens were sampled in its presence, and the update must score them in the same context."""
    return seq[: seq.index(eos) + 1] if eos in seq else seq


def _hf_generate(model, ids, mask, cache, max_new_tokens, temperature, sample, keys, pad, eos):
    """(generated tokens per row, entropies per row or None) from transformers' ``generate``."""
    recorder = None
    if keys is not None:
        processor = KeyedSampler(temperature, keys)
        kwargs = dict(do_sample=False)  # argmax of the noised scores
    elif sample:
        processor = recorder = EntropyRecorder(temperature)
        kwargs = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
    else:
        processor, kwargs = None, dict(do_sample=False)
    sequences = model.generate(
        input_ids=ids,
        attention_mask=mask,
        cache=cache,
        max_new_tokens=max_new_tokens,
        pad_token_id=pad,
        eos_token_id=eos,
        logits_processor=LogitsProcessorList([processor]) if processor else None,
        **kwargs,
    )
    generated = sequences[:, ids.shape[1] :].tolist()
    entropies = torch.stack(recorder.steps, dim=1).tolist() if recorder else None
    return generated, entropies
