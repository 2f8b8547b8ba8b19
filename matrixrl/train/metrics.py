"""Per-role metrics of a batch of episodes (docs/design.md §3); for the report only, nothing feeds the loss."""

from __future__ import annotations

from collections import defaultdict

from matrixrl.train.rewards import Scores, score_episodes, verdict_score


def role_metrics(episodes, task, scores: Scores | None = None) -> list[dict]:
    """Long rows ``{"role", "metric", "value"}``; role ``"episode"`` for episode-level ones.

    ``scores`` is ``score_episodes(task, episodes)`` when the caller already has it.
    """
    score_of = scores or score_episodes(task, episodes)
    answers: dict[str, list[float]] = defaultdict(list)
    verdicts: dict[str, list[float]] = defaultdict(list)
    lengths: dict[str, list[int]] = defaultdict(list)
    disagreements: dict[str, list[float]] = defaultdict(list)
    any_correct = []
    for episode in episodes:
        parallel: dict[tuple[str, int], dict[str, str]] = defaultdict(dict)  # (role, turn index) → agent → answer
        for turn in episode.turns:
            if turn.answer is not None:
                parallel[(turn.role, turn.index)][turn.agent] = turn.answer
        for (role, _), by_agent in parallel.items():
            if len(by_agent) > 1:
                disagreements[role].append(float(len(set(by_agent.values())) > 1))
        correct_somewhere = False
        for turn in episode.turns:
            lengths[turn.role].append(len(turn.completion.completion_ids))
            if turn.answer is not None:
                score = score_of(episode.problem, turn.answer)
                answers[turn.role].append(score)
                correct_somewhere |= score == 1.0
            if turn.judged is not None:
                verdicts[turn.role].append(verdict_score(score_of, episode.problem, turn))
        any_correct.append(float(correct_somewhere))
    rows = []
    for role in sorted(lengths):
        rows.append({"role": role, "metric": "response_length", "value": _mean(lengths[role])})
        if answers[role]:
            rows.append({"role": role, "metric": "answer_acc", "value": _mean(answers[role])})
        if verdicts[role]:
            rows.append({"role": role, "metric": "verdict_acc", "value": _mean(verdicts[role])})
        if disagreements[role]:
            rows.append({"role": role, "metric": "disagreement", "value": _mean(disagreements[role])})
    if any_correct:
        rows.append({"role": "episode", "metric": "any_correct", "value": _mean(any_correct)})
    return rows


def _mean(values) -> float:
    return float(sum(values) / len(values))
