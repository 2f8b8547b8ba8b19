"""``single``: one generator answers. The control cell of every comparison."""

from __future__ import annotations

from typing import TYPE_CHECKING

from matrixrl.tasks.base import Problem
from matrixrl.workflows.base import Episode, Generate, Turn, WorkflowBase, WorkflowSettings

if TYPE_CHECKING:
    import numpy as np


class Settings(WorkflowSettings):
    """``single`` has no parameters."""


class Single(WorkflowBase):
    name = "single"
    description = "one generator answers (no settings)"
    roles = ("generator",)
    settings_model = Settings

    def run(self, problems: list[Problem], groups: list[int], generate: Generate) -> list[Episode]:
        prompts = [self.style.generator(p) for p in problems]
        completions = generate("generator", prompts)
        episodes = []
        for problem, group, prompt, completion in zip(problems, groups, prompts, completions):
            answer = self.style.answer(completion.text)
            turn = Turn("generator", "generator0", 0, prompt, completion, answer=answer)
            episodes.append(Episode(problem=problem, group=group, turns=[turn], answer=answer))
        return episodes

    def warmstart_pairs(self, problems: list[Problem], rng: np.random.Generator) -> list[tuple[str, str]]:
        return [(self.style.generator(p), self.style.target(p.answer)) for p in problems]
