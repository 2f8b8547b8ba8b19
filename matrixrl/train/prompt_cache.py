"""A call's prompts tokenized once, their KV cache computed once per repeated prompt and prefix."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from matrixrl.models.versions import check_kv_cache_kept

# Prompts that share a prefix of at least this many tokens have it encoded once; why 32:
# docs/architecture.md, "Shared prefixes".
SHARED_PREFIX_MIN_TOKENS = 32


@dataclass
class Tokenized:
    """A call's prompts, each distinct one tokenized once; ``rows`` maps each prompt to its distinct one."""

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
    """The prompts' KV cache computed without repeating work, or None when there is none to save.

    docs/architecture.md, "Shared prefixes".
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
    """``bodies`` split into levels of a prefix tree whose shared segments are at least ``minimum`` tokens."""
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
    kept = cache.get_seq_length() + ids.shape[1]
    model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1)
    check_kv_cache_kept(cache, kept)


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
