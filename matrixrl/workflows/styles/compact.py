"""The compact prompt style: one-line role prompts for tiny character-level models.

Every prompt is one short line: the question, then a delimiter saying what the completion is
(``=`` an answer, ``?`` a verdict, ``:`` strategy tokens); docs/extending.md, "Prompts".
Templates never parse the question, so they stay task-agnostic.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from matrixrl.tasks.base import Family, Problem
from matrixrl.workflows.styles.roles import RolePrompt

if TYPE_CHECKING:
    import numpy as np

# Strategy vocabulary of the orchestrator: one character each, so N strategies cost N
# tokens (``LRP`` plus EOS fits ``max_new_tokens: 4``). The meanings are hints for
# humans and real LLMs; a tiny model learns whatever RL makes of them.
STRATEGIES: dict[str, str] = {
    "L": "left to right",
    "R": "right to left",
    "P": "pairs first",
    "C": "column by column",
}
DEFAULT_STRATEGY = "L"

# Evaluator verdicts: ``Y`` satisfied; ``N`` + direction feedback otherwise.
VERDICT_YES = "Y"
VERDICT_NO = "N"
FEEDBACK_UP = "+"  # the right answer is larger than the draft
FEEDBACK_DOWN = "-"  # the right answer is smaller than the draft

ANSWER_LIMIT = 8  # characters of a model answer quoted inside another role's prompt
FEEDBACK_LIMIT = 3  # characters of evaluator feedback quoted in a refine prompt

_INTEGER = re.compile(r"-?\d+")


# --- generator ---------------------------------------------------------------------


def generator_compact(problem: Problem) -> str:
    return f"{problem.question}="


def refine_compact(problem: Problem, draft: str, feedback: str) -> str:
    """Generator's refine prompt: its previous draft and the evaluator's feedback, ``4+8+9=20N+=``."""
    return f"{problem.question}={clean_answer(draft)}{clean_answer(feedback, FEEDBACK_LIMIT)}="


# --- evaluator ---------------------------------------------------------------------


def evaluator_compact(problem: Problem, draft: str) -> str:
    """Evaluator's prompt: the question with a draft answer to judge, ``4+8+9=20?``."""
    return f"{problem.question}={clean_answer(draft)}?"


def verdict_for(draft: str, answer: str) -> str:
    """The ideal evaluator completion: ``Y``, else ``N+``/``N-`` (which way to move) or ``N``."""
    draft, answer = clean_answer(draft), answer.strip()
    if draft == answer:
        return VERDICT_YES
    if _is_integer(draft) and _is_integer(answer):
        return VERDICT_NO + (FEEDBACK_UP if int(answer) > int(draft) else FEEDBACK_DOWN)
    return VERDICT_NO


def parse_verdict(text: str) -> tuple[bool, str]:
    """(satisfied, feedback): satisfied only when the completion starts with ``Y``."""
    text = clean_answer(text, FEEDBACK_LIMIT)
    return text.startswith(VERDICT_YES), text


# --- aggregator (voting) -------------------------------------------------------------


def aggregator_compact(problem: Problem, candidates: Sequence[str]) -> str:
    """Aggregator's prompt: the question and the generators' answers, ``4+8+9?21,20,21=``."""
    return f"{problem.question}?{','.join(clean_answer(c) for c in candidates)}="


# --- orchestrator / worker / synthesizer (orch_workers) ------------------------------


def orchestrator_compact(problem: Problem) -> str:
    """Orchestrator's prompt: the question alone, ``4+8+9:`` → strategy tokens ``LRP``."""
    return f"{problem.question}:"


def format_strategies(strategies: Sequence[str]) -> str:
    """The orchestrator completion for ``strategies``: their tokens concatenated, ``LRP``."""
    return "".join(strategies)


def parse_strategies(text: str, n: int) -> list[str]:
    """Exactly ``n`` strategy tokens from an orchestrator completion (unknown characters skipped).

    Fewer than ``n`` are padded by repeating the last one, or ``DEFAULT_STRATEGY`` if none.
    """
    found = [c for c in text if c in STRATEGIES][:n]
    pad = found[-1] if found else DEFAULT_STRATEGY
    return found + [pad] * (n - len(found))


def worker_compact(problem: Problem, strategy: str) -> str:
    """Worker's prompt: one strategy token and the question, ``L|4+8+9=``."""
    return f"{strategy}|{problem.question}="


def synthesizer_compact(problem: Problem, candidates: Sequence[str]) -> str:
    """Synthesizer's prompt: the aggregator's format over the workers' answers, ``4+8+9?21,21,20=``."""
    return aggregator_compact(problem, candidates)


# --- helpers -------------------------------------------------------------------------


def clean_answer(text: str, limit: int = ANSWER_LIMIT) -> str:
    """A completion made safe to quote in a one-line prompt: stripped, commas and blanks as ``_``, short."""
    return re.sub(r"[,\s]", "_", text.strip())[:limit]


def majority(candidates: Sequence[str]) -> str:
    """The most common candidate; ties go to the one that appears first."""
    counts = Counter(candidates)
    return max(candidates, key=lambda c: counts[c])  # max keeps the first of equal keys


def pick_target(candidates: Sequence[str], answer: str) -> str:
    """Warm-start target of an aggregator/synthesizer: the right answer if offered, else the majority."""
    return answer if answer in candidates else majority(candidates)


def _is_integer(text: str) -> bool:
    return bool(_INTEGER.fullmatch(text))


def wrong_answer(answer: str, rng: np.random.Generator, others: Sequence[str] = ()) -> str:
    """A plausible wrong answer: an integer answer off by 1-10 (kept non-negative if it was),
    else another problem's answer, else the answer with a digit appended."""
    if _is_integer(answer):
        value = int(answer)
        offset = int(rng.integers(1, 11)) * (1 if rng.random() < 0.5 else -1)
        if value >= 0 and value + offset < 0:
            offset = -offset
        return str(value + offset)
    pool = sorted({o for o in others if o != answer})
    if pool:
        return pool[int(rng.integers(len(pool)))]
    return answer + "0"


def noisy_candidates(
    answer: str, n: int, rng: np.random.Generator, others: Sequence[str] = ()
) -> list[str]:
    """``n`` candidate answers mixing the right one with wrong ones for warm-start examples.

    Each candidate is right with a probability drawn per example from [0.25, 0.75];
    wrong ones come from a pool of two, so wrong answers also repeat and form majorities.
    """
    p_right = rng.uniform(0.25, 0.75)
    pool = [wrong_answer(answer, rng, others) for _ in range(2)]
    return [answer if rng.random() < p_right else pool[int(rng.integers(2))] for _ in range(n)]


# --- the style object ------------------------------------------------------------------


class CompactStyle:
    """The compact templates behind the ``PromptStyle`` interface; completions are answers as-is."""

    name = "compact"
    strategies = tuple(STRATEGIES)

    def __init__(self, family: Family = "math"):
        self.family = family

    def generator(self, problem: Problem) -> str:
        return generator_compact(problem)

    def refine(self, problem: Problem, draft: str, feedback: str) -> str:
        return refine_compact(problem, draft, feedback)

    def evaluator(self, problem: Problem, draft: str) -> str:
        return evaluator_compact(problem, draft)

    def parse_verdict(self, text: str) -> tuple[bool, str]:
        return parse_verdict(text)

    def verdict_for(self, draft: str, answer: str) -> str:
        return verdict_for(draft, answer)

    def aggregator(self, problem: Problem, candidates: Sequence[str]) -> str:
        return aggregator_compact(problem, candidates)

    def orchestrator(self, problem: Problem, n: int) -> str:
        return orchestrator_compact(problem)  # strategy tokens carry no count

    def parse_strategies(self, text: str, n: int) -> list[str]:
        return parse_strategies(text, n)

    def format_strategies(self, strategies: Sequence[str]) -> str:
        return format_strategies(strategies)

    def worker(self, problem: Problem, strategy: str) -> str:
        return worker_compact(problem, strategy)

    def synthesizer(self, problem: Problem, candidates: Sequence[str]) -> str:
        return synthesizer_compact(problem, candidates)

    def ask(self, role: str, problem: Problem, prompt: RolePrompt, shown: Sequence[str] = ()) -> str:
        """A workflow's own role (``RolePrompt.compact``): the question, and the answers shown, cleaned."""
        return prompt.compact.format(question=problem.question, shown=",".join(clean_answer(c) for c in shown))

    def answer(self, completion: str) -> str:
        return completion

    def target(self, answer: str) -> str:
        return answer
