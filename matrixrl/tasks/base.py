"""What every task provides: seeded problems, a fixed evaluation set, a scorer (``score_batch``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, ClassVar, Literal, Protocol

if TYPE_CHECKING:
    import numpy as np


Family = Literal["math", "code"]


@dataclass(frozen=True)
class Problem:
    """One question with its reference answer (the warm-start's target); ``id`` is stable across runs."""

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
        """1.0 when ``answer`` is correct for ``problem``, else 0.0: nothing else (the reward is
        binary, docs/design.md §2); :func:`checked_scores` holds every task to it."""

    def score_batch(self, problems: Sequence[Problem], answers: Sequence[str]) -> list[float]:
        """``score`` for many (problem, answer) pairs at once, in order: one per answer."""


def _kind(task) -> str:
    return getattr(getattr(task, "config", None), "kind", None) or type(task).__name__


def _shown(value) -> str:
    import numpy as np

    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)):
        return repr(float(value))  # 0.5, nan, inf: not numpy's np.float64(0.5)
    return repr(value)


def checked_scores(task, problems: Sequence[Problem], answers: Sequence[str]) -> list[float]:
    """``task.score_batch(problems, answers)``, held to the scoring contract (``Task.score``):
    one score per answer, each 0.0 or 1.0 (a bool too). A task that breaks it stops the job with
    one line naming the task kind, the value and the rule."""
    import numpy as np

    from matrixrl.errors import UserError

    scores = task.score_batch(problems, answers)
    try:
        count = len(scores)
    except TypeError:
        raise UserError(
            f"task kind {_kind(task)!r}: score_batch returned {_shown(scores)}; it must return a list of scores, "
            "one per answer (see docs/extending.md)"
        ) from None
    if count != len(answers):
        raise UserError(
            f"task kind {_kind(task)!r}: score_batch returned {count} scores for {len(answers)} answers; "
            "it must return one per answer (see docs/extending.md)"
        )
    checked = []
    for value in scores:
        number = value if isinstance(value, (bool, int, float, np.bool_, np.integer, np.floating)) else None
        if number is None or number not in (0, 1):  # NaN is neither
            raise UserError(f"task kind {_kind(task)!r} scored {_shown(value)}; a score must be 0.0 or 1.0 (see docs/extending.md)")
        checked.append(float(number))
    return checked


class BatchScorer(ABC):
    """The base of every task: a name, its config, and ``score`` / ``score_batch`` over distinct pairs."""

    Settings: ClassVar[type]

    def __init__(self, name: str, config):
        self.name = name
        self.config = config

    def score(self, problem: Problem, answer: str) -> float:
        return self.score_batch([problem], [answer])[0]

    def score_batch(self, problems: Sequence[Problem], answers: Sequence[str]) -> list[float]:
        if len(problems) != len(answers):
            raise ValueError(f"{len(problems)} problems but {len(answers)} answers")
        distinct: dict[tuple[str, str], tuple[Problem, str]] = {}
        for problem, answer in zip(problems, answers):
            distinct.setdefault((problem.id, answer), (problem, answer))
        pairs = list(distinct.values())
        found = self._score_distinct(pairs) if pairs else []
        if len(found) != len(pairs):  # zip would drop the rest, and a lookup fail with a KeyError
            from matrixrl.errors import UserError

            raise UserError(
                f"task kind {_kind(self)!r}: _score_distinct returned {len(found)} scores for {len(pairs)} "
                "(problem, answer) pairs; it must return one per pair (see docs/extending.md)"
            )
        scores = dict(zip(distinct, found))
        return [scores[(p.id, a)] for p, a in zip(problems, answers)]

    @abstractmethod
    def _score_distinct(self, pairs: list[tuple[Problem, str]]) -> list[float]: ...


class SeededTask(BatchScorer):
    """A synthetic task drawn from a seeded generator (``arith``, ``pyfunc``); training never draws an
    evaluation problem."""

    @abstractmethod
    def _problem(self, rng: np.random.Generator, shape) -> Problem: ...

    @abstractmethod
    def _shape(self): ...

    @abstractmethod
    def _warmstart_shape(self): ...

    @cached_property
    def _eval(self) -> list[Problem]:
        import numpy as np

        rng = np.random.default_rng([self.config.seed, 1])
        seen: dict[str, Problem] = {}
        while len(seen) < self.config.n_eval:
            problem = self._problem(rng, self._shape())
            seen.setdefault(problem.id, problem)
        return list(seen.values())

    @cached_property
    def _eval_ids(self) -> frozenset[str]:
        return frozenset(p.id for p in self._eval)

    def eval_problems(self) -> list[Problem]:
        return list(self._eval)

    def _draw(self, rng: np.random.Generator, n: int, shape: Callable[[], object]) -> list[Problem]:
        problems: list[Problem] = []
        while len(problems) < n:
            problem = self._problem(rng, shape())
            if problem.id not in self._eval_ids:  # splits never overlap
                problems.append(problem)
        return problems

    def train_problems(self, rng: np.random.Generator, n: int) -> list[Problem]:
        return self._draw(rng, n, self._shape)

    def warmstart_problems(self, rng: np.random.Generator, n: int) -> list[Problem]:
        def shape():
            hard = rng.random() < self.config.warmstart_hard_fraction
            return self._shape() if hard else self._warmstart_shape()

        return self._draw(rng, n, shape)
