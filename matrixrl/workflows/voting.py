"""``voting``: N parallel generators answer the same prompt; an aggregator picks the final answer.

Stages (each one batched ``generate`` call): the ``generator`` role answers
``style.generator(problem)`` for every (agent, episode), ``n_votes × B`` prompts in
agent-major order; the ``aggregator`` then sees the N completions in agent order
(``style.aggregator``) and emits the final answer. Episode turns: ``generator0..N-1``
(index 0 each), ``aggregator0``.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from matrixrl.tasks.base import Problem
from matrixrl.workflows.base import Episode, Generate, Turn, WorkflowSettings
from matrixrl.workflows.styles import PromptStyle
from matrixrl.workflows.styles.compact import CompactStyle, noisy_candidates, pick_target


class Settings(WorkflowSettings):
    n_votes: int = Field(3, ge=2, description="parallel generator agents per episode")


class Voting:
    name = "voting"
    roles = ("generator", "aggregator")

    def __init__(self, settings: Settings | dict | None = None, style: PromptStyle | None = None):
        self.settings = Settings.coerce(settings)
        self.style = style or CompactStyle()

    def run(self, problems: list[Problem], groups: list[int], generate: Generate) -> list[Episode]:
        style, n, size = self.style, self.settings.n_votes, len(problems)
        prompts = [style.generator(p) for p in problems]
        answers = generate("generator", prompts * n)  # agent a, episode i → answers[a * size + i]
        episodes = []
        for i, (problem, group) in enumerate(zip(problems, groups)):
            turns = [
                Turn("generator", f"generator{a}", 0, prompts[i], answers[a * size + i], answer=style.answer(answers[a * size + i].text))
                for a in range(n)
            ]
            episodes.append(Episode(problem=problem, group=group, turns=turns))
        agg_prompts = [style.aggregator(e.problem, [t.completion.text for t in e.turns]) for e in episodes]
        finals = generate("aggregator", agg_prompts)
        for episode, prompt, completion in zip(episodes, agg_prompts, finals):
            answer = style.answer(completion.text)
            episode.turns.append(Turn("aggregator", "aggregator0", 0, prompt, completion, answer=answer))
            episode.answer = answer
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
