"""The prompt of a role that no style has a method for, declared by the workflow that has it.

The built-in roles (generator, evaluator, aggregator, ...) each have a method in every
style, written for that role. A workflow that brings a role of its own declares the
role's :class:`RolePrompt` (``WorkflowBase.prompts``), and every style writes it with
its generic ``ask``: so a new role, like a new workflow, touches no style module.
"""

from __future__ import annotations

from dataclasses import dataclass

STYLE_ROLES = ("generator", "evaluator", "aggregator", "orchestrator", "worker", "synthesizer")
"""The built-in roles: each has a method in every style (``style.generator(problem)``, ...)."""


@dataclass(frozen=True)
class RolePrompt:
    """How the styles write one role's prompt.

    ``instruction``: what the role does, the chat style's system message; ``{noun}``
    stands for the task family's noun (``math``, ``programming``). When ``answers``
    (the completion proposes an answer, which ``style.answer`` reads), the chat style
    appends the family's answer format (``\\boxed{}``, one python block).

    ``compact``: the compact style's one-line template, ``{question}`` the problem's
    question and ``{shown}`` the answers the role is shown (other turns' completions,
    cleaned and comma-separated). End it with the delimiter of what the completion is
    (``=``: an answer), and make it differ from every other role's, so that a tiny
    model can tell the roles apart: ``{question}=`` is the generator's.
    """

    instruction: str
    compact: str
    answers: bool = True
