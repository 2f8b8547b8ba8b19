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

This module is the one home of the losses: ``LOSSES`` is their registry, each line a
loss's name, its function and what it refuses to run with (luspo below sequence level,
vespo above token level, cispo's cap below 1). The schema (matrixrl.config.schema)
takes ``train.loss_type``'s values and its ``loss_problem`` from it, so importing this
module must not import torch (3 s, and ``matrixrl plan`` and every config check import
the schema): the losses use tensor methods, and the few torch functions that have none
are imported inside the function that calls them, by when torch is loaded. Nothing
here imports the schema (it imports this module).

Adding a loss: one function of the signature of ``Loss`` below, its line in ``LOSSES``
(with what it refuses, if anything) and its parameters as ``train:`` fields
(docs/extending.md, "A loss").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

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
"""``(logps, old_logps, advantages, mask, cfg, counts) -> (loss, clipped tokens)``: the
loss of a micro-batch's turns (rows), such that the micro-batches of a step add up
to the step's loss, and how many of its completion tokens a clip or cap acted on.
``cfg`` is the ``train:`` settings (TRL's parameter names: the schema's ``Train``)."""


def _any_settings(cfg) -> str | None:
    """What a loss that runs with every setting refuses: nothing."""
    return None


@dataclass(frozen=True)
class Registered:
    """A line of ``LOSSES``: the loss, and why it cannot run with given ``train:`` settings.

    ``refuses(cfg)`` is one line with the fix, or None: the schema's ``loss_problem``
    asks it of every ``train:`` (and every scale's merged one) before anything runs.
    TRL 1.16 warns about luspo's and vespo's refused levels and computes them anyway;
    a sweep here would spend a run on each."""

    loss: Loss
    refuses: Callable[[Any], str | None] = _any_settings


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


def luspo_refuses(cfg) -> str | None:
    """LUSPO's length scaling is of a sequence ratio: token level is refused."""
    if cfg.importance_sampling_level != "sequence":
        return (
            "loss_type luspo scales a sequence ratio's loss by the turn's length, so it needs "
            "importance_sampling_level: sequence (got token); set it, or use another loss_type"
        )
    return None


def cispo(logps, old_logps, advantages, mask, cfg, counts: StepCounts):
    """−sg(min(w, ε_high))·A·log π_θ: the importance weight capped at ``epsilon_high`` and
    detached, so a capped token still has a gradient (MiniMax-M1); token-mean over the step."""
    ratio = log_importance_weights(logps, old_logps, mask, cfg.importance_sampling_level).exp()
    adv = advantages.unsqueeze(1)
    per_token = -ratio.clamp(max=cfg.epsilon_high).detach() * adv * logps
    is_capped = (ratio > cfg.epsilon_high) & (adv > 0)
    return (per_token * mask).sum() / max(counts.tokens, 1.0), _clipped_tokens(is_capped, mask)


def cispo_refuses(cfg) -> str | None:
    """A cap below 1 caps every token from the first pass on."""
    if cfg.epsilon_high < 1:
        return (
            f"loss_type cispo caps each token's importance weight at epsilon_high ({cfg.epsilon_high:g}), below 1, "
            "so every token would be capped from the first pass; set epsilon_high: 5.0 (ScaleRL's ε_max, TRL's advice)"
        )
    return None


def sapo(logps, old_logps, advantages, mask, cfg, counts: StepCounts):
    """A soft gate instead of a clip: −σ(τ(w − 1))·4/τ·A, τ by the advantage's sign
    (``sapo_temperature_pos`` above 0, ``sapo_temperature_neg`` otherwise); each turn's
    token-mean, averaged over the step's turns (SAPO). Nothing is clipped."""
    import torch  # loaded by now (the tensors are its): where of two numbers has no tensor method

    ratio = log_importance_weights(logps, old_logps, mask, cfg.importance_sampling_level).exp()
    adv = advantages.unsqueeze(1)
    temperatures = torch.where(adv > 0, cfg.sapo_temperature_pos, cfg.sapo_temperature_neg)
    per_token = -((temperatures * (ratio - 1)).sigmoid() * 4 / temperatures) * adv
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


def vespo(logps, old_logps, advantages, mask, cfg, counts: StepCounts):
    """−φ(w)·A·log π_θ with VESPO's gamma weight of the turn's sequence ratio (it computes its
    own, so it runs at token level only); token-mean over the step. Nothing is clipped."""
    phi = vespo_weights(advantages, logps - old_logps, mask, cfg)
    per_token = -phi * advantages.unsqueeze(1) * logps
    return (per_token * mask).sum() / max(counts.tokens, 1.0), _nothing_clipped()


def vespo_refuses(cfg) -> str | None:
    """VESPO computes its own sequence ratio: sequence level would repeat token level's run."""
    if cfg.importance_sampling_level != "token":
        return (
            "loss_type vespo weighs each turn by its own sequence ratio whatever the level, so "
            "importance_sampling_level: sequence would repeat token's run; set it to token"
        )
    return None


LOSSES: dict[str, Registered] = {
    "dapo": Registered(dapo),
    "grpo": Registered(grpo),
    "dr_grpo": Registered(dr_grpo),
    "bnpo": Registered(bnpo),
    "cispo": Registered(cispo, refuses=cispo_refuses),
    "sapo": Registered(sapo),
    "luspo": Registered(luspo, refuses=luspo_refuses),
    "vespo": Registered(vespo, refuses=vespo_refuses),
}
"""Every loss by its ``train.loss_type`` name (TRL's), the default first: the schema's
``LOSS_TYPES`` are these names, in this order."""


def policy_loss(logps, old_logps, advantages, mask, cfg, counts: StepCounts) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``cfg.loss_type`` loss of one micro-batch: (loss, clipped tokens)."""
    return LOSSES[cfg.loss_type].loss(logps, old_logps, advantages, mask, cfg, counts)
