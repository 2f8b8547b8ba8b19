"""``train.loss_type``'s registry: every loss's name (TRL 1.16's) and the settings it refuses.

Imports no torch; the functions are matrixrl.train.losses's, in the same order (docs/extending.md, "A loss").
"""

from __future__ import annotations

from typing import Any, Callable

Refusal = Callable[[Any], "str | None"]
"""``refuses(train)``: why a loss cannot run with these ``train:`` settings (one line with
the fix), or None. TRL 1.16 warns about luspo's and vespo's refused levels and computes
them anyway; a sweep here would spend a run on each."""


def accepts_any(cfg) -> str | None:
    """What a loss that runs with every setting refuses: nothing."""
    return None


def luspo_refuses(cfg) -> str | None:
    """LUSPO's length scaling is of a sequence ratio: token level is refused."""
    if cfg.importance_sampling_level != "sequence":
        return (
            "loss_type luspo scales a sequence ratio's loss by the turn's length, so it needs "
            "importance_sampling_level: sequence (got token); set it, or use another loss_type"
        )
    return None


def cispo_refuses(cfg) -> str | None:
    """A cap below 1 caps every token from the first pass on."""
    if cfg.epsilon_high < 1:
        return (
            f"loss_type cispo caps each token's importance weight at epsilon_high ({cfg.epsilon_high:g}), below 1, "
            "so every token would be capped from the first pass; set epsilon_high: 5.0 (ScaleRL's ε_max, TRL's advice)"
        )
    return None


def vespo_refuses(cfg) -> str | None:
    """VESPO computes its own sequence ratio: sequence level would repeat token level's run."""
    if cfg.importance_sampling_level != "token":
        return (
            "loss_type vespo weighs each turn by its own sequence ratio whatever the level, so "
            "importance_sampling_level: sequence would repeat token's run; set it to token"
        )
    return None


REFUSALS: dict[str, Refusal] = {
    "dapo": accepts_any,
    "grpo": accepts_any,
    "dr_grpo": accepts_any,
    "bnpo": accepts_any,
    "cispo": cispo_refuses,
    "sapo": accepts_any,
    "luspo": luspo_refuses,
    "vespo": vespo_refuses,
}
"""Every loss by its ``train.loss_type`` name, the default first, with what it refuses."""

LOSS_TYPES: tuple[str, ...] = tuple(REFUSALS)

NOT_A_LOSS_TYPE: dict[str, str] = {
    "gspo": "GSPO is loss_type grpo with importance_sampling_level: sequence; set both",
}
"""Names users reach for that are a setting of another loss, not a loss: the fix for each."""


def loss_problem(train) -> str | None:
    """Why ``train``'s loss settings cannot run together (one line with the fix), or None."""
    return REFUSALS[train.loss_type](train)
