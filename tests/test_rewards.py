"""Outcome rewards broadcast to every turn; per-agent rewards score each turn's own answer."""

from __future__ import annotations

from matrixrl.tasks.arith import ArithTask
from matrixrl.tasks.arith import Settings as ArithSettings
from matrixrl.tasks.base import Problem
from matrixrl.train.rewards import assign_rewards
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
