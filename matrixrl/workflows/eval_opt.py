"""``eval_opt``: the generator drafts, the evaluator judges, the generator refines until satisfied.

Each stage is one batched call over the episodes still active; the last attempt is not
evaluated (turns ``generator0#0, evaluator0#0, generator0#1, ...``), and the answer is the last
draft. An episode is a play (``play``), the batch played in lockstep.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from matrixrl.tasks.base import Family, Problem
from matrixrl.workflows.base import Episode, Generate, Play, Turn, WorkflowBase, WorkflowSettings, lockstep
from matrixrl.workflows.styles.compact import wrong_answer

if TYPE_CHECKING:
    import numpy as np

DEFAULT_ITERATIONS: dict[Family, int] = {"math": 3, "code": 2}


class Settings(WorkflowSettings):
    max_iterations: int | None = Field(
        None, ge=1, description="generator attempts per episode, first draft included (default: 3 math, 2 code)"
    )


class EvalOpt(WorkflowBase):
    name = "eval_opt"
    description = "a generator drafts, an evaluator judges, the generator refines"
    roles = ("generator", "evaluator")
    settings_model = Settings

    @property
    def max_iterations(self) -> int:
        """The setting, or the default of the task's family."""
        return self.settings.max_iterations or DEFAULT_ITERATIONS[self.style.family]

    def run(self, problems: list[Problem], groups: list[int], generate: Generate) -> list[Episode]:
        return lockstep([self.play(p, g) for p, g in zip(problems, groups)], generate)

    def play(self, problem: Problem, group: int) -> Play:
        """One episode: draft, then judge and refine until satisfied or out of attempts."""
        style, iterations = self.style, self.max_iterations
        episode = Episode(problem=problem, group=group)
        prompt = style.generator(problem)
        for attempt in range(iterations):
            draft = yield "generator", prompt
            episode.answer = style.answer(draft.text)
            episode.turns.append(Turn("generator", "generator0", attempt, prompt, draft, answer=episode.answer))
            if attempt + 1 == iterations:
                break
            judge_prompt = style.evaluator(problem, draft.text)
            verdict = yield "evaluator", judge_prompt
            satisfied, feedback = style.parse_verdict(verdict.text)
            episode.turns.append(
                Turn("evaluator", "evaluator0", attempt, judge_prompt, verdict, judged=episode.answer, approved=satisfied)
            )
            if satisfied:
                break
            prompt = style.refine(problem, draft.text, feedback)
        return episode

    def warmstart_pairs(self, problems: list[Problem], rng: np.random.Generator) -> list[tuple[str, str]]:
        """Per problem: a draft; the evaluator on a right and on a wrong draft; a refine of the wrong one."""
        style, others = self.style, [p.answer for p in problems]
        pairs = []
        for p in problems:
            right, wrong = style.target(p.answer), style.target(wrong_answer(p.answer, rng, others))
            feedback = style.verdict_for(wrong, p.answer)
            pairs += [
                (style.generator(p), right),
                (style.evaluator(p, right), style.verdict_for(right, p.answer)),
                (style.evaluator(p, wrong), feedback),
                (style.refine(p, wrong, feedback), right),
            ]
        return pairs
