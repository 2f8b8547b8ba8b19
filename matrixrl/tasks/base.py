"""What every task provides: seeded problems, a fixed evaluation set, a scorer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class Problem:
    """One question with its reference answer; ``id`` is stable across runs."""

    id: str
    question: str
    answer: str


class Task(Protocol):
    name: str

    def eval_problems(self) -> list[Problem]:
        """The fixed evaluation set: identical for every cell, checkpoint and seed."""

    def train_problems(self, rng: np.random.Generator, n: int) -> list[Problem]:
        """``n`` training problems drawn with ``rng``; never one of the evaluation set."""

    def warmstart_problems(self, rng: np.random.Generator, n: int) -> list[Problem]:
        """Problems for the supervised warm-start of a base model (easier than training)."""

    def score(self, problem: Problem, answer: str) -> float:
        """1.0 when ``answer`` is correct for ``problem``, else 0.0."""
