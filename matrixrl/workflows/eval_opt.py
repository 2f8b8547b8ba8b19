"""``eval_opt``: the generator drafts, the evaluator judges, the generator refines until satisfied.

Loop, each stage one batched ``generate`` call over the episodes still active:
``generator`` drafts (``generator_compact``); while attempts < ``max_iterations`` the
``evaluator`` judges the latest draft (``evaluator_compact``); an episode whose verdict
starts with ``Y`` is done, the others get a refine prompt (``refine_compact``: previous
draft + the evaluator's feedback) answered by the same ``generator`` role. The last
attempt is not evaluated (its verdict could change nothing), so an episode has at most
``max_iterations`` generator turns and ``max_iterations - 1`` evaluator turns, in the order
``generator0#0, evaluator0#0, generator0#1, evaluator0#1, ...``. The answer is the last draft.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from matrixrl.tasks.base import Problem
from matrixrl.workflows.base import Episode, Generate, Turn, WorkflowSettings
from matrixrl.workflows.prompts import (
    evaluator_compact,
    generator_compact,
    parse_verdict,
    refine_compact,
    verdict_for,
    wrong_answer,
)


class Settings(WorkflowSettings):
    max_iterations: int = Field(3, ge=1, description="generator attempts per episode, first draft included")


class EvalOpt:
    name = "eval_opt"
    roles = ("generator", "evaluator")

    def __init__(self, settings: Settings | dict | None = None):
        self.settings = Settings.coerce(settings)

    def run(self, problems: list[Problem], groups: list[int], generate: Generate) -> list[Episode]:
        episodes = [Episode(problem=p, group=g) for p, g in zip(problems, groups)]
        active = list(range(len(episodes)))
        prompts = [generator_compact(p) for p in problems]
        for attempt in range(self.settings.max_iterations):
            drafts = generate("generator", prompts)
            for i, prompt, draft in zip(active, prompts, drafts):
                episodes[i].turns.append(Turn("generator", "generator0", attempt, prompt, draft, answer=draft.text))
                episodes[i].answer = draft.text
            if attempt + 1 == self.settings.max_iterations:
                break
            judge_prompts = [evaluator_compact(episodes[i].problem, episodes[i].answer) for i in active]
            verdicts = generate("evaluator", judge_prompts)
            still, prompts = [], []
            for i, prompt, verdict in zip(active, judge_prompts, verdicts):
                episode = episodes[i]
                episode.turns.append(Turn("evaluator", "evaluator0", attempt, prompt, verdict, judged=episode.answer))
                satisfied, feedback = parse_verdict(verdict.text)
                if not satisfied:
                    still.append(i)
                    prompts.append(refine_compact(episode.problem, episode.answer, feedback))
            active = still
            if not active:
                break
        return episodes

    def warmstart_pairs(self, problems: list[Problem], rng: np.random.Generator) -> list[tuple[str, str]]:
        """Per problem: a draft; the evaluator on a right and on a wrong draft; a refine of the wrong one."""
        others = [p.answer for p in problems]
        pairs = []
        for p in problems:
            wrong = wrong_answer(p.answer, rng, others)
            feedback = verdict_for(wrong, p.answer)
            pairs += [
                (generator_compact(p), p.answer),
                (evaluator_compact(p, p.answer), verdict_for(p.answer, p.answer)),
                (evaluator_compact(p, wrong), feedback),
                (refine_compact(p, wrong, feedback), p.answer),
            ]
        return pairs
