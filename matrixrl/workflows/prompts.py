"""Role prompt templates. The compact style suits tiny character-level models."""

from __future__ import annotations

from matrixrl.tasks.base import Problem


def generator_compact(problem: Problem) -> str:
    return f"{problem.question}="
