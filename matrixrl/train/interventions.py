"""The remedies for terminal degradation (docs/design.md §5, docs/interventions.md), as training switches.

All off by default, and off leaves the update exactly as without them.
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
