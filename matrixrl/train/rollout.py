"""Batched generation for workflows: one call per role and stage, decoded by ``decode``.

docs/architecture.md, "Rollouts".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import LogitsProcessorList

from matrixrl.models.hf import compute_context
from matrixrl.models.versions import check_kv_cache_kept, require
from matrixrl.train import prompt_cache
from matrixrl.train.prompt_cache import tokenize_prompts
from matrixrl.train.samplers import EntropyRecorder, KeyedSampler, SampledChooser, greedy_chooser, keyed_chooser, splitmix64
from matrixrl.workflows.base import Completion


# Below this many rows a matrix product takes other BLAS kernels (MKL on CPU: 1-3 rows),
# whose sums round differently; a batch that shrinks keeps finished rows along up to
# this size, so that a row's logits never depend on how many others are still generating.
MIN_BATCH_ROWS = 4
# Dropping rows copies the whole cache; it waits until this share of the rows computed has finished.
COMPACT_SHARE = 1 / 8

# A CUDA device's own: the smallest worst loss on paper (docs/performance.md, "Decode compaction on a GPU").
COMPACT_SHARE_GPU = 1 / 16
MIN_BATCH_ROWS_GPU = 4


@dataclass(frozen=True)
class Compaction:
    """When ``decode`` drops finished rows: once ``share`` of the rows computed have finished,
    keeping ``floor`` rows (finished ones ride along below it)."""

    device: str
    share: float
    floor: int


CPU_COMPACTION = Compaction("cpu", COMPACT_SHARE, MIN_BATCH_ROWS)
GPU_COMPACTION = Compaction("cuda", COMPACT_SHARE_GPU, MIN_BATCH_ROWS_GPU)


def compaction_for(device) -> Compaction:
    """The compaction thresholds of ``device``: a CUDA device's (``GPU_COMPACTION``), else the
    CPU's, which every CPU result was computed with (``CPU_COMPACTION``)."""
    return GPU_COMPACTION if torch.device(device).type == "cuda" else CPU_COMPACTION


@torch.no_grad()
def decode(model, input_ids, attention_mask, cache, *, max_new_tokens: int, eos: int, pad: int, choose) -> list[list[int]]:
    """Each row's generated tokens (through its EOS, at most ``max_new_tokens``): ``generate``'s bit for bit.

    docs/architecture.md, "Rollouts".
    """
    from transformers import DynamicCache

    batch = input_ids.shape[0]
    device = input_ids.device
    compaction = compaction_for(device)
    floor = min(batch, compaction.floor)
    padded = not bool(attention_mask.all())
    mask = attention_mask
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    if cache is None:
        cache = DynamicCache(config=model.config)
        inputs = input_ids
    else:  # the cache holds all but the last prompt token
        inputs, positions = input_ids[:, -1:], positions[:, -1:]
    first_kept = cache.get_seq_length() + inputs.shape[1]  # what the cache must hold after the first pass
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
        if step == 0:
            check_kv_cache_kept(cache, first_kept)
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
        if computed - max(going, floor) >= max(1, computed * compaction.share):
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
    engine: bool | None = None,
    lora: str = "merged",
    log=print,
):
    """A ``Generate`` callable over ``policy``: sampled (training), keyed with ``seed`` (evaluation) or
    greedy.

    ``engine`` decodes with :mod:`matrixrl.train.engine` (default on CUDA), ``use_hf_generate`` with
    transformers.
    """
    require("transformers")  # an older one would drop the KV cache without a word
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id
    keyed = sample and seed is not None
    calls = 0
    engines: dict[str, object] = {}  # the engine, made at the first call on its device

    @torch.no_grad()
    def generate(role: str, prompts: list[str]) -> list[Completion]:
        model = policy.model_for(role)
        with compute_context(model):  # a 16-bit model casts its float32 weights once per call
            return _generate(model, prompts)

    def _generate(model, prompts: list[str]) -> list[Completion]:
        nonlocal calls
        device = next(model.parameters()).device
        decoder = None
        if not use_hf_generate and (engine if engine is not None else device.type == "cuda"):
            from matrixrl.models.hf import COMPUTE_DTYPE
            from matrixrl.train.engine import Engine

            decoder = engines.setdefault("engine", Engine(lora=lora, log=log))
            if not decoder.load(model, getattr(torch, getattr(model, COMPUTE_DTYPE, "float32"))):
                decoder = None
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
            prefill = prompt_cache.prefilled_cache(model, tokenizer, chunk, device, tokenized)
            cache = prefill.cache if prefill else None
            if prefill:  # the rows as the cache lays them out
                ids, mask = prefill.ids, prefill.mask
            logps = None
            decoded = None
            if decoder is not None:
                sampler = _engine_sampler(keyed, sample, temperature, keys)
                decoded = decoder.decode(model, ids, mask, cache, max_new_tokens=max_new_tokens, eos=eos, pad=pad, sampler=sampler)
                if decoded is None and prefill:  # the engine released the prefilled cache as it copied it
                    cache = prompt_cache.prefilled_cache(model, tokenizer, chunk, device, tokenized).cache
            if decoded is not None:
                generated, entropies, logps = decoded.tokens, decoded.entropies, decoded.logps
            elif use_hf_generate:
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


def _engine_sampler(keyed: bool, sample: bool, temperature: float, keys):
    from matrixrl.train.engine import Sampler

    if keyed:
        return Sampler("keyed", temperature, keys)
    return Sampler("training" if sample else "greedy", temperature)


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
