"""Seeded multi-term integer addition: the synthetic math task for tiny models.

Training and evaluation problems add ``terms`` operands of up to ``digits`` digits
(``"4+8+9"`` → ``"21"``). The warm-start sees mostly sums of another shape
(``warmstart_terms`` operands of ``warmstart_digits`` digits: ``"47+85"``) and only a
``warmstart_hard_fraction`` of the training shape, so a briefly
warm-started model solves some but not most of the RL problems: the partial base
accuracy that gives GRPO groups with mixed rewards.
"""

from __future__ import annotations

import numpy as np

from matrixrl.tasks.base import Problem, SeededTask


class ArithTask(SeededTask):
    family = "math"

    def _problem(self, rng: np.random.Generator, shape: tuple[int, int]) -> Problem:
        terms, digits = shape
        operands = rng.integers(0, 10**digits, size=terms)
        question = "+".join(str(int(x)) for x in operands)
        return Problem(id=question, question=question, answer=str(int(operands.sum())))

    def _shape(self) -> tuple[int, int]:
        return self.config.terms, self.config.digits

    def _warmstart_shape(self) -> tuple[int, int]:
        return self.config.warmstart_terms, self.config.warmstart_digits

    def _score_distinct(self, pairs: list[tuple[Problem, str]]) -> list[float]:
        # Integers are equal as numbers exactly when their canonical strings are.
        return [
            1.0 if answer.strip().isdigit() and int(answer.strip()) == int(problem.answer) else 0.0
            for problem, answer in pairs
        ]
