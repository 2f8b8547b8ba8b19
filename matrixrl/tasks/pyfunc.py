"""Seeded program synthesis for tiny models: write ``f(x)`` from input/output examples (docs/tasks.md)."""

from __future__ import annotations

import ast
import hashlib
import itertools
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from math import comb, prod
from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from matrixrl.settings import RUNTIME, Strict
from matrixrl.tasks.base import Problem, SeededTask
from matrixrl.tasks.code import WITHOUT_VIEW, check_sandbox
from matrixrl.tasks.python_source import defines

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class Family:
    """Functions ``expression(*constants)`` for every combination of the constants' ranges."""

    expression: Callable[..., str]
    ranges: tuple[range, ...]

    @property
    def size(self) -> int:
        return prod(len(r) for r in self.ranges)


def _signed(b: int) -> str:
    return f"+{b}" if b > 0 else str(b)


FAMILIES: dict[str, Family] = {
    "add": Family(lambda b: f"x+{b}", (range(1, 10),)),
    "sub": Family(lambda b: f"x-{b}", (range(1, 10),)),
    "mul": Family(lambda a: f"x*{a}", (range(2, 10),)),
    "neg": Family(lambda b: f"{b}-x", (range(1, 10),)),
    "affine": Family(lambda a, b: f"x*{a}{_signed(b)}", (range(2, 10), tuple(range(-9, 0)) + tuple(range(1, 10)))),
    "square": Family(lambda b: f"x*x{_signed(b)}" if b else "x*x", (range(-9, 10),)),
}

# Every canonical answer the families produce (a few hundred), the only text ever evaluated here.
CANONICAL = frozenset(
    family.expression(*constants)
    for family in FAMILIES.values()
    for constants in itertools.product(*family.ranges)
)
HIDDEN_INPUTS = range(-20, 31)  # hidden tests draw from here, never a shown input


def distinct_problems(families: Sequence[str], examples: int, max_input: int) -> int:
    """How many different questions the families give (functions × sets of shown inputs)."""
    return sum(FAMILIES[f].size for f in set(families)) * comb(max_input + 1, examples)


class Settings(Strict):
    """Seeded program synthesis from input/output examples, run in the sandbox (see matrixrl.tasks.pyfunc)."""

    kind: Literal["pyfunc"] = Field(description="pyfunc: write f(x) from examples such as 1>4,2>5,7>10 → x+3")
    families: list[Literal[tuple(FAMILIES)]] = Field(
        ["add", "sub", "mul", "affine"], min_length=1, description="function families of training/eval problems"
    )
    warmstart_families: list[Literal[tuple(FAMILIES)]] = Field(
        ["add", "sub", "mul"], min_length=1, description="families of most warm-start problems"
    )
    warmstart_hard_fraction: float = Field(
        0.5, ge=0, le=1, description="share of warm-start problems drawn from families instead"
    )
    examples: int = Field(3, ge=3, le=6, description="input/output examples shown (3 determine any family member)")
    max_input: int = Field(9, ge=2, le=99, description="shown inputs are distinct integers 0..max_input")
    hidden_tests: int = Field(4, ge=1, le=20, description="asserts on unshown inputs an answer must pass")
    n_eval: int = Field(256, ge=1, description="size of the fixed evaluation set")
    seed: int = Field(0, ge=0, description="seeds the evaluation set and the hidden tests")
    timeout_s: float = Field(2.0, gt=0, description="sandbox wall-clock limit per answer, in seconds")
    memory_mb: int = Field(256, ge=16, description="sandbox address-space limit per answer, in MiB")
    workers: int = Field(2, ge=1, description="answers run in the sandbox at once", json_schema_extra=RUNTIME)
    without_view: Literal["refuse", "warn"] = Field("refuse", **WITHOUT_VIEW)

    @model_validator(mode="after")
    def _enough_distinct_problems(self):
        if self.examples > self.max_input + 1:
            raise ValueError(
                f"examples {self.examples} need as many distinct inputs, but 0..max_input={self.max_input} "
                f"has {self.max_input + 1}; raise max_input or lower examples"
            )
        distinct = distinct_problems(self.families, self.examples, self.max_input)
        if self.n_eval * 2 > distinct:
            raise ValueError(
                f"n_eval {self.n_eval} leaves too few training problems: families {', '.join(self.families)} "
                f"with examples={self.examples}, max_input={self.max_input} give {distinct} distinct problems; "
                f"keep n_eval at most {distinct // 2} or add families"
            )
        return self


def evaluate(expression: str, x: int) -> int:
    """A canonical expression's value at ``x``; only ``CANONICAL`` text is accepted."""
    if expression not in CANONICAL:
        raise ValueError(f"{expression!r} is not a canonical pyfunc answer")
    return int(eval(expression, {"__builtins__": {}}, {"x": x}))  # our own arithmetic text


@lru_cache(maxsize=65536)
def hidden_cases(problem: Problem, n: int, seed: int) -> tuple[tuple[int, int], ...]:
    """``n`` (input, output) pairs on inputs the question did not show, drawn from its hash.

    Derived from the problem alone (a problem carries no state).
    """
    import numpy as np

    shown = {int(pair.split(">")[0]) for pair in problem.question.split(",")}
    pool = [x for x in HIDDEN_INPUTS if x not in shown]
    digest = int.from_bytes(hashlib.sha256(problem.question.encode()).digest()[:8], "little")
    inputs = np.random.default_rng([seed, digest]).choice(pool, size=n, replace=False).tolist()
    return tuple((int(x), evaluate(problem.answer, int(x))) for x in inputs)


def hidden_tests(problem: Problem, n: int, seed: int) -> str:
    """The hidden cases as asserts on ``f``, run in the sandbox after the answer's program."""
    # The tests call f in a process of their own (the sandbox's entry_point), and get
    # back plain values; the type check also keeps a bool or a float from passing.
    return "".join(f"r = f({x})\nassert type(r) is int and r == {y}\n" for x, y in hidden_cases(problem, n, seed))


# Integer arithmetic on x: what nearly every answer of a tiny model is. Such an answer
# is computed here by walking its syntax tree (nothing is executed), exactly as Python
# would compute it; anything else (calls, names, attributes, powers) runs in the sandbox.
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
ARITHMETIC_MAX_CHARS = 64  # bounds the size of every intermediate value


def arithmetic(answer: str) -> ast.expr | None:
    """The answer's syntax tree if it is integer arithmetic on ``x`` (+ - * // %, signs, int literals)."""
    text = answer.strip()
    if len(text) > ARITHMETIC_MAX_CHARS or not is_expression(text):
        return None
    tree = ast.parse(text, mode="eval").body
    for node in ast.walk(tree):
        if isinstance(node, (ast.operator, ast.unaryop, ast.expr_context)):
            continue  # the operator tokens of the nodes checked below
        allowed = (
            (isinstance(node, ast.BinOp) and type(node.op) in _BINARY)
            or (isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY)
            or (isinstance(node, ast.Name) and node.id == "x")
            or (isinstance(node, ast.Constant) and type(node.value) is int)
        )
        if not allowed:
            return None
    return tree


def arithmetic_value(tree: ast.expr, x: int) -> int:
    """An ``arithmetic`` tree's value at ``x``; raises ZeroDivisionError as Python would."""
    if isinstance(tree, ast.Constant):
        return tree.value
    if isinstance(tree, ast.Name):
        return x
    if isinstance(tree, ast.UnaryOp):
        return _UNARY[type(tree.op)](arithmetic_value(tree.operand, x))
    return _BINARY[type(tree.op)](arithmetic_value(tree.left, x), arithmetic_value(tree.right, x))


def program(answer: str) -> str:
    """The program an answer stands for: ``def f(x): return <answer>``."""
    return f"def f(x):\n    return {answer.strip()}\n"


def is_expression(answer: str) -> bool:
    """Whether ``answer`` parses as one Python expression (checked before any sandbox run)."""
    text = answer.strip()
    if not text or "\n" in text:
        return False
    try:
        ast.parse(text, mode="eval")
    except (SyntaxError, ValueError):
        return False
    return True


class PyfuncTask(SeededTask):
    family = "code"
    Settings = Settings
    # Compute integer-arithmetic answers without the sandbox (bench/pyfunc_scoring.py
    # turns it off to time the sandbox alone; tests check both agree).
    arithmetic_in_process = True

    def _problem(self, rng: np.random.Generator, families: Sequence[str]) -> Problem:
        cfg = self.config
        family = FAMILIES[families[int(rng.integers(len(families)))]]
        constants = [r[int(rng.integers(len(r)))] for r in family.ranges]
        expression = family.expression(*constants)
        shown = sorted(rng.choice(cfg.max_input + 1, size=cfg.examples, replace=False).tolist())
        question = ",".join(f"{x}>{evaluate(expression, x)}" for x in shown)
        return Problem(id=question, question=question, answer=expression)

    def _shape(self) -> Sequence[str]:
        return self.config.families

    def _warmstart_shape(self) -> Sequence[str]:
        return self.config.warmstart_families

    def tests(self, problem: Problem) -> str:
        return hidden_tests(problem, self.config.hidden_tests, self.config.seed)

    def _passes_in_process(self, problem: Problem, tree: ast.expr) -> bool:
        try:
            return all(
                arithmetic_value(tree, x) == y
                for x, y in hidden_cases(problem, self.config.hidden_tests, self.config.seed)
            )
        except ZeroDivisionError:
            return False

    def _score_distinct(self, pairs: list[tuple[Problem, str]]) -> list[float]:
        from matrixrl.sandbox import run_many

        cfg = self.config
        check_sandbox(cfg.without_view, self.name)
        scores = [0.0] * len(pairs)
        jobs, runnable = [], []
        for i, (problem, answer) in enumerate(pairs):
            if is_expression(answer):
                tree = arithmetic(answer) if self.arithmetic_in_process else None
                if tree is not None:
                    scores[i] = 1.0 if self._passes_in_process(problem, tree) else 0.0
                    continue
                code = program(answer)
            elif defines(answer, "f"):  # a whole function, as a chat model writes it
                code = answer
            else:
                continue  # fails without a run
            runnable.append(i)
            jobs.append((code, self.tests(problem), "f"))
        results = run_many(jobs, timeout_s=cfg.timeout_s, memory_mb=cfg.memory_mb, workers=cfg.workers) if jobs else []
        for i, result in zip(runnable, results):
            scores[i] = 1.0 if result.passed else 0.0
        return scores
