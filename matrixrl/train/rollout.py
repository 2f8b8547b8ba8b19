"""Batched generation for workflows: one ``generate`` call per role and stage.

Prompts arrive as text, already in their style's final form (a chat prompt is the
rendered chat template, special tokens included), and are tokenized without adding
special tokens, so the prompt ids are exactly what the template wrote. The
tokenizer pads on the left, so every prompt of a batch ends where generation starts.
"""

from __future__ import annotations

import torch

from matrixrl.workflows.base import Completion


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
            kwargs = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if sample else dict(do_sample=False)
            sequences = model.generate(
                input_ids=enc["input_ids"].to(device),
                attention_mask=enc["attention_mask"].to(device),
                max_new_tokens=max_new_tokens,
                pad_token_id=pad,
                eos_token_id=eos,
                **kwargs,
            )
            width = enc["input_ids"].shape[1]
            for row, mask, seq in zip(enc["input_ids"], enc["attention_mask"], sequences[:, width:].tolist()):
                # Keep tokens up to and including the first EOS: it is part of the action.
                # (Chat tokenizers often pad with their EOS token: that one stays.)
                ids = seq[: seq.index(eos) + 1] if eos in seq else seq
                ids = [t for t in ids if t != pad or t == eos]
                out.append(
                    Completion(
                        text=tokenizer.decode(ids, skip_special_tokens=True),
                        prompt_ids=row[mask.bool()].tolist(),
                        completion_ids=ids,
                    )
                )
        return out

    return generate
