"""Seeded multi-term integer addition: the synthetic math task for tiny models.

Training and evaluation problems add ``terms`` operands of up to ``digits`` digits
(``"4+8+9"`` → ``"21"``). The warm-start sees mostly sums of another shape
(``warmstart_terms`` operands of ``warmstart_digits`` digits: ``"47+85"``) and only a
``warmstart_hard_fraction`` of the training shape, so a briefly
warm-started model solves some but not most of the RL problems: the partial base
accuracy that gives GRPO groups with mixed rewards.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from matrixrl.tasks.base import BatchScorer, Problem


class ArithTask(BatchScorer):
    family = "math"

    def __init__(self, name: str, config):
        self.name = name
        self.config = config

    def _problem(self, rng: np.random.Generator, terms: int, digits: int) -> Problem:
        operands = rng.integers(0, 10**digits, size=terms)
        question = "+".join(str(int(x)) for x in operands)
        return Problem(id=question, question=question, answer=str(int(operands.sum())))

    @cached_property
    def _eval(self) -> list[Problem]:
        rng = np.random.default_rng([self.config.seed, 1])
        seen: dict[str, Problem] = {}
        while len(seen) < self.config.n_eval:
            problem = self._problem(rng, self.config.terms, self.config.digits)
            seen.setdefault(problem.id, problem)
        return list(seen.values())

    @cached_property
    def _eval_ids(self) -> frozenset[str]:
        return frozenset(p.id for p in self._eval)

    def eval_problems(self) -> list[Problem]:
        return list(self._eval)

    def _draw(self, rng: np.random.Generator, n: int, shape) -> list[Problem]:
        problems: list[Problem] = []
        while len(problems) < n:
            problem = self._problem(rng, *shape())
            if problem.id not in self._eval_ids:  # splits never overlap
                problems.append(problem)
        return problems

    def train_problems(self, rng: np.random.Generator, n: int) -> list[Problem]:
        return self._draw(rng, n, lambda: (self.config.terms, self.config.digits))

    def warmstart_problems(self, rng: np.random.Generator, n: int) -> list[Problem]:
        cfg = self.config

        def shape() -> tuple[int, int]:
            if rng.random() < cfg.warmstart_hard_fraction:
                return cfg.terms, cfg.digits
            return cfg.warmstart_terms, cfg.warmstart_digits

        return self._draw(rng, n, shape)

    def _score_distinct(self, pairs: list[tuple[Problem, str]]) -> list[float]:
        # Integers are equal as numbers exactly when their canonical strings are.
        return [
            1.0 if answer.strip().isdigit() and int(answer.strip()) == int(problem.answer) else 0.0
            for problem, answer in pairs
        ]
