"""Math word problems from files, scored by mathematical equivalence (docs/tasks.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from matrixrl.errors import DataError
from matrixrl.tasks import files
from matrixrl.tasks.base import Problem
from matrixrl.tasks.equivalence import equivalent_batch
from matrixrl.tasks.files import FileTask, field, question_key

GSM8K_MARK = "####"


class Settings(files.Settings):
    """Math problems from files, scored by mathematical equivalence (see matrixrl.tasks.mathdata).

    gsm8k: question + answer ending '#### N'; math: problem + answer or a \\boxed{} solution;
    math_generic: prompt + answer.
    """

    kind: Literal["gsm8k", "math", "math_generic"] = Field(
        description="the record format: gsm8k (question, answer ending '#### N'), math (problem, answer or a "
        "solution with a \\boxed{} answer) or math_generic (prompt, answer)"
    )
    verify_timeout_s: int = Field(2, ge=1, description="math-verify's limit per parse or comparison, in seconds")

    @model_validator(mode="after")
    def _needs_data(self):
        if self.path is None and self.hub is None:
            raise ValueError("set path (a file or folder of the data) or hub (a dataset id)")
        return self


def gsm8k_reference(solution: str, where: str) -> str:
    """The final answer of a GSM8K solution: the text after its last ``####``."""
    _, mark, final = solution.rpartition(GSM8K_MARK)
    if not mark or not final.strip():
        raise DataError("path", f"{where}: its answer has no final '#### <number>' line")
    return final.strip()


def boxed_reference(solution: str, where: str) -> str:
    """The content of a MATH solution's last ``\\boxed{}``."""
    from latex2sympy2_extended.math_normalization import extract_boxed_content

    found = extract_boxed_content(solution) if "\\boxed" in solution or "\\fbox" in solution else ""
    if not found.strip():
        raise DataError("path", f"{where} has no 'answer' field and its solution no \\boxed{{}} answer")
    return found.strip()


class MathTask(FileTask):
    family = "math"
    Settings = Settings

    def _problem(self, record: dict, where: str) -> Problem:
        kind = self.config.kind
        if kind == "gsm8k":
            question = field(record, "question", where)
            answer = gsm8k_reference(field(record, "answer", where), where)
        elif kind == "math":
            question = field(record, "problem", where)
            if record.get("answer") is not None:
                answer = field(record, "answer", where)
            else:
                answer = boxed_reference(field(record, "solution", where), where)
        else:
            question = field(record, "prompt", where)
            answer = field(record, "answer", where)
        return Problem(id=question_key(question), question=question, answer=answer.strip())

    def _score_distinct(self, pairs: list[tuple[Problem, str]]) -> list[float]:
        matches = equivalent_batch([(p.answer, a) for p, a in pairs], self.config.verify_timeout_s)
        return [1.0 if match else 0.0 for match in matches]
