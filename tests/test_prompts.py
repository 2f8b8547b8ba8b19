"""Prompt styles: the chat style's prompts, answer extraction and parsing; one workflow code for both styles."""

from __future__ import annotations

import numpy as np
import pytest

from matrixrl.models.tiny import build_char_tokenizer
from matrixrl.tasks.base import Problem
from matrixrl.workflows import build_workflow
from matrixrl.workflows.base import Completion
from matrixrl.workflows.styles import PromptSettings, build_style
from matrixrl.workflows.styles import compact as P
from matrixrl.workflows.styles.chat import (
    DEFAULT_STRATEGY,
    ELLIPSIS,
    ChatStyle,
    extract_code,
    extract_math_answer,
    last_boxed,
)

# A chat template in the usual shape (role markers, a generation prompt), plus Qwen3's
# thinking switch, on the character tokenizer so these tests need no real model.
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% if enable_thinking is defined and not enable_thinking %}"
    "<think></think>{% endif %}{% endif %}"
)
PROBLEM = Problem("p1", "What is 4+8+9?", "21")


@pytest.fixture(scope="module")
def tokenizer():
    tok = build_char_tokenizer()
    tok.chat_template = TEMPLATE
    return tok


def chat(tokenizer, family="math", **settings) -> ChatStyle:
    return build_style("chat", family, tokenizer, PromptSettings(**settings))


class FakeGenerate:
    """Answers each prompt with ``reply(role, prompt)`` and records the calls."""

    def __init__(self, reply):
        self.reply = reply
        self.calls: list[tuple[str, list[str]]] = []

    def __call__(self, role, prompts):
        self.calls.append((role, list(prompts)))
        return [Completion(self.reply(role, p), [1], [2]) for p in prompts]


# --- rendering ---------------------------------------------------------------------------


def test_chat_prompt_is_the_rendered_template_with_system_and_user(tokenizer):
    style = chat(tokenizer)
    prompt = style.generator(PROBLEM)
    expected = tokenizer.apply_chat_template(
        [
            {"role": "system", "content": "You solve math problems. Reason briefly, step by step, then give the final answer in \\boxed{}."},
            {"role": "user", "content": "What is 4+8+9?"},
        ],
        add_generation_prompt=True,
        tokenize=False,
        enable_thinking=False,
    )
    assert prompt == expected
    assert prompt.startswith("<|system|>You solve math problems.") and prompt.endswith("<|assistant|><think></think>")
    assert chat(tokenizer, thinking=True).generator(PROBLEM).endswith("<|assistant|>")


def test_instructions_follow_the_task_family(tokenizer):
    math, code = chat(tokenizer, "math"), chat(tokenizer, "code")
    assert "\\boxed{}" in math.generator(PROBLEM) and "```python" not in math.generator(PROBLEM)
    assert "```python code block" in code.generator(PROBLEM) and "programming" in code.generator(PROBLEM)
    for style in (math, code):
        assert "VERDICT: CORRECT" in style.evaluator(PROBLEM, "d") and "VERDICT: INCORRECT" in style.evaluator(PROBLEM, "d")
        assert "Propose 4 different strategies" in style.orchestrator(PROBLEM, 4)
        assert "Strategy: Work backwards.\n\nProblem:\nWhat is 4+8+9?" in style.worker(PROBLEM, "Work backwards.")


def test_role_prompts_show_what_the_role_judges_or_chooses(tokenizer):
    style = chat(tokenizer)
    assert "Proposed solution:\nso \\boxed{20}<|end|>" in style.evaluator(PROBLEM, "  so \\boxed{20}\n")
    refine = style.refine(PROBLEM, "so \\boxed{20}", "Too small.\nVERDICT: INCORRECT")
    assert "Your previous solution:\nso \\boxed{20}\n\nReviewer's feedback:\nToo small.\nVERDICT: INCORRECT" in refine
    agg = style.aggregator(PROBLEM, ["a \\boxed{21}", "b \\boxed{20}"])
    assert "Problem:\nWhat is 4+8+9?\n\nSolution 1:\na \\boxed{21}\n\nSolution 2:\nb \\boxed{20}<|end|>" in agg
    assert "Solution 3:\nc" in style.synthesizer(PROBLEM, ["a", "b", "c"])


def test_long_completions_are_quoted_by_their_end(tokenizer):
    style = chat(tokenizer, quote_chars=60)
    long = "x" * 500 + " so the answer is \\boxed{21}"
    quoted = style.quote(long)
    assert quoted == ELLIPSIS + long[-60:] and quoted.endswith("\\boxed{21}")
    assert style.quote("  short  ") == "short"
    assert quoted in style.evaluator(PROBLEM, long) and long not in style.evaluator(PROBLEM, long)


def test_chat_needs_a_chat_template_and_a_known_family():
    with pytest.raises(ValueError, match="needs a tokenizer with a chat template"):
        build_style("chat", "math", build_char_tokenizer())
    tok = build_char_tokenizer()
    tok.chat_template = TEMPLATE
    with pytest.raises(ValueError, match="not 'poetry'"):
        build_style("chat", "poetry", tok)
    with pytest.raises(ValueError, match="unknown prompt style 'fancy'; use one of: compact, chat"):
        build_style("fancy")


# --- reading completions -------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, answer",
    [
        ("4+8=12, 12+9=21, so \\boxed{21}.", "21"),
        ("first \\boxed{20}, no wait: \\boxed{21}", "21"),  # the last one
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # nested braces
        ("\\boxed { 7 }", "7"),
        ("\\boxed{21} then \\boxed{2", "21"),  # an unclosed box (cut off) is skipped
        ("We add them.\nAnswer: 21.", "21"),
        ("answer: 3\nANSWER: 5", "5"),
        ("  21 \n", "21"),  # no marker: the whole completion
    ],
)
def test_math_answer_extraction(completion, answer):
    assert extract_math_answer(completion) == answer


def test_last_boxed_without_a_box():
    assert last_boxed("no box here") is None
    assert last_boxed("\\boxed{") is None


@pytest.mark.parametrize(
    "completion, code",
    [
        ("Here:\n```python\ndef f(x):\n    return x + 1\n```\nDone.", "def f(x):\n    return x + 1"),
        ("```py\nreturn 1\n```", "return 1"),
        ("```\nx = 1\n```", "x = 1"),
        ("```python\ndef f():\n    return 1\n```\n```python\nprint(2)\n```", "def f():\n    return 1"),  # the first
        ("```python\ndef f():\n    return", "def f():\n    return"),  # cut off inside the fence
        ("def f():\n    return 2\n", "def f():\n    return 2"),  # no fence: the whole completion
    ],
)
def test_code_extraction(completion, code):
    assert extract_code(completion) == code


def test_answer_depends_on_family(tokenizer):
    assert chat(tokenizer, "math").answer("so \\boxed{21}") == "21"
    assert chat(tokenizer, "code").answer("```python\nreturn 1\n```") == "return 1"
    for family, answer in (("math", "21"), ("code", "def f():\n    return 1")):
        style = chat(tokenizer, family)
        assert style.answer(style.target(answer)) == answer


@pytest.mark.parametrize(
    "text, satisfied",
    [
        ("Looks right.\nVERDICT: CORRECT", True),
        ("Step 2 is wrong.\nVERDICT: INCORRECT", False),
        ("verdict: **correct**", True),
        ("VERDICT: CORRECT at first, but no.\nVERDICT: INCORRECT", False),  # the last verdict counts
        ("I think it is fine.", False),  # no verdict approves nothing
    ],
)
def test_parse_verdict(tokenizer, text, satisfied):
    assert chat(tokenizer).parse_verdict(text) == (satisfied, text.strip())


def test_parse_strategies(tokenizer):
    style = chat(tokenizer, strategy_chars=20)
    text = "Plan:\n1. Add left to right.\n2) Pair the tens.\n**3.** Count up from the largest number of all.\n4. Extra."
    assert style.parse_strategies(text, 3) == ["Add left to right.", "Pair the tens.", "Count up from the la"]
    assert style.parse_strategies("1. Only one.", 3) == ["Only one."] * 3
    assert style.parse_strategies("Go forwards.\n\nGo backwards.", 2) == ["Go forwards.", "Go backwards."]
    assert style.parse_strategies("", 2) == [DEFAULT_STRATEGY] * 2


# --- one workflow code, both styles ------------------------------------------------------------


def test_voting_with_chat_prompts_extracts_answers(tokenizer):
    style = chat(tokenizer)
    gen = FakeGenerate(lambda role, prompt: "so \\boxed{21}" if role == "aggregator" else "I get \\boxed{20}")
    episodes = build_workflow("voting", {"n_votes": 2}, style).run([PROBLEM, PROBLEM], [0, 0], gen)
    assert [(r, len(p)) for r, p in gen.calls] == [("generator", 4), ("aggregator", 2)]
    assert gen.calls[0][1] == [style.generator(PROBLEM)] * 4
    assert gen.calls[1][1] == [style.aggregator(PROBLEM, ["I get \\boxed{20}"] * 2)] * 2
    for episode in episodes:
        assert [t.answer for t in episode.turns] == ["20", "20", "21"]
        assert episode.answer == "21"


def test_eval_opt_with_chat_prompts_reads_verdicts(tokenizer):
    style = chat(tokenizer)
    replies = {"generator": iter(["\\boxed{20}", "\\boxed{21}"]), "evaluator": iter(["Too small.\nVERDICT: INCORRECT", "VERDICT: CORRECT"])}
    gen = FakeGenerate(lambda role, prompt: next(replies[role]))
    (episode,) = build_workflow("eval_opt", {"max_iterations": 3}, style).run([PROBLEM], [0], gen)
    assert [(t.role, t.index) for t in episode.turns] == [("generator", 0), ("evaluator", 0), ("generator", 1), ("evaluator", 1)]
    assert [t.approved for t in episode.turns] == [None, False, None, True]
    assert [t.judged for t in episode.turns] == [None, "20", None, "21"]
    assert episode.turns[1].prompt == style.evaluator(PROBLEM, "\\boxed{20}")
    assert episode.turns[2].prompt == style.refine(PROBLEM, "\\boxed{20}", "Too small.\nVERDICT: INCORRECT")
    assert episode.answer == "21"


def test_eval_opt_defaults_to_fewer_iterations_for_code(tokenizer):
    gen = FakeGenerate(lambda role, prompt: "VERDICT: INCORRECT" if role == "evaluator" else "```python\nreturn 1\n```")
    (episode,) = build_workflow("eval_opt", {}, chat(tokenizer, "code")).run([PROBLEM], [0], gen)
    assert [t.role for t in episode.turns] == ["generator", "evaluator", "generator"]
    assert episode.answer == "return 1"


def test_orch_workers_with_chat_prompts_parses_numbered_strategies(tokenizer):
    style = chat(tokenizer)
    plan = "1. Add the first two.\n2. Add the last two.\n3. Add all at once."

    def reply(role, prompt):
        return {"orchestrator": plan, "worker": "\\boxed{21}", "synthesizer": "\\boxed{21}"}[role]

    gen = FakeGenerate(reply)
    (episode,) = build_workflow("orch_workers", {"n_workers": 3}, style).run([PROBLEM], [0], gen)
    assert gen.calls[0][1] == [style.orchestrator(PROBLEM, 3)]
    assert [t.prompt for t in episode.turns[1:4]] == [
        style.worker(PROBLEM, s) for s in ("Add the first two.", "Add the last two.", "Add all at once.")
    ]
    assert episode.turns[4].prompt == style.synthesizer(PROBLEM, ["\\boxed{21}"] * 3)
    assert episode.answer == "21" and episode.turns[0].answer is None


def test_compact_style_object_is_the_compact_templates():
    style = build_style("compact")
    p = Problem("4+8+9", "4+8+9", "21")
    assert style.generator(p) == P.generator_compact(p) == "4+8+9="
    assert style.evaluator(p, "20") == "4+8+9=20?"
    assert style.refine(p, "20", "N+") == "4+8+9=20N+="
    assert style.aggregator(p, ["21", "20"]) == style.synthesizer(p, ["21", "20"]) == "4+8+9?21,20="
    assert style.orchestrator(p, 3) == "4+8+9:" and style.worker(p, "L") == "L|4+8+9="
    assert style.answer(" 21") == " 21" and style.target("21") == "21"  # completions are answers as-is
    assert style.parse_verdict("N+") == (False, "N+") and style.parse_strategies("LR", 3) == ["L", "R", "R"]


@pytest.mark.parametrize("name", ["voting", "eval_opt", "orch_workers"])
def test_warmstart_pairs_in_chat_style_are_well_formed(tokenizer, name):
    style = chat(tokenizer)
    problems = [Problem(str(i), f"What is {i}+1?", str(i + 1)) for i in range(5)]
    pairs = build_workflow(name, None, style).warmstart_pairs(problems, np.random.default_rng(0))
    assert pairs and all(prompt.startswith("<|system|>") and prompt.endswith("<think></think>") for prompt, _ in pairs)
    targets = [t for _, t in pairs]
    assert any(style.answer(t) == "1" for t in targets)  # the right answer, in the style's form
    if name == "eval_opt":
        assert {style.parse_verdict(t)[0] for t in targets if "VERDICT" in t} == {True, False}
