"""Per-update gradient diagnostics: the measurements behind docs/design.md §5.

The study's mechanism claims are about gradients: under the isolated policy (IP)
parallel same-role agents add up their gradients (amplification), under the shared
policy (SP) the role with the most gradient mass captures the shared parameters.
This module turns one update's per-agent gradient vectors into long-format rows;
``matrixrl.analysis.diagnostics.summarize_diagnostics`` condenses many steps into one row per cell.

Obtaining per-agent gradients (one backward pass per agent, differencing ``.grad``)
---------------------------------------------------------------------------------
``trainer.update_policy`` already splits a step into sub-batches whose losses add up to
the step's loss (``clipped_loss`` divides by the step's total token count, so the
loss is additive over turns). To measure, split each role's turns further by
``turn.agent`` and, for each agent's sub-batch, within the loop over a parameter
set's roles::

    before = flat_grad(params)            # .grad accumulated so far (zeros at first)
    loss.backward()                       # this agent's turns only
    grad = flat_grad(params) - before     # exactly this agent's gradient
    agents.append(AgentGrad(role, agent, grad, tokens=int(batch.completion_mask.sum())))

``.grad`` keeps accumulating, so after the last agent it holds the sum over all of
the set's agents: the optimizer step is unchanged. Take the snapshots *before*
``clip_grad_norm_`` (which rescales ``.grad`` in place): the diagnostics describe
the raw, unclipped gradients. After all parameter sets are done, call
``gradient_diagnostics(agents, shared=<policy mode is shared>)``. Under SP there is
one parameter set, so every agent's vector lives in the same space; under IP each
role's vector lives in its role's own parameter space. Differencing costs one
flatten/copy per agent; a separate ``torch.autograd.grad`` per role was measured
at about 30% slower (docs/design.md §5; bench/diagnostics.py).

Rows
----
Each row is ``{"kind", "role", "agent", "other", "value"}`` with ``None`` in the
fields a kind does not use; ``value`` is a Python float.

==================== ====== ============ ============ ==========================================
kind                 role   agent        other        value
==================== ====== ============ ============ ==========================================
agent_norm           role   agent        None         ‖g_agent‖
agent_tokens         role   agent        None         completion tokens of the agent's turns
role_norm            role   None         None         ‖Σ_agents-of-role g‖
role_tokens          role   None         None         Σ tokens of the role's agents
role_share           role   None         None         role_norm / Σ_roles role_norm (0 if all 0)
agent_cosine         role   first agent  second agent cos(g_a, g_b), same role, names sorted
role_cosine          first  None         second role  cos(G_r, G_s), SP only, names sorted
amplification        role   None         None         ‖Σ g_i‖ / mean ‖g_i‖, roles with ≥2 agents
role_total_cosine    role   None         None         cos(G_r, Σ_roles G), SP only
==================== ====== ============ ============ ==========================================

Conventions: a cosine involving a zero vector is undefined and its row is skipped
(no NaN rows); amplification is skipped when the role's mean agent norm is 0.
Cross-role kinds (``role_cosine``, ``role_total_cosine``) are emitted only under
``shared=True``: under IP the roles' gradients live in different parameter spaces.
``role_share`` is emitted in both modes (it compares norms, not directions).
Rows come in a deterministic order: by kind as in the table, roles and agents
sorted by name. All arithmetic is done in float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations

import torch

KINDS = (
    "agent_norm",
    "agent_tokens",
    "role_norm",
    "role_tokens",
    "role_share",
    "agent_cosine",
    "role_cosine",
    "amplification",
    "role_total_cosine",
)

@dataclass(frozen=True)
class AgentGrad:
    """One agent's gradient in one update."""

    role: str
    agent: str  # e.g. "generator0"
    grad: torch.Tensor  # flattened gradient of this agent's turns' loss w.r.t. its parameter set (1-D)
    tokens: int  # completion tokens of this agent's turns in the step


def flat_grad(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """Concatenation of every ``p.grad`` (zeros where it is ``None``) as a float64 copy.

    The copy is detached and independent of later in-place changes to ``.grad``, so
    ``flat_grad(params) - before`` is exactly the gradient added in between.
    """
    parts = [
        (p.grad.detach().reshape(-1).to(dtype=torch.float64, device="cpu", copy=True)
         if p.grad is not None else torch.zeros(p.numel(), dtype=torch.float64))
        for p in params
    ]
    if not parts:
        return torch.zeros(0, dtype=torch.float64)
    return torch.cat(parts)


def _row(kind: str, value: float, role: str | None = None, agent: str | None = None, other: str | None = None) -> dict:
    return {"kind": kind, "role": role, "agent": agent, "other": other, "value": float(value)}


def _norm(v: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(v))


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float | None:
    """Cosine similarity in float64, or None when either vector is zero."""
    na, nb = _norm(a), _norm(b)
    if na == 0.0 or nb == 0.0:
        return None
    value = float(torch.dot(a, b)) / (na * nb)
    return max(-1.0, min(1.0, value))  # rounding can overshoot ±1 by an ulp


def gradient_diagnostics(agents: list[AgentGrad], *, shared: bool) -> list[dict]:
    """Long-format diagnostic rows for one update (see the module docstring for kinds).

    ``shared`` says whether all roles' gradients live in one parameter space (SP);
    under IP (``shared=False``) cross-role cosines are not computed. Agents of one
    role must have gradients of equal length (and, under SP, all agents must).
    Raises ``ValueError`` on a repeated agent name or mismatched lengths.
    """
    names = [a.agent for a in agents]
    if len(set(names)) != len(names):
        raise ValueError(f"agent names must be unique in one update: {sorted(names)}")
    by_role: dict[str, list[AgentGrad]] = {}
    for a in agents:
        by_role.setdefault(a.role, []).append(a)
    roles = sorted(by_role)
    for role in roles:
        by_role[role].sort(key=lambda a: a.agent)

    vec = {a.agent: a.grad.detach().reshape(-1).to(dtype=torch.float64, device="cpu") for a in agents}
    for role in roles:
        sizes = {vec[a.agent].numel() for a in by_role[role]}
        if len(sizes) > 1:
            raise ValueError(f"agents of role {role!r} have gradients of different lengths {sorted(sizes)}")
    if shared and len({v.numel() for v in vec.values()}) > 1:
        raise ValueError("under shared=True every agent's gradient must have the same length")

    role_sum = {role: torch.stack([vec[a.agent] for a in by_role[role]]).sum(dim=0) for role in roles}
    agent_norm = {name: _norm(v) for name, v in vec.items()}
    role_norm = {role: _norm(role_sum[role]) for role in roles}

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
            cos = _cosine(vec[a.agent], vec[b.agent])
            if cos is not None:
                rows.append(_row("agent_cosine", cos, role, a.agent, b.agent))
    if shared:
        for r, s in combinations(roles, 2):
            cos = _cosine(role_sum[r], role_sum[s])
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
        total = torch.stack([role_sum[r] for r in roles]).sum(dim=0)
        for role in roles:
            cos = _cosine(role_sum[role], total)
            if cos is not None:
                rows.append(_row("role_total_cosine", cos, role))
    return rows
