"""Batched generation for workflows: one ``generate`` call per role and stage.

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
generate continues from there. It is the same computation as encoding every row.

Three ways to pick tokens: sampling from torch's global generator (training; each
step seeds it), greedy decoding, and *keyed* sampling (evaluation at a temperature
above 0): the Gumbel-max trick with noise hashed from (seed, call, row, position,
token). Keyed samples are a pure function of the seed and of each prompt's place in
the workflow's calls, so they do not depend on the batch size, on other threads
(evaluations run as threads of one process) or on anything drawn before.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor, LogitsProcessorList
from trl.trainer.utils import entropy_from_logits

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


class KeyedSampler(LogitsProcessor):
    """Samples from softmax(logits / temperature) by the Gumbel-max trick, with noise keyed
    per row (see the module docstring); generate must decode greedily (argmax)."""

    def __init__(self, temperature: float, keys: torch.Tensor):
        self.temperature = temperature
        self.keys = keys
        self.position = 0

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        noise = keyed_uniform(self.keys, self.position, scores.shape[-1])
        self.position += 1
        gumbel = -torch.log(-torch.log(noise))
        return (scores.double() / self.temperature + gumbel).to(scores.dtype)


class EntropyRecorder(LogitsProcessor):
    """Records, for each generated position, the entropy of the distribution sampled from.

    Custom processors run before generate's temperature warper, so the scores here
    are the model's logits; dividing by the temperature gives the sampling
    distribution, as the loss sees it (tests/test_policies.py checks this against a
    fresh forward pass, so a transformers release that reorders them fails there). Recording entropy while sampling spares the
    update a forward pass over turns it would otherwise skip (zero advantage).
    """

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.steps.append(entropy_from_logits(scores.float() / self.temperature))
        return scores


def prefilled_cache(model, tokenizer, prompts: list[str], device):
    """A KV cache of ``prompts`` without their last token, computed once per distinct
    prompt, one row per prompt; None when no prompt repeats (nothing to share)."""
    distinct = list(dict.fromkeys(prompts))
    if len(distinct) == len(prompts):
        return None
    from transformers import DynamicCache

    # The same prompts as the whole batch, so the same padded width and positions.
    enc = tokenizer(distinct, return_tensors="pt", padding=True, add_special_tokens=False)
    ids, mask = enc["input_ids"][:, :-1].to(device), enc["attention_mask"][:, :-1].to(device)
    if ids.shape[1] == 0:
        return None
    cache = DynamicCache()
    model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0), cache=cache, use_cache=True)
    row_of = {prompt: i for i, prompt in enumerate(distinct)}
    cache.batch_select_indices(torch.tensor([row_of[p] for p in prompts], device=device))
    return cache


def make_generate(
    policy,
    tokenizer,
    *,
    max_new_tokens: int,
    temperature: float,
    sample: bool,
    batch_size: int = 1 << 30,
    seed: int | None = None,
):
    """A ``Generate`` callable over ``policy``.

    ``sample``: draws at ``temperature`` from torch's generator and records each
    token's entropy (training), or, with ``seed``, keyed sampling (evaluation; see the
    module docstring). Otherwise greedy decoding.
    """
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id
    keyed = sample and seed is not None
    calls = 0

    @torch.no_grad()
    def generate(role: str, prompts: list[str]) -> list[Completion]:
        nonlocal calls
        model = policy.model_for(role)
        device = next(model.parameters()).device
        if keyed:  # each call's rows get keys of their own
            call_key = splitmix64(splitmix64(torch.tensor([seed], dtype=torch.int64)) ^ calls)
        calls += 1
        out: list[Completion] = []
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start : start + batch_size]
            enc = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
            recorder = None
            if keyed:
                rows = torch.arange(start, start + len(chunk), dtype=torch.int64)  # places in this call
                processor = KeyedSampler(temperature, splitmix64(call_key ^ rows).to(device))
                kwargs = dict(do_sample=False)  # argmax of the noised scores
            elif sample:
                processor = recorder = EntropyRecorder(temperature)
                kwargs = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
            else:
                processor, kwargs = None, dict(do_sample=False)
            sequences = model.generate(
                input_ids=enc["input_ids"].to(device),
                attention_mask=enc["attention_mask"].to(device),
                cache=prefilled_cache(model, tokenizer, chunk, device),
                max_new_tokens=max_new_tokens,
                pad_token_id=pad,
                eos_token_id=eos,
                logits_processor=LogitsProcessorList([processor]) if processor else None,
                **kwargs,
            )
            width = enc["input_ids"].shape[1]
            generated = sequences[:, width:].tolist()
            entropies = torch.stack(recorder.steps, dim=1).tolist() if recorder else None
            for i, (row, mask, seq) in enumerate(zip(enc["input_ids"], enc["attention_mask"], generated)):
                # Keep tokens up to and including the first EOS: it is part of the action.
                # What follows is generate's padding. A pad token sampled before the EOS
                # stays: the later tokens were sampled in its presence, and the update
                # must score them in the same context.
                end = seq.index(eos) + 1 if eos in seq else len(seq)
                answered = seq[: end - 1] if seq[end - 1 : end] == [eos] else seq[:end]
                out.append(
                    Completion(
                        text=tokenizer.decode(answered, skip_special_tokens=False),
                        prompt_ids=row[mask.bool()].tolist(),
                        completion_ids=seq[:end],
                        entropy_sum=sum(entropies[i][:end]) if entropies else 0.0,
                    )
                )
        return out

    return generate
