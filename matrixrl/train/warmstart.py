"""Supervised warm-start: teach a freshly built tiny model the task and the role formats, to partial accuracy."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch


def encode_pairs(tokenizer, pairs: Sequence[tuple[str, str]], max_length: int):
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` (prompt and padding masked)."""
    rows, labels = [], []
    for prompt, completion in pairs:
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        c = tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        ids = (p + c)[:max_length]
        rows.append(ids)
        labels.append(([-100] * len(p) + c)[:max_length])
    width = max(map(len, rows))
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    target = torch.tensor([l + [-100] * (width - len(l)) for l in labels])
    return input_ids, mask, target


def warm_start(
    model,
    tokenizer,
    sample_pairs: Callable[[np.random.Generator, int], list[tuple[str, str]]],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    max_length: int,
    log: Callable[[int, float], None] = lambda step, loss: None,
) -> float:
    """Train ``model`` in place; returns the mean loss of the last tenth of the steps."""
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * s / steps)),
    )
    model.train()
    tail: list[float] = []
    for step in range(steps):
        input_ids, mask, labels = encode_pairs(tokenizer, sample_pairs(rng, batch_size), max_length)
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step >= steps - max(1, steps // 10):
            tail.append(loss.item())
        log(step, loss.item())
    model.eval()
    return float(np.mean(tail))
