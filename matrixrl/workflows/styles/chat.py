"""The chat prompt style: role prompts as chats for instruct models.

A system message (what the role does, how to answer) and a user message, rendered with the
tokenizer's chat template. How replies are read: docs/tasks.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from pydantic import Field

from matrixrl.settings import Strict
from matrixrl.tasks.base import Family, Problem
from matrixrl.workflows.styles.roles import RolePrompt

VERDICT_CORRECT = "VERDICT: CORRECT"
VERDICT_INCORRECT = "VERDICT: INCORRECT"
DEFAULT_STRATEGY = "Solve the problem directly, step by step."
ELLIPSIS = "[...] "

_NOUN: dict[Family, str] = {"math": "math", "code": "programming"}
_ANSWER_FORMAT: dict[Family, str] = {
    "math": "Reason briefly, step by step, then give the final answer in \\boxed{}.",
    "code": "Reply with one ```python code block that defines the requested function, complete and runnable.",
}
# Strategies the warm-start may draw plans from (chat-style models are never warm-started
# by matrixrl, but the style offers every target so any workflow can use it).
STRATEGIES = (
    "Work forwards from what is given, one step at a time.",
    "Work backwards from what is asked.",
    "Split the problem into smaller parts and solve each.",
    "Solve it, then check the result with a second method.",
)

_VERDICT = re.compile(r"VERDICT:\W*(CORRECT|INCORRECT)", re.IGNORECASE)
_NUMBERED = re.compile(r"^\W*\d+\s*[.):]\s*(.+?)\s*$", re.MULTILINE)
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)
_ANSWER_LINE = re.compile(r"answer\s*:(.*)", re.IGNORECASE)
_GSM8K_LINE = re.compile(r"####[ \t]*([-+$\\\d.].*)")
# A number as written in prose; a minus is a sign only where no operand precedes it (5-3).
_NUMBER = re.compile(
    r"(?:(?<![\w)\]}])-)?(?<![\w.{}^\\])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?(?![\w{}^])"
)


class PromptSettings(Strict):
    """Settings of the chat style (the compact style has fixed, tiny limits)."""

    quote_chars: int = Field(
        1500, ge=50, description="characters of another turn's completion quoted into a prompt (its end is kept)"
    )
    strategy_chars: int = Field(300, ge=20, description="characters kept of each orchestrator strategy")
    thinking: bool = Field(
        False, description="passed to the chat template as enable_thinking (Qwen3's reasoning mode)"
    )


class ChatStyle:
    """Role prompts rendered with ``tokenizer``'s chat template for a task of ``family``."""

    name = "chat"
    strategies = STRATEGIES

    def __init__(self, tokenizer, family: Family, settings: PromptSettings | None = None):
        if family not in _NOUN:
            raise ValueError(f"chat prompts cover task families {', '.join(_NOUN)}, not {family!r}")
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise ValueError("the chat prompt style needs a tokenizer with a chat template")
        self.tokenizer = tokenizer
        self.family = family
        self.settings = settings or PromptSettings()
        self._noun = _NOUN[family]
        self._format = _ANSWER_FORMAT[family]
        self._guidance: dict[str, str] = {}
        self._guided: frozenset[str] = frozenset()

    # --- rendering --------------------------------------------------------------------

    def render(self, system: str, user: str) -> str:
        """The chat as the model sees it, up to the start of the assistant's reply."""
        return self.tokenizer.apply_chat_template(
            [{"role": "system", "content": system}, {"role": "user", "content": user}],
            add_generation_prompt=True,
            tokenize=False,
            enable_thinking=self.settings.thinking,  # templates without the switch ignore it
        )

    def quote(self, text: str) -> str:
        """A completion as quoted in another prompt: stripped, its last ``quote_chars`` characters."""
        text = text.strip()
        limit = self.settings.quote_chars
        return text if len(text) <= limit else ELLIPSIS + text[-limit:]

    # --- roles --------------------------------------------------------------------------

    def guide(self, blocks: Mapping[str, str], roles: Sequence[str]) -> None:
        """Put ``blocks[problem id]`` (a memory's guidance text) at the start of the user message of
        every prompt ``roles`` write about that problem (docs/memcollab.md, "Retrieval and use").
        A problem without a block, and every other role, keeps its prompt byte for byte."""
        self._guidance = {problem: block for problem, block in blocks.items() if block}
        self._guided = frozenset(roles)

    def _role(self, role: str, problem: Problem, system: str, user: str) -> str:
        block = self._guidance.get(problem.id) if role in self._guided else None
        return self.render(system, f"{block}\n\n{user}" if block else user)

    def generator(self, problem: Problem) -> str:
        return self._role("generator", problem, f"You solve {self._noun} problems. {self._format}", problem.question)

    def refine(self, problem: Problem, draft: str, feedback: str) -> str:
        return self._role(
            "generator",
            problem,
            f"You solve {self._noun} problems and improve your solutions using a reviewer's feedback. {self._format}",
            f"Problem:\n{problem.question}\n\nYour previous solution:\n{self.quote(draft)}\n\n"
            f"Reviewer's feedback:\n{self.quote(feedback)}\n\nWrite a corrected, complete solution.",
        )

    def evaluator(self, problem: Problem, draft: str) -> str:
        return self._role(
            "evaluator",
            problem,
            f"You review a proposed solution to a {self._noun} problem. Check it step by step and point "
            "out any mistake briefly. End with exactly one line: "
            f"'{VERDICT_CORRECT}' if the solution is right, or '{VERDICT_INCORRECT}' if it is wrong.",
            f"Problem:\n{problem.question}\n\nProposed solution:\n{self.quote(draft)}",
        )

    def aggregator(self, problem: Problem, candidates: Sequence[str]) -> str:
        return self._choose_among("aggregator", problem, candidates)

    def orchestrator(self, problem: Problem, n: int) -> str:
        return self._role(
            "orchestrator",
            problem,
            f"You plan how a team of {n} agents solves a {self._noun} problem. Propose {n} different "
            f"strategies for solving it, one per line, numbered 1 to {n}, each one short sentence. "
            "Do not solve the problem yourself.",
            problem.question,
        )

    def worker(self, problem: Problem, strategy: str) -> str:
        return self._role(
            "worker",
            problem,
            f"You solve {self._noun} problems following the strategy you are given. {self._format}",
            f"Strategy: {strategy}\n\nProblem:\n{problem.question}",
        )

    def synthesizer(self, problem: Problem, candidates: Sequence[str]) -> str:
        return self._choose_among("synthesizer", problem, candidates)

    # The roles that read every candidate and then answer the problem themselves.
    _CHOOSING = {
        "aggregator": "Several agents solved the same {noun} problem independently. Compare their solutions "
        "and decide on the right one.",
        "synthesizer": "Workers solved the same {noun} problem, each following a different strategy. Compare "
        "their solutions and give the final one.",
    }

    def _choose_among(self, role: str, problem: Problem, candidates: Sequence[str]) -> str:
        instruction = self._CHOOSING[role].format(noun=self._noun)
        return self._role(role, problem, f"{instruction} {self._format}", self._with_candidates(problem, candidates))

    def _with_candidates(self, problem: Problem, candidates: Sequence[str]) -> str:
        shown = "\n\n".join(f"Solution {i + 1}:\n{self.quote(c)}" for i, c in enumerate(candidates))
        return f"Problem:\n{problem.question}\n\n{shown}"

    def ask(self, role: str, problem: Problem, prompt: RolePrompt, shown: Sequence[str] = ()) -> str:
        """A workflow's own role (``RolePrompt.instruction``): the problem, and the completions
        ``shown`` quoted as numbered solutions, as the aggregator sees its candidates."""
        system = prompt.instruction.format(noun=self._noun)
        if prompt.answers:
            system = f"{system} {self._format}"
        return self._role(role, problem, system, self._with_candidates(problem, shown) if shown else problem.question)

    # --- reading completions ----------------------------------------------------------------

    def answer(self, completion: str) -> str:
        return extract_math_answer(completion) if self.family == "math" else extract_code(completion)

    def parse_verdict(self, text: str) -> tuple[bool, str]:
        verdicts = _VERDICT.findall(text)
        return bool(verdicts) and verdicts[-1].upper() == "CORRECT", self.quote(text)

    def parse_strategies(self, text: str, n: int) -> list[str]:
        found = _NUMBERED.findall(text) or [line.strip() for line in text.splitlines() if line.strip()]
        found = [s.strip("* ")[: self.settings.strategy_chars] for s in found]
        found = [s for s in found if s][:n]
        pad = found[-1] if found else DEFAULT_STRATEGY
        return found + [pad] * (n - len(found))

    # --- warm-start targets ------------------------------------------------------------------

    def target(self, answer: str) -> str:
        if self.family == "math":
            return f"The answer is \\boxed{{{answer}}}."
        return f"```python\n{answer}\n```"

    def verdict_for(self, draft: str, answer: str) -> str:
        if self.answer(draft).strip() == answer.strip():
            return f"The solution is right.\n{VERDICT_CORRECT}"
        return f"The final answer is wrong.\n{VERDICT_INCORRECT}"

    def format_strategies(self, strategies: Sequence[str]) -> str:
        return "\n".join(f"{i + 1}. {s}" for i, s in enumerate(strategies))


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` whose braces close, or None."""
    start = text.rfind("\\boxed")
    while start != -1:
        opening = start + len("\\boxed")
        while opening < len(text) and text[opening] == " ":
            opening += 1
        if opening < len(text) and text[opening] == "{":
            depth = 0
            for end in range(opening, len(text)):
                depth += {"{": 1, "}": -1}.get(text[end], 0)
                if depth == 0:
                    return text[opening + 1 : end].strip()
        start = text.rfind("\\boxed", 0, start)
    return None


def extract_math_answer(completion: str) -> str:
    """Last ``\\boxed{}``, else the last ``#### N`` line, else the last ``Answer:`` line, else the
    last number, else the whole text (the module docstring has the details)."""
    boxed = last_boxed(completion)
    if boxed is not None:
        return boxed
    for marker in (_GSM8K_LINE, _ANSWER_LINE):
        lines = marker.findall(completion)
        if lines:
            return lines[-1].strip().rstrip(".").strip()
    numbers = _NUMBER.findall(completion)
    if numbers:
        return numbers[-1].replace(",", "")
    return completion.strip()


def extract_code(completion: str) -> str:
    """The first python (or untagged) fenced block, else the whole completion."""
    block = _FENCE.search(completion)
    return block.group(1).strip("\n") if block else completion.strip()
