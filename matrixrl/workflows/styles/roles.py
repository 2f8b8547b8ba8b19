"""The prompt of a role that no style has a method for, declared by the workflow that has it.

A workflow that brings a role of its own declares its :class:`RolePrompt`, which every style
writes with its generic ``ask``: a new role touches no style module.
"""

from __future__ import annotations

from dataclasses import dataclass

STYLE_ROLES = ("generator", "evaluator", "aggregator", "orchestrator", "worker", "synthesizer")
"""The built-in roles: each has a method in every style (``style.generator(problem)``, ...)."""


@dataclass(frozen=True)
class RolePrompt:
    """How the styles write one role's prompt (docs/extending.md, "Prompts").

    ``instruction``: the chat style's system message (``{noun}``: the family's noun), followed
    by the family's answer format when ``answers``. ``compact``: the compact style's one-line
    template over ``{question}`` and ``{shown}`` (the answers the role is shown), ending in the
    delimiter of what the completion is and unlike every other role's.
    """

    instruction: str
    compact: str
    answers: bool = True
