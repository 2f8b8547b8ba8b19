"""Per-update gradient diagnostics: the measurements behind docs/design.md §5.

docs/architecture.md, "Per-agent gradients and the diagnostics' rows".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations

import numpy as np
import torch

CHUNK = 1 << 20
"""Elements of one parameter's gradient turned into float64 at a time (8 MB per agent)."""


@dataclass(frozen=True)
class Agent:
    """One agent of one update: who, and how many completion tokens its turns had."""

    role: str
    agent: str  # e.g. "generator0"
    tokens: int


@dataclass(frozen=True)
class AgentGrad:
    """One agent's gradient as one flat vector (what tests and benchmarks hand over)."""

    role: str
    agent: str
    grad: torch.Tensor  # flattened gradient of this agent's turns' loss w.r.t. its parameter set (1-D)
    tokens: int


class GradientSet:
    """The dot products every diagnostic is computed from, for the agents of one parameter set, in float64."""

    def __init__(self, agents: list[Agent]):
        self.agents = agents
        self.groups = [*dict.fromkeys(a.role for a in agents), TOTAL]
        members = torch.zeros((len(self.groups), len(agents)), dtype=torch.float64)
        for i, a in enumerate(agents):
            members[self.groups.index(a.role), i] = 1.0
            members[-1, i] = 1.0
        self._members = members
        self.gram = np.zeros((len(agents), len(agents)))
        self.group_gram = np.zeros((len(self.groups), len(self.groups)))

    def add(self, block: torch.Tensor) -> None:
        """Add the products of one chunk: ``block`` holds each agent's elements in a row (float64)."""
        self.gram += (block @ block.T).cpu().numpy()
        sums = self._members.to(block.device) @ block
        self.group_gram += (sums @ sums.T).cpu().numpy()

    def dot(self, a: str, b: str) -> float:
        """g_a · g_b of two agents by name."""
        names = [x.agent for x in self.agents]
        return float(self.gram[names.index(a), names.index(b)])

    def group_dot(self, a: str, b: str) -> float:
        """The dot product of two role sums (or ``TOTAL``, the set's whole gradient)."""
        return float(self.group_gram[self.groups.index(a), self.groups.index(b)])

    @classmethod
    def of_vectors(cls, agents: list[AgentGrad]) -> "GradientSet":
        """The set of whole flat vectors (one parameter set)."""
        sizes = {a.grad.numel() for a in agents}
        if len(sizes) > 1:
            raise ValueError(f"agents of one parameter set have gradients of different lengths {sorted(sizes)}")
        found = cls([Agent(a.role, a.agent, a.tokens) for a in agents])
        if agents:
            found.add(torch.stack([a.grad.detach().reshape(-1).to(torch.float64).cpu() for a in agents]))
        return found


TOTAL = "\0total"  # the name of a set's whole gradient among its groups (no role is named so)


def grad_snapshot(params: list[torch.nn.Parameter]) -> list[torch.Tensor | None]:
    """A copy of every ``p.grad`` (None where there is none), on its device, in its dtype."""
    return [None if p.grad is None else p.grad.detach().clone() for p in params]


_LIVE = None  # a boundary whose .grad is still the live one (copied only once .grad moves on)


class AgentGradients:
    """Each agent's gradient over one parameter set, as the change in ``.grad`` over its
    backward passes; ``.grad`` is copied only once the next agent's backward pass is about to
    change it (K agents that learned: K − 1 copies).
    """

    def __init__(self, params: list[torch.nn.Parameter]):
        self.params = params
        self.agents: list[Agent] = []
        self.spans: list[tuple[int, int]] = []  # each agent's (before, after) boundary
        self.boundaries: list[list[torch.Tensor | None] | None] = [grad_snapshot(params)]
        self._moved = False

    def before_backward(self) -> None:
        """Call before every backward pass over this parameter set."""
        if self.boundaries[-1] is _LIVE:
            self.boundaries[-1] = grad_snapshot(self.params)
        self._moved = True

    def record(self, role: str, agent: str, tokens: int) -> None:
        """``agent``'s passes are done: its gradient is what ``.grad`` gained since the last record."""
        before = len(self.boundaries) - 1
        if self._moved:
            self.boundaries.append(_LIVE)
            self._moved = False
        self.agents.append(Agent(role, agent, tokens))
        self.spans.append((before, len(self.boundaries) - 1))

    def close(self) -> GradientSet:
        """The recorded agents' :class:`GradientSet` (call before ``.grad`` is clipped or
        damped); the copies are released."""
        found = GradientSet(self.agents)
        if any(before != after for before, after in self.spans):
            for k, p in enumerate(self.params):
                at = [p.grad if b is _LIVE else b[k] for b in self.boundaries]
                for start in range(0, p.numel(), CHUNK):
                    found.add(torch.stack(
                        [_chunk(at[after], start, p) - _chunk(at[before], start, p) for before, after in self.spans]
                    ))  # fmt: skip
        self.boundaries = []
        return found


def _chunk(grad: torch.Tensor | None, start: int, param: torch.nn.Parameter) -> torch.Tensor:
    """Elements ``start`` to ``start + CHUNK`` of a flattened gradient of ``param``, in float64
    (zeros where it has no gradient)."""
    if grad is None:
        return torch.zeros(min(CHUNK, param.numel() - start), dtype=torch.float64, device=param.device)
    return grad.detach().reshape(-1)[start : start + CHUNK].to(torch.float64)


def _row(kind: str, value: float, role: str | None = None, agent: str | None = None, other: str | None = None) -> dict:
    return {"kind": kind, "role": role, "agent": agent, "other": other, "value": float(value)}


def _cosine(dot: float, na: float, nb: float) -> float | None:
    """Cosine from a dot product and two norms, or None when either vector is zero."""
    if na == 0.0 or nb == 0.0:
        return None
    return max(-1.0, min(1.0, dot / (na * nb)))  # rounding can overshoot ±1 by an ulp


def gradient_sets(agents: list[AgentGrad], *, shared: bool) -> list[GradientSet]:
    """Flat vectors as parameter sets: all in one under SP, one per role under IP."""
    if shared:
        return [GradientSet.of_vectors(agents)]
    by_role: dict[str, list[AgentGrad]] = {}
    for a in agents:
        by_role.setdefault(a.role, []).append(a)
    return [GradientSet.of_vectors(members) for members in by_role.values()]


def gradient_diagnostics(sets: list[GradientSet] | list[AgentGrad], *, shared: bool) -> list[dict]:
    """Long-format diagnostic rows for one update (docs/architecture.md lists the kinds).

    ValueError on a repeated agent, unequal lengths in one set, or a role split across sets.
    """
    if sets and isinstance(sets[0], AgentGrad):
        names = [a.agent for a in sets]
        if len(set(names)) != len(names):
            raise ValueError(f"agent names must be unique in one update: {sorted(names)}")
        sets = gradient_sets(sets, shared=shared)
    sets = [s for s in sets if s.agents]
    if shared and len(sets) > 1:
        raise ValueError("under shared=True every agent's gradient must be in one parameter set")
    agents = [a for s in sets for a in s.agents]
    names = [a.agent for a in agents]
    if len(set(names)) != len(names):
        raise ValueError(f"agent names must be unique in one update: {sorted(names)}")
    set_of: dict[str, GradientSet] = {}
    for s in sets:
        for role in s.groups[:-1]:
            if role in set_of:
                raise ValueError(f"agents of role {role!r} have gradients in different parameter sets")
            set_of[role] = s
    by_role: dict[str, list[Agent]] = {}
    for a in agents:
        by_role.setdefault(a.role, []).append(a)
    roles = sorted(by_role)
    for role in roles:
        by_role[role].sort(key=lambda a: a.agent)

    def norm(value: float) -> float:
        return math.sqrt(max(value, 0.0))  # a rounded square of a zero vector can be -0.0

    agent_norm = {a.agent: norm(set_of[a.role].dot(a.agent, a.agent)) for a in agents}
    role_norm = {role: norm(set_of[role].group_dot(role, role)) for role in roles}

    rows: list[dict] = []
    for role in roles:
        for a in by_role[role]:
            rows.append(_row("agent_norm", agent_norm[a.agent], role, a.agent))
    for role in roles:
        for a in by_role[role]:
            rows.append(_row("agent_tokens", a.tokens, role, a.agent))
    for role in roles:
        rows.append(_row("role_norm", role_norm[role], role))
    for role in roles:
        rows.append(_row("role_tokens", sum(a.tokens for a in by_role[role]), role))
    total_norm = math.fsum(role_norm.values())
    for role in roles:
        rows.append(_row("role_share", role_norm[role] / total_norm if total_norm > 0 else 0.0, role))
    for role in roles:
        for a, b in combinations(by_role[role], 2):  # agents already sorted by name
            cos = _cosine(set_of[role].dot(a.agent, b.agent), agent_norm[a.agent], agent_norm[b.agent])
            if cos is not None:
                rows.append(_row("agent_cosine", cos, role, a.agent, b.agent))
    if shared:
        for r, s in combinations(roles, 2):
            cos = _cosine(set_of[r].group_dot(r, s), role_norm[r], role_norm[s])
            if cos is not None:
                rows.append(_row("role_cosine", cos, r, None, s))
    for role in roles:
        members = by_role[role]
        if len(members) < 2:
            continue
        mean = math.fsum(agent_norm[a.agent] for a in members) / len(members)
        if mean > 0:
            rows.append(_row("amplification", role_norm[role] / mean, role))
    if shared and roles:
        (whole,) = sets
        total = norm(whole.group_dot(TOTAL, TOTAL))
        for role in roles:
            cos = _cosine(whole.group_dot(role, TOTAL), role_norm[role], total)
            if cos is not None:
                rows.append(_row("role_total_cosine", cos, role))
    return rows
