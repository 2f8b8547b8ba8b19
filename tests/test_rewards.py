"""Outcome rewards broadcast to every turn; per-agent rewards score each turn's own answer."""

from __future__ import annotations

import math

import numpy as np
import pytest

from matrixrl.errors import UserError
from matrixrl.tasks.arith import ArithTask
from matrixrl.tasks.arith import Settings as ArithSettings
from matrixrl.tasks.base import Problem, checked_scores
from matrixrl.train.rewards import assign_rewards, score_episodes
from matrixrl.workflows.base import Completion, Episode, Turn

TASK = ArithTask("arith", ArithSettings(kind="arith"))
PROBLEM = Problem("4+8+9", "4+8+9", "21")


def turn(role, agent, text, index=0, **kw) -> Turn:
    return Turn(role, agent, index, "p", Completion(text, [1], [2]), **kw)


def voting_episode() -> Episode:
    # generator0 right, generator1 wrong, aggregator picks the wrong one.
    turns = [
        turn("generator", "generator0", "21", answer="21"),
        turn("generator", "generator1", "20", answer="20"),
        turn("aggregator", "aggregator0", "20", answer="20"),
    ]
    return Episode(PROBLEM, group=0, turns=turns, answer="20")


def eval_opt_episode() -> Episode:
    # Draft wrong, evaluator rightly says N+, refinement right, a second verdict wrongly says N-.
    turns = [
        turn("generator", "generator0", "20", index=0, answer="20"),
        turn("evaluator", "evaluator0", "N+", index=0, judged="20", approved=False),
        turn("generator", "generator0", "21", index=1, answer="21"),
        turn("evaluator", "evaluator0", "N-", index=1, judged="21", approved=False),
    ]
    return Episode(PROBLEM, group=0, turns=turns, answer="21")


def test_outcome_reward_is_broadcast_to_every_turn():
    episodes = [voting_episode(), eval_opt_episode()]
    assign_rewards(episodes, TASK, "outcome")
    assert [e.reward for e in episodes] == [0.0, 1.0]
    assert [t.reward for t in episodes[0].turns] == [0.0, 0.0, 0.0]
    assert [t.reward for t in episodes[1].turns] == [1.0, 1.0, 1.0, 1.0]


def test_per_agent_reward_scores_each_turn_on_its_own_answer_or_verdict():
    episodes = [voting_episode(), eval_opt_episode()]
    assign_rewards(episodes, TASK, "per_agent")
    assert [e.reward for e in episodes] == [0.0, 1.0]  # the episode outcome is unchanged
    assert [t.reward for t in episodes[0].turns] == [1.0, 0.0, 0.0]
    assert [t.reward for t in episodes[1].turns] == [0.0, 1.0, 1.0, 0.0]


def test_per_agent_reward_falls_back_to_the_outcome_for_plans():
    episode = Episode(
        PROBLEM,
        group=0,
        turns=[turn("orchestrator", "orchestrator0", "LRP"), turn("synthesizer", "synthesizer0", "21", answer="21")],
        answer="21",
    )
    assign_rewards([episode], TASK, "per_agent")
    assert [t.reward for t in episode.turns] == [1.0, 1.0]


class Scorer(ArithTask):
    """The arith task with a plugin's scorer: ``_score_distinct`` returns ``values``."""

    def __init__(self, values):
        super().__init__("arith", ArithSettings(kind="arith"))
        self.values = values

    def _score_distinct(self, pairs):
        return list(self.values)


@pytest.mark.parametrize(
    ("values", "shown"),
    [([0.5], "0.5"), ([None], "None"), ([math.nan], "nan"), ([2.0], "2.0"), ([-1.0], "-1.0"), ([np.float64(0.25)], "0.25"), (["1"], "'1'")],
)
def test_a_score_that_is_not_0_or_1_stops_scoring_with_the_task_kind_and_the_rule(values, shown):
    # Partial credit made accuracy count 0.5 as half right while pass@k, n_correct and
    # a judge's verdict counted it wrong; None or NaN failed later, naming neither.
    with pytest.raises(UserError) as caught:
        assign_rewards([voting_episode()], Scorer(values * 2), "outcome")
    assert str(caught.value) == f"task kind 'arith' scored {shown}; a score must be 0.0 or 1.0 (see docs/extending.md)"


def test_a_score_list_of_the_wrong_length_names_the_task_kind():
    with pytest.raises(UserError) as caught:
        score_episodes(Scorer([1.0]), [voting_episode()])  # two distinct answers, 21 and 20
    assert str(caught.value) == (
        "task kind 'arith': _score_distinct returned 1 scores for 2 (problem, answer) pairs; "
        "it must return one per pair (see docs/extending.md)"
    )

    class Batch:  # a task of its own, not a BatchScorer
        config = ArithSettings(kind="arith")

        def score_batch(self, problems, answers):
            return [1.0] * (len(answers) + 1)

    with pytest.raises(UserError) as caught:
        checked_scores(Batch(), [PROBLEM], ["21"])
    assert str(caught.value) == "task kind 'arith': score_batch returned 2 scores for 1 answers; it must return one per answer (see docs/extending.md)"


def test_bools_and_integers_0_and_1_are_scores():
    assert checked_scores(Scorer([True, np.int64(0)]), [PROBLEM, PROBLEM], ["21", "20"]) == [1.0, 0.0]
