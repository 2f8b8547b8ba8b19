"""The policy losses of a GRPO step, one function each, registered by name in ``LOSSES``.

``train.loss_type`` picks one; every value of TRL 1.16's ``GRPOConfig.loss_type`` is
here under TRL's name, computing what TRL's ``GRPOTrainer._compute_loss`` computes
(tests/test_losses.py checks each against TRL's own trainer, gradients included).
A loss is two things: its per-token term (a clipped, capped, soft-gated or
gamma-weighted importance ratio times the advantage) and its normaliser (what the
sum over the tokens is divided by). ``train.importance_sampling_level`` chooses the
ratio: per token, or one per turn from the mean of its tokens' log-ratios (GSPO).

What a normaliser counts in a multi-agent step (docs/design.md §2, "Losses"): every
count is over the whole step, never over a micro-batch, so the update splits a step
into micro-batches (per agent, per ``micro_batch_tokens``) whose losses add up to
the step's loss. A "sequence" is one turn (one role call's completion): an episode
of several turns contributes each as a row, as TRL's batch holds one completion
per row. Every loss but ``bnpo`` counts the whole step, every parameter set's
turns (TRL's global batch); ``bnpo`` counts the turns of the parameter set being
updated (TRL's local batch: the same as ``dapo`` under a shared policy, one role's
turns under an isolated one). Turns whose advantage is 0 count too, as in TRL's
batch, though the update skips their forward pass (they add 0 to every sum).

Which (loss, level) pairs are refused, and why, is the schema's ``loss_problem``
(matrixrl.config.schema, with the loss settings). Adding a loss: one function of the
signature below, its line in ``LOSSES``, its name in the schema's ``LOSS_TYPES`` (the
config layer lists the names without importing torch; importing this module checks
that the two agree) and its parameters as ``train:`` fields (docs/extending.md,
"Adding a loss").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from matrixrl.config.schema import LOSS_TYPES


@dataclass(frozen=True)
class StepCounts:
    """What a loss divides by, counted over the whole step (see the module docstring)."""

    tokens: int  # completion tokens of every turn of the step
    turns: int  # turns of the step
    set_tokens: int  # completion tokens of the turns that the parameter set being updated receives
    max_completion_length: int  # train.max_new_tokens: the longest completion a turn can have (Dr. GRPO's constant)


Loss = Callable[..., tuple[torch.Tensor, torch.Tensor]]
"""``(logps, old_logps, advantages, mask, cfg, counts) -> (loss, clipped tokens)``: the
loss of a micro-batch's turns (rows), such that the micro-batches of a step add up
to the step's loss, and how many of its completion tokens a clip or cap acted on.
``cfg`` is the ``train:`` settings (TRL's parameter names)."""


def log_importance_weights(logps: torch.Tensor, old_logps: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """log π_θ/π_old per token ([rows, tokens]), or at ``sequence`` level the mean over each
    turn's tokens ([rows, 1]: GSPO's length-normalised sequence ratio)."""
    log_ratio = logps - old_logps
    if level == "token":
        return log_ratio
    return ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)


def _clipped(logps, old_logps, advantages, mask, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate −min(w·A, clip(w, 1 − ε_low, 1 + ε_high)·A) and where the clip acted."""
    ratio = torch.exp(log_importance_weights(logps, old_logps, mask, cfg.importance_sampling_level))
    clipped_ratio = torch.clamp(ratio, 1 - cfg.epsilon_low, 1 + cfg.epsilon_high)
    adv = advantages.unsqueeze(1)
    per_token = -torch.min(ratio * adv, clipped_ratio * adv)
    is_clipped = ((ratio < 1 - cfg.epsilon_low) & (adv < 0)) | ((ratio > 1 + cfg.epsilon_high) & (adv > 0))
    return per_token, is_clipped


def _clipped_tokens(is_clipped: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (is_clipped.float() * mask).sum()


def _turn_means(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each turn's mean over its own tokens (a turn without tokens: 0)."""
    return (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


def dapo(logps, old_logps, advantages, mask, cfg, counts: StepCounts):
    """Clipped surrogate, summed over tokens, divided by the step's tokens (DAPO's token-mean;
    matrixrl's loss before loss_type existed, and its default)."""
    per_token, is_clipped = _clipped(logps, old_logps, advantages, mask, cfg)
    return (per_token * mask).sum() / max(counts.tokens, 1.0), _clipped_tokens(is_clipped, mask)


def grpo(logps, old_logps, advantages, mask, cfg, counts: StepCounts):
    """Clipped surrogate, each turn's token-mean, averaged over the step's turns (every turn
    weighs the same whatever its length; GSPO at sequence level)."""
    per_token, is_clipped = _clipped(logps, old_logps, advantages, mask, cfg)
    return _turn_means(per_token, mask).sum() / max(counts.turns, 1), _clipped_tokens(is_clipped, mask)


def bnpo(logps, old_logps, advantages, mask, cfg, counts: StepCounts):
    """Clipped surrogate, summed over tokens, divided by the tokens of the parameter set's turns."""
    per_token, is_clipped = _clipped(logps, old_logps, advantages, mask, cfg)
    return (per_token * mask).sum() / max(counts.set_tokens, 1.0), _clipped_tokens(is_clipped, mask)


def dr_grpo(logps, old_logps, advantages, mask, cfg, counts: StepCounts):
    """Clipped surrogate, summed over tokens, divided by a constant: the step's turns × the
    longest completion a turn can have (Dr. GRPO: no length bias, no per-step token count)."""
    per_token, is_clipped = _clipped(logps, old_logps, advantages, mask, cfg)
    constant = counts.turns * counts.max_completion_length
    return (per_token * mask).sum() / max(constant, 1), _clipped_tokens(is_clipped, mask)


def luspo(logps, old_logps, advantages, mask, cfg, counts: StepCounts):
    """Clipped surrogate of a sequence ratio, summed over each turn's tokens (its loss scaled by
    its length), averaged over the step's turns (LUSPO)."""
    per_token, is_clipped = _clipped(logps, old_logps, advantages, mask, cfg)
    return (per_token * mask).sum(-1).sum() / max(counts.turns, 1), _clipped_tokens(is_clipped, mask)


def cispo(logps, old_logps, advantages, mask, cfg, counts: StepCounts):
    """−sg(min(w, ε_high))·A·log π_θ: the importance weight capped at ``epsilon_high`` and
    detached, so a capped token still has a gradient (MiniMax-M1); token-mean over the step."""
    ratio = torch.exp(log_importance_weights(logps, old_logps, mask, cfg.importance_sampling_level))
    adv = advantages.unsqueeze(1)
    per_token = -torch.clamp(ratio, max=cfg.epsilon_high).detach() * adv * logps
    is_capped = (ratio > cfg.epsilon_high) & (adv > 0)
    return (per_token * mask).sum() / max(counts.tokens, 1.0), _clipped_tokens(is_capped, mask)


def sapo(logps, old_logps, advantages, mask, cfg, counts: StepCounts):
    """A soft gate instead of a clip: −σ(τ(w − 1))·4/τ·A, τ by the advantage's sign
    (``sapo_temperature_pos`` above 0, ``sapo_temperature_neg`` otherwise); each turn's
    token-mean, averaged over the step's turns (SAPO). Nothing is clipped."""
    ratio = torch.exp(log_importance_weights(logps, old_logps, mask, cfg.importance_sampling_level))
    adv = advantages.unsqueeze(1)
    temperatures = torch.where(adv > 0, cfg.sapo_temperature_pos, cfg.sapo_temperature_neg)
    per_token = -(torch.sigmoid(temperatures * (ratio - 1)) * 4 / temperatures) * adv
    return _turn_means(per_token, mask).sum() / max(counts.turns, 1), torch.zeros(())


@torch.no_grad()
def vespo_weights(advantages, log_ratio, mask, cfg) -> torch.Tensor:
    """VESPO's φ(w) = e^λ · w^k · e^(−λw) of each turn's sequence ratio w = exp Σ log-ratios
    (φ(1) = 1), k and λ by the advantage's sign; a weight, not differentiated ([rows, 1])."""
    lowest = math.log(1e-8)
    sequence_log_ratio = (torch.clamp(log_ratio, -20.0, 20.0) * mask).sum(-1, keepdim=True)
    log_w = torch.clamp(sequence_log_ratio, lowest, 20.0)
    non_negative = advantages.unsqueeze(1) >= 0
    k = torch.where(non_negative, cfg.vespo_k_pos, cfg.vespo_k_neg)
    lam = torch.where(non_negative, cfg.vespo_lambda_pos, cfg.vespo_lambda_neg).clamp(min=1e-4)
    return torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def vespo(logps, old_logps, advantages, mask, cfg, counts: StepCounts):
    """−φ(w)·A·log π_θ with VESPO's gamma weight of the turn's sequence ratio (it computes its
    own, so it runs at token level only); token-mean over the step. Nothing is clipped."""
    phi = vespo_weights(advantages, logps - old_logps, mask, cfg)
    per_token = -phi * advantages.unsqueeze(1) * logps
    return (per_token * mask).sum() / max(counts.tokens, 1.0), torch.zeros(())


LOSSES: dict[str, Loss] = {
    "dapo": dapo,
    "grpo": grpo,
    "dr_grpo": dr_grpo,
    "bnpo": bnpo,
    "cispo": cispo,
    "sapo": sapo,
    "luspo": luspo,
    "vespo": vespo,
}
"""Every loss by its ``train.loss_type`` name (TRL's), the default first."""

if tuple(LOSSES) != LOSS_TYPES:  # the schema lists the names (it cannot import torch); both must agree
    raise RuntimeError(f"matrixrl.train.losses registers {tuple(LOSSES)}, the schema's LOSS_TYPES are {LOSS_TYPES}")


def policy_loss(logps, old_logps, advantages, mask, cfg, counts: StepCounts) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``cfg.loss_type`` loss of one micro-batch: (loss, clipped tokens)."""
    return LOSSES[cfg.loss_type](logps, old_logps, advantages, mask, cfg, counts)
