"""What the per-agent gradient diagnostics cost: the trainer's update against two references.

The trainer measures every agent's gradient by one backward pass per agent and
differencing ``.grad`` (docs/design.md §5), claimed to cost little, and less than a
separate ``torch.autograd.grad`` per agent. This benchmark checks both claims on the
current code, timing only the update (rollout and scoring excluded) on one fixed
batch of episodes:

- ``trainer update``: ``matrixrl.train.update.update_policy`` as training runs it: per
  parameter set, one forward + backward per agent, ``.grad`` differencing, then
  ``gradient_diagnostics`` (norms, cosines, amplification), clipping, optimizer step.
- ``per-agent, no diagnostics`` (the reference): the same update with
  ``diagnostics=False``: the per-agent passes without the ``.grad`` snapshots and the
  diagnostics. The ratio of ``trainer update`` to it is the diagnostics' own cost.
- ``one batch per set``: per parameter set, one forward + backward over all of its
  turns at once, clipping, optimizer step: what a trainer that never splits by agent
  would do (it pads every turn to the set's longest prompt).
- ``autograd.grad per agent``: per parameter set, one forward over all turns, then
  ``torch.autograd.grad`` of each agent's share of the loss (graph retained), the
  results summed into ``.grad``, then the same diagnostics, clipping and step.

The episodes come from one rollout of a randomly initialised tiny-s model (hidden
128, 2 layers; character tokenizer) on the arith task, 16 problems × a group of 8,
through ``voting`` (3 generators + aggregator) and ``orch_workers`` (orchestrator,
3 workers, synthesizer). A random model earns no reward, so the advantages are
replaced by seeded standard-normal values: every variant then backpropagates
real, non-zero gradients. Variants run interleaved (one update of each per round,
``--rounds`` rounds after one untimed warm-up round) so machine noise hits all
alike; the table gives medians and each variant's ratio to the reference.

    python bench/diagnostics.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).parent))

from train_step import GROUP, PROBLEMS, SEED, build_arith, build_random_base, train_config  # noqa: E402


def rollout(base_dir: Path, workflow_name: str):
    """One batch of episodes with seeded non-zero advantages."""
    import numpy as np
    import torch
    from transformers import AutoTokenizer

    from matrixrl.config import Policies
    from matrixrl.models.policies import build_policy, load_causal_lm
    from matrixrl.train.rollout import make_generate
    from matrixrl.workflows import build_workflow

    cfg = train_config()
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    workflow = build_workflow(workflow_name)
    policy = build_policy("shared", load_causal_lm(base_dir), workflow.roles, Policies())
    generate = make_generate(policy, tokenizer, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, sample=True)
    rng = np.random.default_rng(SEED)
    torch.manual_seed(SEED)
    problems = build_arith().train_problems(rng, PROBLEMS)
    batch = [p for p in problems for _ in range(GROUP)]
    groups = [g for g in range(PROBLEMS) for _ in range(GROUP)]
    episodes = workflow.run(batch, groups, generate)
    for episode in episodes:
        for turn in episode.turns:
            turn.advantage = float(rng.standard_normal())
    return workflow, episodes, tokenizer.pad_token_id


def turns_by_set(policy, episodes):
    """{parameter set: (params, {(role, agent): turns})} for the sets whose roles acted."""
    out = {}
    for name, (roles, params) in policy.parameter_sets().items():
        agents: dict = {}
        for episode in episodes:
            for turn in episode.turns:
                if turn.role in roles:
                    agents.setdefault((turn.role, turn.agent), []).append(turn)
        if agents:
            out[name] = (params, dict(sorted(agents.items())))
    return out


def update_without_diagnostics(policy, optimizers, episodes, pad_token_id, cfg):
    import torch

    from matrixrl.train.grpo import TurnBatch, completion_logps
    from matrixrl.train.losses import StepCounts, dapo

    total_tokens = sum(len(t.completion.completion_ids) for e in episodes for t in e.turns)
    counts = StepCounts(total_tokens, sum(len(e.turns) for e in episodes), total_tokens, cfg.max_new_tokens)
    for name, (params, agents) in turns_by_set(policy, episodes).items():
        turns = [t for ts in agents.values() for t in ts]
        optimizers[name].zero_grad(set_to_none=True)
        batch = TurnBatch.from_turns(turns, pad_token_id)
        logps = completion_logps(policy.model_for(turns[0].role), batch, cfg.temperature)
        loss, _ = dapo(logps, logps.detach(), batch.advantages, batch.completion_mask, cfg, counts)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        optimizers[name].step()


def update_with_autograd_grad(policy, optimizers, episodes, pad_token_id, cfg):
    import torch

    from matrixrl.train.diagnostics import AgentGrad, gradient_diagnostics
    from matrixrl.train.grpo import TurnBatch, completion_logps
    from matrixrl.train.losses import StepCounts, dapo

    total_tokens = sum(len(t.completion.completion_ids) for e in episodes for t in e.turns)
    counts = StepCounts(total_tokens, sum(len(e.turns) for e in episodes), total_tokens, cfg.max_new_tokens)
    agent_grads = []
    for name, (params, agents) in turns_by_set(policy, episodes).items():
        turns = [t for ts in agents.values() for t in ts]
        optimizers[name].zero_grad(set_to_none=True)
        batch = TurnBatch.from_turns(turns, pad_token_id)
        logps = completion_logps(policy.model_for(turns[0].role), batch, cfg.temperature)
        start = 0
        summed = [torch.zeros_like(p) for p in params]
        for i, ((role, agent), ts) in enumerate(agents.items()):
            rows = slice(start, start + len(ts))
            start += len(ts)
            loss, _ = dapo(
                logps[rows], logps[rows].detach(), batch.advantages[rows], batch.completion_mask[rows], cfg, counts
            )
            grads = torch.autograd.grad(loss, params, retain_graph=i + 1 < len(agents), allow_unused=True)
            grads = [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]
            agent_grads.append(AgentGrad(role, agent, torch.cat([g.reshape(-1) for g in grads]), int(batch.completion_mask[rows].sum())))
            summed = [s + g for s, g in zip(summed, grads)]
        for p, g in zip(params, summed):
            p.grad = g
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        optimizers[name].step()
    gradient_diagnostics(agent_grads, shared=policy.mode == "shared")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds (one update of each variant per round)")
    args = parser.parse_args()

    import torch

    from matrixrl.config import Policies
    from matrixrl.models.policies import build_policy, load_causal_lm
    from matrixrl.train.trainer import make_optimizers
    from matrixrl.train.update import update_policy

    torch.set_num_threads(1)
    cfg = train_config()
    variants = {
        "trainer update": lambda *a: update_policy(*a),
        "per-agent, no diagnostics": lambda *a: update_policy(*a, diagnostics=False),
        "one batch per set": update_without_diagnostics,
        "autograd.grad per agent": update_with_autograd_grad,
    }
    print(f"{'workflow':<13} {'policy':<9} {'variant':<26} {'median s':>9} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        base_dir = Path(tmp) / "base"
        build_random_base(base_dir)
        for workflow_name in ("voting", "orch_workers"):
            workflow, episodes, pad = rollout(base_dir, workflow_name)
            for mode in ("shared", "isolated"):
                policies, optimizers = {}, {}
                for variant in variants:
                    policy = build_policy(mode, load_causal_lm(base_dir), workflow.roles, Policies())
                    policy.train(True)
                    policies[variant] = policy
                    optimizers[variant] = make_optimizers(policy, cfg)
                seconds: dict[str, list[float]] = {v: [] for v in variants}
                for round_ in range(1 + args.rounds):
                    for variant, fn in variants.items():
                        began = time.perf_counter()
                        fn(policies[variant], optimizers[variant], episodes, pad, cfg)
                        if round_:  # round 0 warms up
                            seconds[variant].append(time.perf_counter() - began)
                reference = statistics.median(seconds["per-agent, no diagnostics"])
                for variant, values in seconds.items():
                    median = statistics.median(values)
                    print(f"{workflow_name:<13} {mode:<9} {variant:<26} {median:>9.3f} {median / reference:>6.2f}")


if __name__ == "__main__":
    main()
