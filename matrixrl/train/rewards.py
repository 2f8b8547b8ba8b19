"""How a turn's reward and advantage are computed: scoring, rewards, group-relative advantages (docs/design.md §2)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import torch
from trl.trainer.utils import nanstd

from matrixrl.tasks.base import Problem, checked_scores
from matrixrl.workflows.base import Episode, Turn

EPS = 1e-4

Scores = Callable[[Problem, str], float]


def score_episodes(task, episodes) -> Scores:
    """Every answer the episodes propose, judge or end with, scored by one ``score_batch`` call.

    Returns a lookup ``score(problem, answer)`` for those pairs.
    """
    pairs: dict[tuple[str, str], Problem] = {}
    for episode in episodes:
        texts = [episode.answer] + [t.answer for t in episode.turns] + [t.judged for t in episode.turns]
        for text in texts:
            if text is not None:
                pairs.setdefault((episode.problem.id, text), episode.problem)
    keys = list(pairs)
    scores = dict(zip(keys, checked_scores(task, [pairs[k] for k in keys], [answer for _, answer in keys])))
    return lambda problem, answer: scores[(problem.id, answer)]


def verdict_score(score_of: Scores, problem: Problem, turn: Turn) -> float:
    """1.0 when a judging turn's verdict (``turn.approved``, as its prompt style read it)
    matches whether the answer it judged (``turn.judged``) is correct, else 0.0."""
    return float(bool(turn.approved) == (score_of(problem, turn.judged) == 1.0))


def assign_rewards(episodes, task, mode: str, scores: Scores | None = None) -> None:
    """Score each episode's final answer, then give every turn its reward (``outcome`` or ``per_agent``:
    docs/design.md §2).

    ``scores``: ``score_episodes(task, episodes)`` where the caller has it.
    """
    score_of = scores or score_episodes(task, episodes)
    for episode in episodes:
        episode.reward = score_of(episode.problem, episode.answer)
        for turn in episode.turns:
            if mode == "outcome":
                turn.reward = episode.reward
            elif turn.answer is not None:
                turn.reward = score_of(episode.problem, turn.answer)
            elif turn.judged is not None:
                turn.reward = verdict_score(score_of, episode.problem, turn)
            else:
                turn.reward = episode.reward


def assign_advantages(episodes: list[Episode], *, scale_rewards: bool, group_by: str = "turn") -> dict[str, int]:
    """Set ``turn.advantage`` in place (grouped by turn or by agent: docs/design.md §2); returns the group
    size seen per role."""
    if group_by not in ("turn", "agent"):
        raise ValueError(f"group_by must be turn or agent, got {group_by!r}")
    groups: dict[tuple, list[Turn]] = defaultdict(list)
    for episode in episodes:
        for turn in episode.turns:
            key = (episode.group, turn.agent, turn.index) if group_by == "turn" else (episode.group, turn.agent)
            groups[key].append(turn)
    sizes: dict[str, int] = {}
    for turns in groups.values():
        rewards = torch.tensor([t.reward for t in turns], dtype=torch.float64)
        centred = rewards - rewards.mean()
        if scale_rewards:
            centred = centred / (nanstd(rewards) + EPS) if len(turns) > 1 else centred * 0
        for turn, advantage in zip(turns, centred.tolist()):
            turn.advantage = advantage
        role = turns[0].role
        sizes[role] = min(sizes.get(role, len(turns)), len(turns))
    return sizes
