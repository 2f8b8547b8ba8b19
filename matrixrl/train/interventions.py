"""The remedies for terminal degradation (docs/design.md §5, docs/interventions.md), as training switches.

All are off by default, and off leaves the update exactly as without them.

- **Per-role KL anchor** (the study's I1; ``train.kl_beta``, ``train.kl_beta_roles``,
  ``train.use_bias_correction_kl``). Each of a role's completion tokens gains
  β_role · k3 in its per-token loss, as TRL 1.16 adds it: k3 = exp(r) − r − 1 with
  r = log π_ref − log π_θ (:func:`kl_k3`), times the importance ratio when corrected
  (matrixrl.train.losses's ``kl_term``), then divided by the loss's own normaliser.
  The reference is the cell's base model: under LoRA the same model with its adapters
  off, under full fine-tuning one frozen copy shared by all roles. It works under both
  modes (docs/interventions.md).
- **Gradient-coherence damper** (the study's I6; ``train.damper``, ``train.damper_roles``,
  ``train.damper_window``). After the backward pass and before clipping, a role's
  gradient g becomes g · (1 − λ_role · clamp(cos(g, ḡ), 0, 1)). Here ḡ is the moving
  average of that role's damped gradient, ḡ ← τ ḡ + (1 − τ) g with τ = 1 − 1/window,
  and cos is one number over the whole parameter set. A role whose updates keep
  pointing the same way, which is what parallel same-role agents amplify, is slowed
  down; an orthogonal or reversing one is left alone. Under isolated policies it acts
  on each role's own parameter set. Under shared it acts on each role's contribution
  to the one gradient before they are summed. That contribution comes from the
  accumulated ``.grad`` before and after the role's backward passes (as the gradient
  diagnostics do), which the study's own code cannot separate. The moving averages are
  part of a checkpoint, so a resumed run damps as an uninterrupted one. With
  ``ppo_epochs > 1`` every pass is damped against ḡ, and ḡ moves once per step, after
  the first pass.
- **Agent-wise advantage normalisation** (Dr.MAS; ``train.advantage_group: agent``) is
  in :func:`matrixrl.train.rewards.assign_advantages`.
"""

from __future__ import annotations

import torch


def role_value(default: float, by_role: dict[str, float], role: str) -> float:
    """A per-role coefficient: the role's own if named, else the default."""
    return by_role.get(role, default)


def needs_reference(cfg) -> bool:
    """Does the KL anchor act for some role (so the policy needs its reference)?"""
    return cfg.kl_beta > 0 or any(cfg.kl_beta_roles.values())


def kl_k3(logps: torch.Tensor, ref_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(π_θ ‖ π_ref), zero on padding: exp(r) − r − 1, r = ref − logps."""
    r = ref_logps - logps
    return (torch.exp(r) - r - 1) * mask


class Damper:
    """The damper's state: one moving average ḡ per role (flat, over its parameter set)."""

    def __init__(self, strength: float, by_role: dict[str, float], window: int):
        self.strength = strength
        self.by_role = dict(by_role)
        self.tau = 1.0 - 1.0 / window
        self.average: dict[str, torch.Tensor] = {}

    @classmethod
    def from_train(cls, cfg) -> Damper | None:
        """The damper ``cfg`` (train settings) asks for, or None when every λ is 0."""
        if cfg.damper == 0 and not any(cfg.damper_roles.values()):
            return None
        return cls(cfg.damper, cfg.damper_roles, cfg.damper_window)

    def strength_of(self, role: str) -> float:
        return role_value(self.strength, self.by_role, role)

    def scale(self, role: str, gradient: torch.Tensor) -> tuple[float, float]:
        """``(scale, cos)`` for ``role``'s flat ``gradient``: scale = 1 − λ · clamp(cos(g, ḡ), 0, 1)."""
        average = self.average.get(role)
        cos = 0.0
        if average is not None:
            average = self.average[role] = average.to(gradient.device)  # a resumed run's comes from the CPU
            denominator = float(gradient.norm()) * float(average.norm())
            if denominator > 0:
                cos = float(torch.dot(gradient, average)) / denominator
        return 1.0 - self.strength_of(role) * min(max(cos, 0.0), 1.0), cos

    def update(self, role: str, damped: torch.Tensor) -> None:
        """ḡ ← τ ḡ + (1 − τ) g_damped (the first gradient seeds ḡ as (1 − τ) g)."""
        average = self.average.get(role)
        damped = damped.detach().to(torch.float32)
        average = None if average is None else average.to(damped.device)
        self.average[role] = (1 - self.tau) * damped if average is None else self.tau * average + (1 - self.tau) * damped

    def state_dict(self) -> dict:
        return {role: average.clone() for role, average in self.average.items()}

    def load_state_dict(self, state: dict) -> None:
        self.average = {role: average.clone() for role, average in state.items()}
