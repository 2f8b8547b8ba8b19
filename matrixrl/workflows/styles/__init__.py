"""Prompt styles: how each role's prompt is written and its completion read; the PromptGuide hook.

A workflow asks its style for every role's prompt and for what a completion means, so one
workflow serves every style; ``PromptGuide`` lets a memory add guidance. docs/extending.md, "Prompts".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from matrixrl.tasks.base import Family, Problem
from matrixrl.workflows.styles.chat import PromptSettings
from matrixrl.workflows.styles.roles import RolePrompt

STYLE_NAMES = ("compact", "chat")


class PromptStyle(Protocol):
    """What a workflow asks of its style; ``family`` is the task's (``math`` or ``code``)."""

    name: str
    family: Family
    strategies: tuple[str, ...]  # strategies the warm-start draws orchestrator plans from

    def generator(self, problem: Problem) -> str: ...

    def refine(self, problem: Problem, draft: str, feedback: str) -> str:
        """The generator's retry: its previous completion and the evaluator's feedback."""

    def evaluator(self, problem: Problem, draft: str) -> str: ...

    def parse_verdict(self, text: str) -> tuple[bool, str]:
        """(satisfied, feedback to quote in the refine prompt) from an evaluator completion."""

    def verdict_for(self, draft: str, answer: str) -> str:
        """The ideal evaluator completion for ``draft`` when ``answer`` is right (warm-start target)."""

    def aggregator(self, problem: Problem, candidates: Sequence[str]) -> str: ...

    def orchestrator(self, problem: Problem, n: int) -> str: ...

    def parse_strategies(self, text: str, n: int) -> list[str]:
        """Exactly ``n`` strategies from an orchestrator completion (padded when short)."""

    def format_strategies(self, strategies: Sequence[str]) -> str:
        """The orchestrator completion that proposes ``strategies`` (warm-start target)."""

    def worker(self, problem: Problem, strategy: str) -> str: ...

    def synthesizer(self, problem: Problem, candidates: Sequence[str]) -> str: ...

    def ask(self, role: str, problem: Problem, prompt: RolePrompt, shown: Sequence[str] = ()) -> str:
        """The prompt of a role that has no method here, as its workflow declares it
        (``WorkflowBase.prompts``); ``shown``: other turns' completions the role sees."""

    def answer(self, completion: str) -> str:
        """The answer a completion proposes: what the task scores."""

    def target(self, answer: str) -> str:
        """A completion that proposes ``answer`` (warm-start target; ``answer(target(a)) == a``)."""


class PromptGuide(Protocol):
    """Guidance added to a style's prompts before rollouts (``train.trainer.train_cell``:
    each step's problems; ``jobs.evaluate``: the evaluation's problems)."""

    def apply(self, style: PromptStyle, problems: Sequence[Problem]) -> dict:
        """Guide ``style``'s prompts for ``problems``; returns what the caller records of it
        (an evaluation: the fields of its ``MemoryEvalResult``; training records nothing)."""


def build_style(name: str, family: Family = "math", tokenizer=None, settings: PromptSettings | dict | None = None) -> PromptStyle:
    """The style ``name`` for a task of ``family``; ``chat`` needs the tokenizer (its chat template)."""
    if name == "compact":
        from matrixrl.workflows.styles.compact import CompactStyle

        return CompactStyle(family)
    if name == "chat":
        from matrixrl.workflows.styles.chat import ChatStyle

        if not isinstance(settings, PromptSettings):
            settings = PromptSettings.model_validate(settings or {})
        return ChatStyle(tokenizer, family, settings)
    raise ValueError(f"unknown prompt style {name!r}; use one of: {', '.join(STYLE_NAMES)}")


__all__ = ["PromptGuide", "PromptSettings", "PromptStyle", "RolePrompt", "STYLE_NAMES", "build_style"]
