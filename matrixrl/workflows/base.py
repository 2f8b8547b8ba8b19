"""Turns, episodes and the workflow interface.

A *role* owns parameters; an *agent* is one instance of a role in an episode (docs/design.md §1).
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol

from matrixrl.settings import Strict
from matrixrl.tasks.base import Problem
from matrixrl.workflows.styles.compact import CompactStyle
from matrixrl.workflows.styles.roles import RolePrompt

if TYPE_CHECKING:
    import numpy as np


class WorkflowSettings(Strict):
    """Base of each workflow's ``Settings``: strict, immutable, built from a dict or None."""

    @classmethod
    def coerce(cls, settings: "WorkflowSettings | dict | None"):
        return settings if isinstance(settings, cls) else cls.model_validate(settings or {})


@dataclass
class Completion:
    """One sampled answer to one prompt, with the tokens the trainer scores."""

    text: str
    prompt_ids: list[int]
    completion_ids: list[int]
    # Entropy of the distribution each completion token was sampled from, summed over
    # the tokens (recorded while sampling; 0 when decoded greedily).
    entropy_sum: float = 0.0
    # The log-probability each completion token had when it was sampled (training
    # rollouts; None otherwise): the update compares it with its own (trainer, logp_gap).
    sampled_logps: list[float] | None = None


@dataclass
class Turn:
    role: str
    agent: str
    index: int  # this agent's turn number within the episode
    prompt: str
    completion: Completion
    answer: str | None = None  # the answer this turn proposes, as the task scores it
    judged: str | None = None  # for a judging turn: the answer it judged
    approved: bool | None = None  # for a judging turn: whether its verdict accepted that answer
    reward: float = 0.0
    advantage: float = 0.0


@dataclass
class Episode:
    problem: Problem
    group: int  # which of the step's problems this rolls out (GRPO group key)
    turns: list[Turn] = field(default_factory=list)
    answer: str = ""
    reward: float = 0.0


class Generate(Protocol):
    def __call__(self, role: str, prompts: list[str]) -> list[Completion]: ...


# One episode as a coroutine: yields (role, prompt) requests, is sent each one's completion,
# returns the episode. ``lockstep`` runs a batch of them, one ``generate`` call per role and round.
Play = Generator[tuple[str, str], Completion, Episode]


def lockstep(plays: list[Play], generate: Generate) -> list[Episode]:
    """Run ``plays`` round by round: each round gathers every unfinished play's request and
    makes one ``generate`` call per role (rows in play order), as a staged workflow does."""
    episodes: list[Episode | None] = [None] * len(plays)
    requests: dict[int, tuple[str, str]] = {}

    def advance(i: int, completion: Completion | None) -> None:
        try:
            requests[i] = plays[i].send(completion)
        except StopIteration as stop:
            episodes[i] = stop.value

    for i in range(len(plays)):
        advance(i, None)
    while requests:
        asked, by_role = dict(requests), {}
        requests.clear()
        for i, (role, _) in asked.items():
            by_role.setdefault(role, []).append(i)
        for role, members in by_role.items():
            for i, completion in zip(members, generate(role, [asked[i][1] for i in members])):
                advance(i, completion)
    return episodes


def parallel_turns(role: str, prompts: list[str], completions: list[Completion], size: int, n: int, answer) -> list[list[Turn]]:
    """Per episode, the turns of ``n`` parallel agents of ``role`` from one agent-major batched call."""
    return [
        [
            Turn(role, f"{role}{a}", 0, prompts[a * size + i], completions[a * size + i], answer=answer(completions[a * size + i].text))
            for a in range(n)
        ]
        for i in range(size)
    ]


def decide(episodes: list[Episode], role: str, prompts: list[str], generate: "Generate", answer) -> None:
    """The final stage of voting and orch_workers: one ``role`` agent per episode answers,
    in one batched call, and its answer becomes the episode's."""
    for episode, prompt, completion in zip(episodes, prompts, generate(role, prompts)):
        episode.answer = answer(completion.text)
        episode.turns.append(Turn(role, f"{role}0", 0, prompt, completion, answer=episode.answer))


def rollout(workflow: "Workflow", problems: list[Problem], groups: list[int], generate: "Generate") -> list[Episode]:
    """``workflow.run(problems, groups, generate)``, as training and evaluation call it,
    refusing a ``generate`` call or a turn for a role the workflow does not declare in
    ``roles``: under isolated such a role has no parameters (a bare KeyError), and its
    turns would be left out of the update while counted in its token totals."""
    from matrixrl.errors import UserError

    roles = tuple(workflow.roles)

    def undeclared(role: str, what: str) -> UserError:
        return UserError(
            f"workflow {workflow.name!r} {what} role {role!r}, which is not one of its roles {roles}; "
            f"add it to {type(workflow).__qualname__}.roles, or use one of those (docs/extending.md)"
        )

    def checked(role: str, prompts: list[str]) -> list[Completion]:
        if role not in roles:
            raise undeclared(role, "called generate for")
        return generate(role, prompts)

    episodes = workflow.run(problems, groups, checked)
    for episode in episodes:
        for turn in episode.turns:
            if turn.role not in roles:
                raise undeclared(turn.role, "returned a turn of")
    return episodes


class WorkflowBase:
    """What every workflow class shares: its validated settings and its prompt style.

    What a subclass sets: docs/extending.md, "A workflow".
    """

    name: ClassVar[str]
    description: ClassVar[str] = ""
    roles: ClassVar[tuple[str, ...]] = ()
    parallel_roles: ClassVar[tuple[str, ...]] = ()
    settings_model: type[WorkflowSettings] = WorkflowSettings
    prompts: ClassVar[Mapping[str, RolePrompt]] = {}

    def __init__(self, settings: WorkflowSettings | dict | None = None, style=None):
        self.settings = self.settings_model.coerce(settings)
        self.style = style or CompactStyle()

    def prompt(self, role: str, problem: Problem, shown: Sequence[str] = ()) -> str:
        """The prompt of ``role`` (one of ``prompts``) about ``problem``, in this workflow's style;
        ``shown``: the completions of other turns it sees."""
        return self.style.ask(role, problem, self.prompts[role], shown)


class Workflow(Protocol):
    name: str
    roles: tuple[str, ...]

    def run(self, problems: list[Problem], groups: list[int], generate: Generate) -> list[Episode]:
        """Roll out one episode per problem; ``groups[i]`` tags episode i's GRPO group."""

    def warmstart_pairs(self, problems: list[Problem], rng: np.random.Generator) -> list[tuple[str, str]]:
        """(prompt, completion) examples of every role's format for the warm-start,
        deliberately imperfect where a role judges or chooses, so RL has signal."""
