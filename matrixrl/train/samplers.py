"""How a decoding step picks tokens: sampled, greedy, or keyed (Gumbel-max over hashed noise).

Keyed samples do not depend on the batch: docs/real-models.md, "What is exact where".
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor
from trl.trainer.utils import entropy_from_logits


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

    Custom processors run before generate's temperature warper: the scores are the model's
    logits, divided here by the temperature (tests/test_policies.py checks the order).
    """

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.steps.append(entropy_from_logits(scores.float() / self.temperature))
        return scores


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
    """Samples from softmax(scores / temperature) with torch's global generator, drawing exactly
    what ``generate``'s ``torch.multinomial`` draws (argmax(p / q), q ~ Exp(1)), noise for the whole
    batch at every step, finished rows included. Records per row and step the entropy
    (``entropies``) and the chosen token's log-probability (``logps``), (batch, max_new_tokens).
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
