"""The policy losses of a GRPO step, one function each, registered by name in ``LOSSES``.

Each matches TRL 1.16's ``GRPOTrainer._compute_loss`` (tests/test_losses.py). docs/design.md §2, "Losses";
adding one: docs/extending.md, "A loss".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class StepCounts:
    """What a loss divides by, counted over the whole step (see the module docstring)."""

    tokens: int  # completion tokens of every turn of the step
    turns: int  # turns of the step
    set_tokens: int  # completion tokens of the turns that the parameter set being updated receives
    max_completion_length: int  # train.max_new_tokens: the longest completion a turn can have (Dr. GRPO's constant)


Loss = Callable[..., "tuple[torch.Tensor, torch.Tensor]"]
"""``(logps, old_logps, advantages, mask, cfg, counts, kl=None) -> (loss, clipped tokens)``:
the loss of a micro-batch's turns (rows), such that the micro-batches of a step add
up to the step's loss, and how many of its completion tokens a clip or cap acted on.
``cfg`` is the ``train:`` settings (TRL's parameter names: the schema's ``Train``);
``kl``, when given, is added to each token's term before the normaliser (``kl_term``)."""


def log_importance_weights(logps: torch.Tensor, old_logps: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """log π_θ/π_old per token ([rows, tokens]), or at ``sequence`` level the mean over each
    turn's tokens ([rows, 1]: GSPO's length-normalised sequence ratio)."""
    log_ratio = logps - old_logps
    if level == "token":
        return log_ratio
    return ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)


def _clipped(logps, old_logps, advantages, mask, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate −min(w·A, clip(w, 1 − ε_low, 1 + ε_high)·A) and where the clip acted."""
    ratio = log_importance_weights(logps, old_logps, mask, cfg.importance_sampling_level).exp()
    clipped_ratio = ratio.clamp(1 - cfg.epsilon_low, 1 + cfg.epsilon_high)
    adv = advantages.unsqueeze(1)
    per_token = -(ratio * adv).minimum(clipped_ratio * adv)
    is_clipped = ((ratio < 1 - cfg.epsilon_low) & (adv < 0)) | ((ratio > 1 + cfg.epsilon_high) & (adv > 0))
    return per_token, is_clipped


def _clipped_tokens(is_clipped: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (is_clipped.float() * mask).sum()


def _nothing_clipped() -> torch.Tensor:
    """The clipped-token count of a loss without a clip or cap: 0."""
    import torch  # loaded by now (the tensors are its)

    return torch.zeros(())


def _plus(per_token: torch.Tensor, kl: torch.Tensor | None) -> torch.Tensor:
    """A loss's per-token term with the KL term added (TRL: before the normaliser; a sequence-level
    term of [rows, 1] broadcasts to the tokens)."""
    return per_token if kl is None else per_token + kl


def _turn_means(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each turn's mean over its own tokens (a turn without tokens: 0)."""
    return (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


def dapo(logps, old_logps, advantages, mask, cfg, counts: StepCounts, kl=None):
    """Clipped surrogate, summed over tokens, divided by the step's tokens (DAPO's token-mean;
    matrixrl's loss before loss_type existed, and its default)."""
    per_token, is_clipped = _clipped(logps, old_logps, advantages, mask, cfg)
    per_token = _plus(per_token, kl)
    return (per_token * mask).sum() / max(counts.tokens, 1.0), _clipped_tokens(is_clipped, mask)


def grpo(logps, old_logps, advantages, mask, cfg, counts: StepCounts, kl=None):
    """Clipped surrogate, each turn's token-mean, averaged over the step's turns (every turn
    weighs the same whatever its length; GSPO at sequence level)."""
    per_token, is_clipped = _clipped(logps, old_logps, advantages, mask, cfg)
    per_token = _plus(per_token, kl)
    return _turn_means(per_token, mask).sum() / max(counts.turns, 1), _clipped_tokens(is_clipped, mask)


def bnpo(logps, old_logps, advantages, mask, cfg, counts: StepCounts, kl=None):
    """Clipped surrogate, summed over tokens, divided by the tokens of the parameter set's turns."""
    per_token, is_clipped = _clipped(logps, old_logps, advantages, mask, cfg)
    per_token = _plus(per_token, kl)
    return (per_token * mask).sum() / max(counts.set_tokens, 1.0), _clipped_tokens(is_clipped, mask)


def dr_grpo(logps, old_logps, advantages, mask, cfg, counts: StepCounts, kl=None):
    """Clipped surrogate, summed over tokens, divided by a constant: the step's turns × the
    longest completion a turn can have (Dr. GRPO: no length bias, no per-step token count)."""
    per_token, is_clipped = _clipped(logps, old_logps, advantages, mask, cfg)
    per_token = _plus(per_token, kl)
    constant = counts.turns * counts.max_completion_length
    return (per_token * mask).sum() / max(constant, 1), _clipped_tokens(is_clipped, mask)


def luspo(logps, old_logps, advantages, mask, cfg, counts: StepCounts, kl=None):
    """Clipped surrogate of a sequence ratio, summed over each turn's tokens (its loss scaled by
    its length), averaged over the step's turns (LUSPO)."""
    per_token, is_clipped = _clipped(logps, old_logps, advantages, mask, cfg)
    per_token = _plus(per_token, kl)
    return (per_token * mask).sum(-1).sum() / max(counts.turns, 1), _clipped_tokens(is_clipped, mask)


def cispo(logps, old_logps, advantages, mask, cfg, counts: StepCounts, kl=None):
    """−sg(min(w, ε_high))·A·log π_θ: the importance weight capped at ``epsilon_high`` and
    detached, so a capped token still has a gradient (MiniMax-M1); token-mean over the step."""
    ratio = log_importance_weights(logps, old_logps, mask, cfg.importance_sampling_level).exp()
    adv = advantages.unsqueeze(1)
    per_token = _plus(-ratio.clamp(max=cfg.epsilon_high).detach() * adv * logps, kl)
    is_capped = (ratio > cfg.epsilon_high) & (adv > 0)
    return (per_token * mask).sum() / max(counts.tokens, 1.0), _clipped_tokens(is_capped, mask)


def sapo(logps, old_logps, advantages, mask, cfg, counts: StepCounts, kl=None):
    """A soft gate instead of a clip: −σ(τ(w − 1))·4/τ·A, τ by the advantage's sign
    (``sapo_temperature_pos`` above 0, ``sapo_temperature_neg`` otherwise); each turn's
    token-mean, averaged over the step's turns (SAPO). Nothing is clipped."""
    import torch  # loaded by now (the tensors are its): where of two numbers has no tensor method

    ratio = log_importance_weights(logps, old_logps, mask, cfg.importance_sampling_level).exp()
    adv = advantages.unsqueeze(1)
    temperatures = torch.where(adv > 0, cfg.sapo_temperature_pos, cfg.sapo_temperature_neg)
    per_token = _plus(-((temperatures * (ratio - 1)).sigmoid() * 4 / temperatures) * adv, kl)
    return _turn_means(per_token, mask).sum() / max(counts.turns, 1), _nothing_clipped()


def vespo_weights(advantages, log_ratio, mask, cfg) -> torch.Tensor:
    """VESPO's φ(w) = e^λ · w^k · e^(−λw) of each turn's sequence ratio w = exp Σ log-ratios
    (φ(1) = 1), k and λ by the advantage's sign; a weight, not differentiated ([rows, 1])."""
    import torch  # loaded by now (the tensors are its): no_grad, and where of two numbers

    with torch.no_grad():
        lowest = math.log(1e-8)
        sequence_log_ratio = (log_ratio.clamp(-20.0, 20.0) * mask).sum(-1, keepdim=True)
        log_w = sequence_log_ratio.clamp(lowest, 20.0)
        non_negative = advantages.unsqueeze(1) >= 0
        k = torch.where(non_negative, cfg.vespo_k_pos, cfg.vespo_k_neg)
        lam = torch.where(non_negative, cfg.vespo_lambda_pos, cfg.vespo_lambda_neg).clamp(min=1e-4)
        return (lam + k * log_w - lam * log_w.exp()).exp().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def vespo(logps, old_logps, advantages, mask, cfg, counts: StepCounts, kl=None):
    """−φ(w)·A·log π_θ with VESPO's gamma weight of the turn's sequence ratio (it computes its
    own, so it runs at token level only); token-mean over the step. Nothing is clipped."""
    phi = vespo_weights(advantages, logps - old_logps, mask, cfg)
    per_token = _plus(-phi * advantages.unsqueeze(1) * logps, kl)
    return (per_token * mask).sum() / max(counts.tokens, 1.0), _nothing_clipped()


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
"""Every loss by its ``train.loss_type`` name: matrixrl.config.loss_types's names, in its order."""


def kl_term(k3: torch.Tensor, logps, old_logps, mask, beta: float, cfg) -> torch.Tensor:
    """The KL anchor's per-token term as TRL 1.16 adds it to each token's loss: β · k3, and
    with ``cfg.use_bias_correction_kl`` times the importance ratio at ``cfg``'s level
    (differentiable, so it changes the gradient even where the ratio is 1)."""
    if cfg.use_bias_correction_kl:
        return beta * k3 * log_importance_weights(logps, old_logps, mask, cfg.importance_sampling_level).exp()
    return beta * k3


def policy_loss(logps, old_logps, advantages, mask, cfg, counts: StepCounts, kl=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``cfg.loss_type`` loss of one micro-batch, ``kl`` (``kl_term``'s, or None) in each
    token's term: (loss, clipped tokens)."""
    return LOSSES[cfg.loss_type](logps, old_logps, advantages, mask, cfg, counts, kl=kl)
