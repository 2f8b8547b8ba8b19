"""What a GRPO step's loss is computed from: packed turns and their log-probabilities."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from trl.trainer.utils import pad, selective_log_softmax

from matrixrl.train.attention import differentiable_attention
from matrixrl.workflows.base import Turn


@dataclass
class TurnBatch:
    """Turns packed as [left-padded prompt | right-padded completion]."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    advantages: torch.Tensor
    # Each completion token's log-probability when the rollout sampled it (0 on padding);
    # None unless every turn has them (Completion.sampled_logps).
    sampled_logps: torch.Tensor | None = None

    @classmethod
    def from_turns(cls, turns: list[Turn], pad_token_id: int) -> "TurnBatch":
        prompts = [torch.tensor(t.completion.prompt_ids) for t in turns]
        completions = [torch.tensor(t.completion.completion_ids or [pad_token_id]) for t in turns]
        prompt_ids = pad(prompts, padding_value=pad_token_id, padding_side="left")
        prompt_mask = pad([torch.ones_like(p) for p in prompts], padding_side="left")
        completion_ids = pad(completions, padding_value=pad_token_id, padding_side="right")
        completion_mask = pad(
            [torch.ones(len(t.completion.completion_ids), dtype=torch.long) for t in turns],
            padding_side="right",
        )
        if completion_mask.shape[1] < completion_ids.shape[1]:  # every completion empty
            completion_mask = torch.zeros_like(completion_ids)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        return cls(
            input_ids=torch.cat([prompt_ids, completion_ids], dim=1),
            attention_mask=attention_mask,
            # Positions count real tokens only, as generate() numbered them.
            position_ids=(attention_mask.cumsum(-1) - 1).clamp(min=0),
            completion_ids=completion_ids,
            completion_mask=completion_mask.float(),
            advantages=torch.tensor([t.advantage for t in turns], dtype=torch.float32),
            sampled_logps=_padded_logps(turns, completion_ids.shape[1]),
        )

    def to(self, device) -> "TurnBatch":
        """The same batch on ``device`` (the policy's GPU); a no-op on CPU."""
        return TurnBatch(**{
            name: None if getattr(self, name) is None else getattr(self, name).to(device)
            for name in self.__dataclass_fields__
        })  # fmt: skip


def _padded_logps(turns: list[Turn], width: int) -> torch.Tensor | None:
    """The turns' sampled log-probabilities, right-padded with 0 to ``width`` (None if any turn lacks them)."""
    found = [t.completion.sampled_logps for t in turns]
    if any(logps is None for logps in found):
        return None
    return torch.tensor([list(logps) + [0.0] * (width - len(logps)) for logps in found], dtype=torch.float32)


# The update leaves out the logits of prompt positions (``logits_to_keep``) once they would be
# this many floats: every chat batch at a real vocabulary, no tiny model's (docs/performance.md,
# "The update's logits at a real vocabulary").
PROMPT_LOGITS_LEFT_OUT_FROM = 1 << 22


def completion_logps(model, batch: TurnBatch, temperature: float) -> torch.Tensor:
    """Per-token log-probabilities of the completion tokens, in float32 (their entropies are
    recorded while sampling: samplers.EntropyRecorder); see PROMPT_LOGITS_LEFT_OUT_FROM.

    The logits are taken to float32 before the log-softmax (docs/real-models.md, "Precision"), and
    the forward pass leaves cuDNN's attention out on CUDA (matrixrl.train.attention)."""
    rows, length = batch.input_ids.shape
    width = batch.completion_ids.shape[1]
    prompt_logits = rows * (length - width - 1) * model.config.vocab_size
    with differentiable_attention(batch.input_ids.device):
        logits = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            logits_to_keep=width + 1 if prompt_logits >= PROMPT_LOGITS_LEFT_OUT_FROM else 0,  # 0: every position
        ).logits
    logits = logits[:, -width - 1 : -1, :].float() / temperature  # .float(): a no-op in float32
    return selective_log_softmax(logits, batch.completion_ids)
