"""One GRPO update of a policy from a step's scored episodes: per agent, in micro-batches.

docs/architecture.md, "The GRPO step" and "The update".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from matrixrl.train.diagnostics import AgentGradients, GradientSet, grad_snapshot, gradient_diagnostics
from matrixrl.train.grpo import TurnBatch, completion_logps
from matrixrl.train.interventions import Damper, kl_k3, role_value
from matrixrl.train.losses import StepCounts, kl_term, policy_loss


@dataclass
class RoleUpdate:
    """One role's figures of an update, summed over its turns (first pass, unless named otherwise)."""

    entropy_sum: float = 0.0  # the rollout's entropy over the role's completion tokens
    tokens: int = 0
    kl: list | None = None  # [k3 sum, tokens], with a KL anchor
    gap: list | None = None  # [|Δ log p| sum, max, tokens], where the rollout kept its log-probabilities
    damper: tuple[float, float] | None = None  # (cos, scale), with a damper
    last_pass_share: float | None = None  # role_share of the last pass's gradient (ppo_epochs > 1)


@dataclass
class Update:
    """What one update did: the step's metrics (loss and gradient norm of the first pass, the
    clipped fraction over every pass), each role's figures, the first pass's gradient diagnostics."""

    metrics: dict[str, float]
    roles: dict[str, RoleUpdate] = field(default_factory=dict)
    diagnostics: list[dict] = field(default_factory=list)

    def role_rows(self, step: int) -> list[dict]:
        """The per-role metric rows of training step ``step``, as train.json holds them: entropy,
        then kl, the log-probability gap, the damper and the last pass's share, where measured."""
        found = [(role, "entropy", u.entropy_sum / max(u.tokens, 1)) for role, u in self.roles.items()]
        found += [(role, "kl", u.kl[0] / max(u.kl[1], 1)) for role, u in self.roles.items() if u.kl is not None]
        for role, u in self.roles.items():
            if u.gap is not None and u.gap[2]:
                found += [(role, "logp_gap_mean", u.gap[0] / u.gap[2]), (role, "logp_gap_max", u.gap[1])]
        for role, u in self.roles.items():
            if u.damper is not None:
                found += [(role, "damper_cos", u.damper[0]), (role, "damper_scale", u.damper[1])]
        found += [(r, "last_pass_share", u.last_pass_share) for r, u in self.roles.items() if u.last_pass_share is not None]
        return [{"step": step, "role": role, "metric": metric, "value": value} for role, metric, value in found]

    def by_role(self, metric: str) -> dict[str, float]:
        """``metric``'s value per role (a name of :meth:`role_rows`)."""
        return {row["role"]: row["value"] for row in self.role_rows(0) if row["metric"] == metric}


def update_policy(
    policy, optimizers: dict, episodes, pad_token_id: int, cfg, diagnostics: bool = True, damper: Damper | None = None,
    micro_batch_tokens: int | None = None,
) -> Update:
    """Update ``policy`` from one step's scored ``episodes``: per parameter set, ``cfg.ppo_epochs`` optimizer
    steps.

    Micro-batches of at most ``micro_batch_tokens``; docs/architecture.md, "The update".
    """
    by_agent: dict[tuple[str, str], list] = {}
    for episode in episodes:
        for turn in episode.turns:
            by_agent.setdefault((turn.role, turn.agent), []).append(turn)
    tokens = sum(len(t.completion.completion_ids) for turns in by_agent.values() for t in turns)
    n_turns = sum(len(turns) for turns in by_agent.values())
    beta = {role: role_value(cfg.kl_beta, cfg.kl_beta_roles, role) for role in policy.roles}
    step = _Step(policy, cfg, beta, damper)
    for name, (served, params) in policy.parameter_sets().items():
        acting = [(key, turns) for key, turns in sorted(by_agent.items()) if key[0] in served]
        if not acting:
            continue  # a parameter set whose roles did not act this step stays untouched
        counts = StepCounts(
            tokens=tokens, turns=n_turns, set_tokens=sum(len(t.completion.completion_ids) for _, ts in acting for t in ts),
            max_completion_length=cfg.max_new_tokens,
        )  # fmt: skip
        agents = step.batches(acting, pad_token_id, micro_batch_tokens)
        for epoch in range(cfg.ppo_epochs):
            last = epoch == cfg.ppo_epochs - 1 and epoch > 0  # a later pass's shares (ratios off 1)
            step.one_pass(agents, params, optimizers[name], counts, epoch == 0, diagnose=diagnostics and (epoch == 0 or last))
    metrics = {
        "loss": step.loss,
        "entropy": sum(u.entropy_sum for u in step.roles.values()) / max(tokens, 1),
        "clip_fraction": step.clipped / max(tokens * cfg.ppo_epochs, 1),
        "grad_norm": step.squared_norm**0.5,
        "response_length": tokens / max(n_turns, 1),
    }
    shared = policy.mode == "shared"
    for row in gradient_diagnostics(step.last_sets, shared=shared) if step.last_sets else []:
        if row["kind"] == "role_share":  # docs/losses.md: the first pass cannot see a ratio's effect on roles
            step.roles[row["role"]].last_pass_share = row["value"]
    return Update(metrics, step.roles, gradient_diagnostics(step.gradient_sets, shared=shared) if diagnostics else [])


class _Step:
    """An update's running state: its totals, each role's figures, and per micro-batch (role,
    agent, index) the first pass's and the reference's log-probabilities."""

    def __init__(self, policy, cfg, beta: dict[str, float], damper: Damper | None):
        self.policy, self.cfg, self.beta, self.damper = policy, cfg, beta, damper
        self.roles: dict[str, RoleUpdate] = {}
        self.loss = self.clipped = self.squared_norm = 0.0
        self.gradient_sets: list[GradientSet] = []  # the first pass's, per parameter set
        self.last_sets: list[GradientSet] = []  # the last pass's (ppo_epochs > 1)
        self.old_logps: dict[tuple, torch.Tensor] = {}
        self.ref_logps: dict[tuple, torch.Tensor] = {}

    def batches(self, acting: list, pad_token_id: int, max_tokens: int | None) -> list[tuple[str, str, int, list]]:
        """Per agent: (role, agent, its completion tokens, its micro-batches of the turns that
        learn); records each role's rollout entropy."""
        found = []
        for (role, agent), turns in acting:
            figures = self.roles.setdefault(role, RoleUpdate())
            figures.entropy_sum += sum(t.completion.entropy_sum for t in turns)
            n_tokens = sum(len(t.completion.completion_ids) for t in turns)
            figures.tokens += n_tokens
            learning = [t for t in turns if t.advantage != 0.0 or self.beta[role] > 0]
            parts = [TurnBatch.from_turns(p, pad_token_id).to(self.policy.device) for p in micro_batches(learning, max_tokens)]
            found.append((role, agent, n_tokens, parts))
        return found

    def one_pass(self, agents: list, params: list, optimizer, counts: StepCounts, first: bool, diagnose: bool) -> None:
        """One pass of a parameter set over its agents' micro-batches, then its optimizer step."""
        optimizer.zero_grad(set_to_none=True)
        gradients = AgentGradients(params) if diagnose else None
        role_starts: dict[str, list] = {}  # the damper's view: .grad before each role's turns
        for role, agent, n_tokens, parts in agents:
            if self.damper is not None and role not in role_starts:
                role_starts[role] = grad_snapshot(params)
            for index, batch in enumerate(parts):
                if gradients is not None:
                    gradients.before_backward()
                self._backward(role, (role, agent, index), batch, counts, first)
            if gradients is not None:
                gradients.record(role, agent, n_tokens)
        if gradients is not None:  # before the damper and clipping change .grad
            (self.gradient_sets if first else self.last_sets).append(gradients.close())
        for p in params:
            # As after a backward over every turn: zero, not absent, gradients, so AdamW
            # still steps (momentum) when no turn of the set had an advantage.
            if p.grad is None and p.requires_grad:
                p.grad = torch.zeros_like(p)
        if self.damper is not None:
            for role, found in _damp(params, role_starts, self.damper, update=first).items():
                if first:
                    self.roles[role].damper = found
        norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm)
        if first:
            self.squared_norm += float(norm) ** 2
        optimizer.step()

    def _backward(self, role: str, key: tuple, batch: TurnBatch, counts: StepCounts, first: bool) -> None:
        """The loss of one micro-batch (with its role's KL term) and its backward pass."""
        cfg, figures = self.cfg, self.roles[role]
        logps = completion_logps(self.policy.model_for(role), batch, cfg.temperature)
        if first:  # the sampling policy's log-probabilities: ratio 1 in this pass
            self.old_logps[key] = logps.detach()
            _add_gap(figures, self.old_logps[key], batch)
        kl = None
        if self.beta[role] > 0:
            if first:  # the reference's log-probabilities of the sampled tokens, once per step
                with torch.no_grad(), self.policy.reference() as reference:
                    self.ref_logps[key] = completion_logps(reference, batch, cfg.temperature)
            k3 = kl_k3(logps, self.ref_logps[key], batch.completion_mask)
            kl = kl_term(k3, logps, self.old_logps[key], batch.completion_mask, self.beta[role], cfg)
            if first:
                figures.kl = figures.kl or [0.0, 0]
                figures.kl[0] += float(k3.detach().sum())
                figures.kl[1] += int(batch.completion_mask.sum())
        loss, clipped = policy_loss(logps, self.old_logps[key], batch.advantages, batch.completion_mask, cfg, counts, kl=kl)
        loss.backward()
        if first:
            self.loss += loss.item()
        self.clipped += clipped.item()


def micro_batches(turns: list, max_tokens: int | None) -> list[list]:
    """``turns`` in order, cut into runs whose rows × padded length (longest prompt plus
    longest completion) is at most ``max_tokens`` (a turn longer than that alone is a run
    of its own); one run when ``max_tokens`` is None. Empty ``turns``: no run."""
    if max_tokens is None:
        return [turns] if turns else []
    runs: list[list] = []
    current: list = []
    prompt = completion = 0
    for turn in turns:
        p = max(prompt, len(turn.completion.prompt_ids))
        c = max(completion, len(turn.completion.completion_ids), 1)
        if current and (len(current) + 1) * (p + c) > max_tokens:
            runs.append(current)
            current, p, c = [], len(turn.completion.prompt_ids), max(len(turn.completion.completion_ids), 1)
        current.append(turn)
        prompt, completion = p, c
    return [*runs, current] if current else runs


def _add_gap(figures: RoleUpdate, logps: torch.Tensor, batch: TurnBatch) -> None:
    """Add the |Δ log p| between ``logps`` and the rollout's sampled log-probabilities of
    ``batch``'s tokens to the role's [sum, max, tokens] (turns sampled without them: none)."""
    if batch.sampled_logps is None:
        return
    mask = batch.completion_mask > 0
    gap = (logps.float() - batch.sampled_logps).abs()[mask]
    if gap.numel():
        totals = figures.gap = figures.gap or [0.0, 0.0, 0]
        totals[0] += float(gap.sum())
        totals[1] = max(totals[1], float(gap.max()))
        totals[2] += int(gap.numel())


def _damp(params: list, role_starts: dict[str, list], damper: Damper, update: bool) -> dict[str, tuple[float, float]]:
    """Scale each role's share of the accumulated ``.grad`` of ``params`` by the damper; returns {role: (cos,
    scale)}.

    ``role_starts``: ``.grad`` before each role's backward passes; ``update`` moves the moving averages.
    """
    roles = list(role_starts)
    ends = [role_starts[r] for r in roles[1:]] + [[p.grad for p in params]]
    # Every role's gradient first: damping one changes the live .grad the last one ends at.
    gradients = [
        torch.cat([_flat(e, p) - _flat(s, p) for s, e, p in zip(role_starts[role], end, params)])
        for role, end in zip(roles, ends)
    ]
    found = {}
    for role, gradient in zip(roles, gradients):
        scale, cos = damper.scale(role, gradient)
        if scale != 1.0:
            offset = 0
            for p in params:
                n = p.numel()
                p.grad.sub_(((1.0 - scale) * gradient[offset : offset + n]).view_as(p).to(p.grad))
                offset += n
        if update:
            damper.update(role, scale * gradient)
        found[role] = (cos, scale)
    return found


def _flat(grad: torch.Tensor | None, param) -> torch.Tensor:
    """``grad`` flattened in float32 (zeros for None): a role's gradient, as the damper sees it."""
    if grad is None:
        return torch.zeros(param.numel(), dtype=torch.float32, device=param.device)
    return grad.detach().reshape(-1).to(torch.float32)
