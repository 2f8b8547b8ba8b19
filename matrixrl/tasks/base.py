"""What every task provides: seeded problems, a fixed evaluation set, a scorer.

A task belongs to a ``family`` (``math`` or ``code``): prompt styles phrase their
instructions by it, and workflows pick family defaults from it (eval_opt's
iterations). Scoring goes through ``score_batch`` so that code tasks can run many
answers in the sandbox at once and math tasks can parse each reference once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

Family = Literal["math", "code"]


@dataclass(frozen=True)
class Problem:
    """One question with its reference answer; ``id`` is stable across runs.

    ``answer`` is what a correct completion looks like (the warm-start's target);
    code tasks keep their hidden tests out of the problem, inside the task.
    """

    id: str
    question: str
    answer: str


class Task(Protocol):
    name: str
    family: Family

    def eval_problems(self) -> list[Problem]:
        """The fixed evaluation set: identical for every cell, checkpoint and seed."""

    def train_problems(self, rng: np.random.Generator, n: int) -> list[Problem]:
        """``n`` training problems drawn with ``rng``; never one of the evaluation set."""

    def warmstart_problems(self, rng: np.random.Generator, n: int) -> list[Problem]:
        """Problems for the supervised warm-start of a base model (easier than training)."""

    def score(self, problem: Problem, answer: str) -> float:
        """1.0 when ``answer`` is correct for ``problem``, else 0.0."""

    def score_batch(self, problems: Sequence[Problem], answers: Sequence[str]) -> list[float]:
        """``score`` for many (problem, answer) pairs at once, in order."""


class BatchScorer:
    """``score`` and ``score_batch`` from one ``_score_distinct`` over distinct pairs.

    Repeated (problem, answer) pairs, common within a GRPO group, are scored once.
    """

    def score(self, problem: Problem, answer: str) -> float:
        return self.score_batch([problem], [answer])[0]

    def score_batch(self, problems: Sequence[Problem], answers: Sequence[str]) -> list[float]:
        if len(problems) != len(answers):
            raise ValueError(f"{len(problems)} problems but {len(answers)} answers")
        distinct: dict[tuple[str, str], tuple[Problem, str]] = {}
        for problem, answer in zip(problems, answers):
            distinct.setdefault((problem.id, answer), (problem, answer))
        pairs = list(distinct.values())
        scores = dict(zip(distinct, self._score_distinct(pairs))) if pairs else {}
        return [scores[(p.id, a)] for p, a in zip(problems, answers)]

    def _score_distinct(self, pairs: list[tuple[Problem, str]]) -> list[float]:
        raise NotImplementedError
