"""Which part of a math reply is its answer (``\\boxed{}`` > ``####`` > ``Answer:`` > the last
number > the whole text), scored by a real GSM8K task (math-verify)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from matrixrl.tasks import build_task
from matrixrl.tasks.mathdata import GSM8K_MARK
from matrixrl.tasks.mathdata import Settings as MathSettings
from matrixrl.workflows.styles.chat import extract_math_answer

GSM8K_TEST = Path(__file__).resolve().parents[2] / "shared/data/gsm8k/test.jsonl"

# Worked solutions in GSM8K's style, written for these tests: intermediate quantities
# ("$4.00", "28 days", "20%") that math-verify would take for the answer, then the final line.
LATE_FEES = (
    "The late fee is $0.50 a day, so 8 days cost $0.50 * 8 = $<<0.5*8=4.00>>4.00.\n"
    "Adding the $2.00 processing fee to the answer from the previous step gives "
    "$4.00 + $2.00 = $<<4+2=6.00>>6.00.\n#### 6"
)
PUPPY_WEEKS = (
    "The puppy chews 3 shoes a day for 28 days: 3 * 28 = <<3*28=84>>84 shoes.\n"
    "The answer is asked in weeks, so convert the 28 days: 28 days / 7 days/week = <<28/7=4>>4 weeks.\n#### 4"
)
PAGES_READ = (
    "Tom reads 15 pages on Monday and 45 pages on Tuesday, so 15 + 45 = <<15+45=60>>60 pages.\n"
    "Divide by the book's 300 pages and multiply by 100% to express the answer as a percentage: "
    "60 / 300 * 100% = 20%\n#### 20"
)
SOLUTIONS = [LATE_FEES, PUPPY_WEEKS, PAGES_READ]


def with_final(solution: str, final: str) -> str:
    """``solution`` with its ``#### N`` line replaced by ``#### final``."""
    return solution.rpartition(GSM8K_MARK)[0] + f"{GSM8K_MARK} {final}"


def one_more(solution: str) -> str:
    """``solution`` whose final ``#### N`` is off by one (``#### N+1``)."""
    reference = solution.rpartition(GSM8K_MARK)[2].strip().replace(",", "")
    return with_final(solution, str(int(reference) + 1))


def gsm8k_task(folder: Path, solutions: list[str]):
    """A gsm8k task over one question per solution (the solution gives its reference)."""
    records = [{"question": f"Question {i}?", "answer": s} for i, s in enumerate(solutions)]
    (folder / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "train.jsonl").write_text(json.dumps({"question": "Training question?", "answer": "#### 1"}) + "\n")
    return build_task("gsm8k", MathSettings(kind="gsm8k", path=str(folder), train_split="train", n_eval=None))


def scores(task, replies: list[str]) -> list[float]:
    """Each reply, read by ``extract_math_answer``, scored against the matching problem."""
    problems = task.eval_problems()
    assert len(problems) == len(replies)
    return task.score_batch(problems, [extract_math_answer(r) for r in replies])


# --- the #### line beats earlier numbers --------------------------------------------------------


def test_the_right_final_line_scores_correct_after_stray_numbers(tmp_path: Path) -> None:
    task = gsm8k_task(tmp_path, SOLUTIONS)
    assert scores(task, SOLUTIONS) == [1.0, 1.0, 1.0]


def test_a_wrong_final_line_scores_wrong_though_an_earlier_number_is_right(tmp_path: Path) -> None:
    # PAGES_READ shows "20%" before its final line; reading the whole text would match it.
    task = gsm8k_task(tmp_path, SOLUTIONS)
    assert scores(task, [one_more(s) for s in SOLUTIONS]) == [0.0, 0.0, 0.0]


# --- the order of the rules ------------------------------------------------------------------


@pytest.mark.parametrize(
    "reply, answer",
    [
        ("So \\boxed{18}.\n#### 17", "18"),  # \boxed{} beats ####
        ("#### 17\nOn second thought, \\boxed{18}", "18"),
        ("Answer: 17\n#### 18", "18"),  # #### beats Answer:, wherever each is
        ("#### 18\nFinal answer: 17", "18"),
        ("#### 1,080.", "1,080"),  # the rest of its line, without a closing period
        ("####  \\frac{1}{2}", "\\frac{1}{2}"),
        ("#### 12 then\nmore text 13", "12 then"),  # the last marker, its line only
        ("Answer: 18\nCheck: 18 - 2 = 16", "18"),  # Answer: beats the last number
        ("I think it is 12, no wait, 15", "15"),  # the last number
        ("They pay 2 * $617 = $1,234 in total.", "1234"),  # thousands separators dropped
        ("The temperature falls from 5 to -3 degrees", "-3"),  # a sign is kept ...
        ("From 5-3 we get 2 apples, then 7-3", "3"),  # ... but a minus between numbers is no sign
        ("The price rose by 12.5% to $4.50.", "4.50"),  # $ and % dropped, decimals kept
        ("3 of the 4 cakes are 3/4 of them", "3/4"),  # a fraction is one number
        ("It is \\frac{1}{2}", "It is \\frac{1}{2}"),  # digits inside LaTeX are no number: the whole text
        ("x^2 = 4", "4"),
        ("  five apples \n", "five apples"),  # no number at all: the whole text, stripped
        ("#### Step one\nThe total is 18.", "18"),  # a markdown heading is no final line
    ],
)
def test_the_answer_is_read_by_the_first_rule_that_applies(reply: str, answer: str) -> None:
    assert extract_math_answer(reply) == answer


def test_last_numbers_score_equal_to_their_references(tmp_path: Path) -> None:
    # Replies without any marker: the last number is what math-verify compares.
    task = gsm8k_task(tmp_path, ["#### 15", "#### 1234", "#### -3", "#### 7"])
    replies = [
        "I think the answer is 12, no wait, 15",  # math-verify alone reads the 12 after "answer is"
        "The total is 2 * $617 = $1,234",
        "The answer for noon is 4 degrees; at night it is -3",
        "Of the 28 days, 75% were rainy, so he ran on 28 - 21 = 7",
    ]
    assert scores(task, replies) == [1.0, 1.0, 1.0, 1.0]


# --- every GSM8K test solution, when the data is beside the repo ---------------------------------


@pytest.mark.skipif(
    not (GSM8K_TEST.is_file() and GSM8K_TEST.with_name("train.jsonl").is_file()),
    reason=f"GSM8K's test.jsonl and train.jsonl are not in {GSM8K_TEST.parent} (the shared data beside the repo)",
)
def test_every_gsm8k_worked_solution_scores_by_its_final_line() -> None:
    task = build_task(
        "gsm8k", MathSettings(kind="gsm8k", path=str(GSM8K_TEST.parent), train_split="train", n_eval=None)
    )
    problems = task.eval_problems()  # all of test.jsonl, in file order
    solutions = [json.loads(line)["answer"] for line in GSM8K_TEST.open(encoding="utf-8")]
    assert len(problems) == len(solutions) == 1319
    began = time.perf_counter()
    right = task.score_batch(problems, [extract_math_answer(s) for s in solutions])
    off_by_one = task.score_batch(problems, [extract_math_answer(one_more(s)) for s in solutions])
    print(f"scored {2 * len(solutions)} GSM8K replies in {time.perf_counter() - began:.1f}s")
    assert [i for i, score in enumerate(right) if score != 1.0] == []
    assert [i for i, score in enumerate(off_by_one) if score != 0.0] == []
