"""One GRPO update of a policy from a step's scored episodes: per agent, in micro-batches.

``update_policy`` is the trainer's optimisation half (matrixrl.train.trainer's
``grpo_step`` samples and scores, then calls it): ``train.loss_type``'s loss of
matrixrl.train.losses over each agent's turns, a backward pass per agent (so that the
per-agent gradient diagnostics of matrixrl.train.diagnostics come from differencing
``.grad``), the interventions' KL anchor and damper (matrixrl.train.interventions),
clipping, one AdamW step per parameter set, and the log-probability gap between the
rollout and the update. The trainer's docstring lists every deviation from textbook
GRPO.
"""

from __future__ import annotations

import torch

from matrixrl.train.diagnostics import AgentGradients, GradientSet, grad_snapshot, gradient_diagnostics
from matrixrl.train.grpo import TurnBatch, completion_logps
from matrixrl.train.interventions import Damper, kl_k3, role_value
from matrixrl.train.losses import StepCounts, kl_term, policy_loss


def update_policy(
    policy, optimizers: dict, episodes, pad_token_id: int, cfg, diagnostics: bool = True, damper: Damper | None = None,
    micro_batch_tokens: int | None = None,
) -> tuple[dict, list[dict]]:
    """The policy's update from one step's scored episodes: one optimizer step per
    parameter set, each on the turns of the roles it serves.

    The loss is ``cfg.loss_type``'s (matrixrl.train.losses), its normaliser counted over
    the whole step (``StepCounts``): every turn of the step, or for ``bnpo`` the turns of
    the parameter set, never a micro-batch's. So the micro-batches' losses add up to the
    step's, whatever ``micro_batch_tokens`` is.

    Every agent's turns get their own backward passes, and the change in the
    accumulated ``.grad`` is that agent's gradient (docs/design.md §5: cheaper than a
    separate ``autograd.grad`` per role; matrixrl.train.diagnostics). ``.grad`` still
    ends as the sum, so the step is the same as one backward over all turns. Turns
    whose advantage is 0 (every rollout of their group scored alike: half or more of
    a collapsing run's) add exactly nothing to the loss or its gradient, so they skip
    the forward and backward passes; they still count in the token-mean's
    denominator, and their entropy was recorded while sampling. An agent's turns go
    through the model in micro-batches of at most ``micro_batch_tokens`` rows ×
    padded length (None: all at once; ``micro_batches``), whose losses add up to the
    agent's: the same gradient up to rounding, in bounded memory. With
    ``cfg.ppo_epochs > 1`` each parameter set takes that many passes and optimizer
    steps over its turns, the ratio taken against the first pass's log-probabilities.
    Returns the step's metrics (loss and gradient norm of the first pass; the clipped
    fraction of tokens over all passes) and the first pass's gradient diagnostics
    rows (none with ``diagnostics=False``, which skips the snapshots;
    bench/diagnostics.py times the difference).

    The first pass also measures how far the log-probabilities it computes are from
    the ones the rollout sampled with (``role_logp_gap``: per role, mean and max of
    |Δ log p| over the tokens it recomputes): 0 up to rounding in float32, the
    training–inference mismatch of a 16-bit compute dtype otherwise.

    The interventions (matrixrl.train.interventions) act here when switched on: a
    role with a KL coefficient gets the KL term in its loss (and all its turns take
    part, since the KL has a gradient where the advantage is 0); ``damper`` scales each
    role's gradient before clipping. Their per-role values of the first pass are in
    the metrics' ``role_kl`` and ``role_damper``.
    """
    turns_by_agent: dict[tuple[str, str], list] = {}
    for episode in episodes:
        for turn in episode.turns:
            turns_by_agent.setdefault((turn.role, turn.agent), []).append(turn)
    total_tokens = sum(len(t.completion.completion_ids) for ts in turns_by_agent.values() for t in ts)
    n_turns = sum(len(ts) for ts in turns_by_agent.values())
    stats = {"loss": 0.0, "clipped": 0.0}
    role_entropy: dict[str, list[float]] = {}  # role → [entropy sum, tokens]
    squared_norm = 0.0
    gradient_sets: list[GradientSet] = []
    beta = {role: role_value(cfg.kl_beta, cfg.kl_beta_roles, role) for role in policy.roles}
    role_kl: dict[str, list[float]] = {}  # role → [k3 sum, tokens], first pass
    role_gap: dict[str, list[float]] = {}  # role → [|Δ log p| sum, max, tokens], first pass
    role_damper: dict[str, tuple[float, float]] = {}  # role → (cos, scale), first pass
    for name, (roles, params) in policy.parameter_sets().items():
        acting = [(key, turns) for key, turns in sorted(turns_by_agent.items()) if key[0] in roles]
        if not acting:
            continue  # a parameter set whose roles did not act this step stays untouched
        optimizer = optimizers[name]
        counts = StepCounts(
            tokens=total_tokens,
            turns=n_turns,
            set_tokens=sum(len(t.completion.completion_ids) for _, turns in acting for t in turns),
            max_completion_length=cfg.max_new_tokens,
        )
        batches: dict[tuple[str, str], list[TurnBatch]] = {}
        old_logps: dict[tuple[str, str, int], torch.Tensor] = {}
        ref_logps: dict[tuple[str, str, int], torch.Tensor] = {}
        for (role, agent), turns in acting:
            totals = role_entropy.setdefault(role, [0.0, 0])
            totals[0] += sum(t.completion.entropy_sum for t in turns)
            totals[1] += sum(len(t.completion.completion_ids) for t in turns)
            learning = [t for t in turns if t.advantage != 0.0 or beta[role] > 0]
            batches[(role, agent)] = [
                TurnBatch.from_turns(part, pad_token_id).to(policy.device)
                for part in micro_batches(learning, micro_batch_tokens)
            ]
        for epoch in range(cfg.ppo_epochs):
            first = epoch == 0
            optimizer.zero_grad(set_to_none=True)
            grads = AgentGradients(params) if diagnostics and first else None
            role_starts: dict[str, list] = {}  # the damper's view: .grad before each role's turns
            for (role, agent), turns in acting:
                if damper is not None and role not in role_starts:
                    role_starts[role] = grad_snapshot(params)
                model = policy.model_for(role)
                for part, batch in enumerate(batches[(role, agent)]):
                    key = (role, agent, part)
                    logps = completion_logps(model, batch, cfg.temperature)
                    if first:  # the sampling policy's log-probabilities: ratio 1 in this pass
                        old_logps[key] = logps.detach()
                        _add_gap(role_gap, role, old_logps[key], batch)
                    kl = None
                    if beta[role] > 0:
                        if first:  # the reference's log-probabilities of the sampled tokens, once per step
                            with torch.no_grad(), policy.reference() as reference:
                                ref_logps[key] = completion_logps(reference, batch, cfg.temperature)
                        k3 = kl_k3(logps, ref_logps[key], batch.completion_mask)
                        kl = kl_term(k3, logps, old_logps[key], batch.completion_mask, beta[role], cfg)
                        if first:
                            totals = role_kl.setdefault(role, [0.0, 0])
                            totals[0] += float(k3.detach().sum())
                            totals[1] += int(batch.completion_mask.sum())
                    loss, clipped = policy_loss(
                        logps, old_logps[key], batch.advantages, batch.completion_mask, cfg, counts, kl=kl
                    )
                    if grads is not None:
                        grads.before_backward()
                    loss.backward()
                    if first:
                        stats["loss"] += loss.item()
                    stats["clipped"] += clipped.item()
                if grads is not None:
                    grads.record(role, agent, sum(len(t.completion.completion_ids) for t in turns))
            if grads is not None:
                gradient_sets.append(grads.close())  # before the damper and clipping change .grad
            for p in params:
                # As after a backward over every turn: zero, not absent, gradients, so AdamW
                # still steps (momentum) when no turn of the set had an advantage.
                if p.grad is None and p.requires_grad:
                    p.grad = torch.zeros_like(p)
            if damper is not None:
                damped = _damp(params, role_starts, damper, update=first)
                if first:
                    role_damper.update(damped)
            norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            if first:
                squared_norm += float(norm) ** 2
            optimizer.step()
    metrics = {
        "loss": stats["loss"],
        "entropy": sum(total for total, _ in role_entropy.values()) / max(total_tokens, 1),
        "clip_fraction": stats["clipped"] / max(total_tokens * cfg.ppo_epochs, 1),
        "grad_norm": squared_norm**0.5,
        "response_length": total_tokens / max(n_turns, 1),
        "role_entropy": {role: total / max(n, 1) for role, (total, n) in role_entropy.items()},
        "role_kl": {role: total / max(n, 1) for role, (total, n) in role_kl.items()},
        "role_logp_gap": {role: (total / n, largest) for role, (total, largest, n) in role_gap.items() if n},
        "role_damper": role_damper,
    }
    return metrics, gradient_diagnostics(gradient_sets, shared=policy.mode == "shared") if diagnostics else []


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


def _add_gap(role_gap: dict[str, list[float]], role: str, logps: torch.Tensor, batch: TurnBatch) -> None:
    """Add the |Δ log p| between ``logps`` and the rollout's sampled log-probabilities of
    ``batch``'s tokens to ``role``'s [sum, max, tokens] (turns sampled without them: none)."""
    if batch.sampled_logps is None:
        return
    mask = batch.completion_mask > 0
    gap = (logps.float() - batch.sampled_logps).abs()[mask]
    if gap.numel():
        totals = role_gap.setdefault(role, [0.0, 0.0, 0])
        totals[0] += float(gap.sum())
        totals[1] = max(totals[1], float(gap.max()))
        totals[2] += int(gap.numel())


def _damp(params: list, role_starts: dict[str, list], damper: Damper, update: bool) -> dict[str, tuple[float, float]]:
    """Scale each role's share of the accumulated ``.grad`` of ``params`` by the damper.

    ``role_starts``: ``.grad`` before each role's backward passes (``grad_snapshot``), in
    the order they ran, so a role's gradient is the change up to the next role's start
    (or the end), flattened in float32 on the parameters' device. ``.grad`` becomes
    Σ_role scale_role · g_role; with ``update`` (the first pass) each role's moving
    average takes its damped gradient. Returns {role: (cos, scale)}.
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
