"""``single``: one generator answers. The control cell of every comparison."""

from __future__ import annotations

import numpy as np

from matrixrl.tasks.base import Problem
from matrixrl.workflows.base import Episode, Generate, Turn, WorkflowSettings
from matrixrl.workflows.prompts import generator_compact


class Settings(WorkflowSettings):
    """``single`` has no parameters."""


class Single:
    name = "single"
    roles = ("generator",)

    def __init__(self, settings: Settings | dict | None = None):
        self.settings = Settings.coerce(settings)

    def run(self, problems: list[Problem], groups: list[int], generate: Generate) -> list[Episode]:
        prompts = [generator_compact(p) for p in problems]
        completions = generate("generator", prompts)
        return [
            Episode(
                problem=problem,
                group=group,
                turns=[Turn("generator", "generator0", 0, prompt, completion, answer=completion.text)],
                answer=completion.text,
            )
            for problem, group, prompt, completion in zip(problems, groups, prompts, completions)
        ]

    def warmstart_pairs(self, problems: list[Problem], rng: np.random.Generator) -> list[tuple[str, str]]:
        return [(generator_compact(p), p.answer) for p in problems]
