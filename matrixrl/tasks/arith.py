"""Seeded multi-term integer addition: the synthetic math task for tiny models (docs/tasks.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from matrixrl.settings import Strict
from matrixrl.tasks.base import Problem, SeededTask

if TYPE_CHECKING:
    import numpy as np


class Settings(Strict):
    """Seeded multi-term addition (see matrixrl.tasks.arith)."""

    kind: Literal["arith"] = Field(description="arith: sums such as 4+8+9 → 21, generated from seeds")
    digits: int = Field(2, ge=1, le=6, description="digits per operand (operands 0 to 10^digits − 1)")
    terms: int = Field(3, ge=2, le=8, description="operands per training/eval problem")
    warmstart_terms: int = Field(2, ge=1, le=8, description="operands in most warm-start problems")
    warmstart_digits: int = Field(2, ge=1, le=6, description="digits per warm-start operand")
    warmstart_hard_fraction: float = Field(
        0.25, ge=0, le=1, description="share of warm-start problems of the training shape (terms × digits)"
    )
    n_eval: int = Field(256, ge=1, description="size of the fixed evaluation set")
    seed: int = Field(0, ge=0, description="seeds the evaluation set")

    @model_validator(mode="after")
    def _enough_distinct_problems(self):
        distinct = 10 ** (self.digits * self.terms)
        if self.n_eval * 2 > distinct:
            raise ValueError(
                f"n_eval {self.n_eval} leaves too few training problems: digits={self.digits}, "
                f"terms={self.terms} give {distinct} distinct problems; keep n_eval at most "
                f"{distinct // 2} or raise digits or terms"
            )
        return self


class ArithTask(SeededTask):
    family = "math"
    Settings = Settings

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
