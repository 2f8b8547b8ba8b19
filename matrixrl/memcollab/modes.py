"""The memory modes: which trajectories each one needs and which pairs it distils (docs/memcollab.md)."""

from __future__ import annotations

from collections.abc import Iterable

from matrixrl.memcollab.data import Pair, Trajectory

MODES = ("none", "own", "transfer", "self_contrast", "memcollab")
CONTRAST_SAMPLES = 4  # self-contrast's default samples per problem


def _other(mode: str, consumer: str, weak: str, strong: str) -> str:
    """Checks the mode and models; returns the model that is not the consumer."""
    if mode not in MODES:
        raise ValueError(f"memory mode {mode!r} is not one of {', '.join(MODES)}")
    if consumer not in (weak, strong):
        raise ValueError(f"the consumer {consumer!r} must be the weak ({weak!r}) or the strong ({strong!r}) model")
    if weak == strong and mode in ("transfer", "memcollab"):
        raise ValueError(f"memory mode {mode!r} needs two different models, got {weak!r} twice")
    return strong if consumer == weak else weak


def needed_trajectories(
    mode: str, consumer: str, weak: str, strong: str, samples: int = CONTRAST_SAMPLES
) -> set[tuple[str, int]]:
    """The (model, samples per problem) collections ``mode`` distils from; ``samples`` is self-contrast's."""
    other = _other(mode, consumer, weak, strong)
    if mode == "self_contrast" and samples < 2:
        raise ValueError(f"self_contrast needs at least 2 samples per problem, got {samples}")
    return {
        "none": set(),
        "own": {(consumer, 1)},
        "transfer": {(other, 1)},
        "self_contrast": {(consumer, samples)},
        "memcollab": {(weak, 1), (strong, 1)},
    }[mode]


def pairs_for(mode: str, consumer: str, weak: str, strong: str, trajectories: Iterable[Trajectory]) -> list[Pair]:
    """The pairs ``mode`` distils for ``consumer``, one per source problem at most, as
    docs/memcollab.md's table of modes says. Trajectories of other models are ignored; two of
    one (model, problem, sample) are an error.
    """
    other = _other(mode, consumer, weak, strong)
    attempts: dict[tuple[str, str], dict[int, Trajectory]] = {}
    problems: dict[str, None] = {}  # first-appearance order
    for t in trajectories:
        samples = attempts.setdefault((t.model, t.problem_id), {})
        if t.sample in samples:
            raise ValueError(f"two trajectories of {t.model!r} on problem {t.problem_id!r}, sample {t.sample}")
        samples[t.sample] = t
        problems.setdefault(t.problem_id)

    def of(model: str, problem: str) -> list[Trajectory]:
        samples = attempts.get((model, problem), {})
        return [samples[s] for s in sorted(samples)]

    pairs = []
    for problem in problems:
        if mode in ("own", "transfer"):
            first = of(consumer if mode == "own" else other, problem)[:1]
            pairs += [Pair.single(t) for t in first]
        elif mode == "self_contrast":
            tries = of(consumer, problem)
            right = [t for t in tries if t.correct]
            wrong = [t for t in tries if not t.correct]
            if right and wrong:
                pairs.append(Pair(problem, right[0].question, right[0], wrong[0]))
        elif mode == "memcollab":
            w, s = of(weak, problem)[:1], of(strong, problem)[:1]
            if w and s and w[0].correct != s[0].correct:
                good, bad = (w[0], s[0]) if w[0].correct else (s[0], w[0])
                pairs.append(Pair(problem, good.question, good, bad))
    return pairs
