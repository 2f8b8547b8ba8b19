"""Batched generation for workflows: one ``generate`` call per role and stage.

Prompts arrive as text, already in their style's final form (a chat prompt is the
rendered chat template, special tokens included), and are tokenized without adding
special tokens, so the prompt ids are exactly what the template wrote. The
tokenizer pads on the left, so every prompt of a batch ends where generation starts.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor, LogitsProcessorList
from trl.trainer.utils import entropy_from_logits

from matrixrl.workflows.base import Completion


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


def make_generate(policy, tokenizer, *, max_new_tokens: int, temperature: float, sample: bool, batch_size: int = 1 << 30):
    """A ``Generate`` callable over ``policy``: samples (training) or decodes greedily (evaluation)."""
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id

    @torch.no_grad()
    def generate(role: str, prompts: list[str]) -> list[Completion]:
        model = policy.model_for(role)
        device = next(model.parameters()).device
        out: list[Completion] = []
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start : start + batch_size]
            enc = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
            recorder = EntropyRecorder(temperature) if sample else None
            kwargs = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if sample else dict(do_sample=False)
            sequences = model.generate(
                input_ids=enc["input_ids"].to(device),
                attention_mask=enc["attention_mask"].to(device),
                max_new_tokens=max_new_tokens,
                pad_token_id=pad,
                eos_token_id=eos,
                logits_processor=LogitsProcessorList([recorder]) if recorder else None,
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
                out.append(
                    Completion(
                        text=tokenizer.decode(seq[:end], skip_special_tokens=True),
                        prompt_ids=row[mask.bool()].tolist(),
                        completion_ids=seq[:end],
                        entropy_sum=sum(entropies[i][:end]) if entropies else 0.0,
                    )
                )
        return out

    return generate
