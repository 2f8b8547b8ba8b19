"""``voting``: N parallel generators answer the same prompt; an aggregator picks the final answer.

Stages, each one batched call: ``n_votes`` generators per episode (agent-major order), then the
``aggregator`` reading their completions in agent order. Turns: ``generator0..N-1``, ``aggregator0``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from matrixrl.tasks.base import Problem
from matrixrl.workflows.base import Episode, Generate, WorkflowBase, WorkflowSettings, decide, parallel_turns
from matrixrl.workflows.styles.compact import noisy_candidates, pick_target

if TYPE_CHECKING:
    import numpy as np


class Settings(WorkflowSettings):
    n_votes: int = Field(3, ge=2, description="parallel generator agents per episode")


class Voting(WorkflowBase):
    name = "voting"
    description = "parallel generators answer, an aggregator gives the final answer"
    roles = ("generator", "aggregator")
    parallel_roles = ("generator",)
    settings_model = Settings

    def run(self, problems: list[Problem], groups: list[int], generate: Generate) -> list[Episode]:
        style, n, size = self.style, self.settings.n_votes, len(problems)
        prompts = [style.generator(p) for p in problems]
        answers = generate("generator", prompts * n)
        agents = parallel_turns("generator", prompts * n, answers, size, n, style.answer)
        episodes = [Episode(problem=p, group=g, turns=t) for p, g, t in zip(problems, groups, agents)]
        agg_prompts = [style.aggregator(e.problem, [t.completion.text for t in e.turns]) for e in episodes]
        decide(episodes, "aggregator", agg_prompts, generate, style.answer)
        return episodes

    def warmstart_pairs(self, problems: list[Problem], rng: np.random.Generator) -> list[tuple[str, str]]:
        """Per problem: the generator's answer, and an aggregator choice among noisy candidates."""
        style, others = self.style, [p.answer for p in problems]
        pairs = []
        for p in problems:
            candidates = noisy_candidates(p.answer, self.settings.n_votes, rng, others)
            pairs.append((style.generator(p), style.target(p.answer)))
            pairs.append((style.aggregator(p, [style.target(c) for c in candidates]), style.target(pick_target(candidates, p.answer))))
        return pairs
