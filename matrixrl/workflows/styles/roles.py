"""The prompt of a role that no style has a method for, declared by the workflow that has it."""

from __future__ import annotations

from dataclasses import dataclass

STYLE_ROLES = ("generator", "evaluator", "aggregator", "orchestrator", "worker", "synthesizer")
"""The built-in roles: each has a method in every style (``style.generator(problem)``, ...)."""


@dataclass(frozen=True)
class RolePrompt:
    """How the styles write one role's prompt (docs/extending.md, "Prompts")."""

    instruction: str
    compact: str
    answers: bool = True
