"""Seconds per policy update under every loss (``train.loss_type``) and importance-sampling level.

What is timed: ``update_policy`` (matrixrl/train/update.py), called as ``grpo_step`` calls
it, on one step's scored episodes: per agent, the forward pass of its turns, the loss of
matrixrl/train/losses.py, the backward pass and the gradient diagnostics, then clipping
and one AdamW step per parameter set, at ``ppo_epochs`` 2. The first pass records the old
log-probabilities (ratio 1 there); its optimizer step moves the weights, so in the second
pass the ratios leave 1 and the clips, caps, gates and weights act on them. The rollout,
scoring and advantages are not timed: they are done once, before any update.

Every variant works on the same input, so that only the loss differs:
- the same episodes (completions, prompts, advantages), rolled out once;
- the same weights: before each update the trainable parameters are copied back to the
  ones the rollout sampled with and the optimizers are made afresh (untimed), so the
  first pass's log-probabilities (the old ones) are the same for every variant;
- the same ``train:`` settings apart from ``loss_type`` and ``importance_sampling_level``,
  except cispo's ``epsilon_high`` of 5.0: the schema refuses cispo below 1 (every token
  capped from the first pass) and names 5.0 as the fix. Refused pairs are skipped, as the
  schema's ``loss_problem`` refuses them (luspo at token level, vespo at sequence level).

The setting: the ``--workflow`` (default voting: three generators and an aggregator) with
a ``--policy`` (default shared: one full model for every role) of tiny-s (Qwen3
architecture, hidden 128, 2 layers, 4 heads, 2 KV heads, intermediate 256, the character
tokenizer) at its random initialisation, built here (no download); arith problems
("4+8+9="), ``--problems`` × ``--group`` episodes, at most 8 new tokens per turn. A random
model scores 0 everywhere, which would give every turn advantage 0 and skip its update,
so each episode's reward is drawn uniformly from [0, 1) (seeded), given to all its turns
(as the ``outcome`` reward does) and turned into group advantages by ``assign_advantages``:
every turn takes part in the update.

The variants are interleaved: one warm-up round of every variant (untimed), then
``--repeats`` rounds, each running every variant once in the same order (A B C ... A B
C ...), so that a slow spell of a shared machine falls on all alike. Each update is timed
in this process's CPU seconds (``time.process_time``: with one torch thread, the wall time
of an idle machine, without the intervals another job preempts it for). The table gives
each variant's median seconds per update and its ratio to ``dapo`` at token level (the
default) measured in the same run; the forward and backward passes, the same for all,
are most of every update.

    python bench/losses.py [--repeats 5] [--problems 4] [--group 4] [--workflow voting] [--policy shared]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

MAX_NEW_TOKENS = 8
SEED = 0
REFERENCE = ("dapo", "token")


def variants(base: dict) -> tuple[dict[tuple[str, str], object], list[str]]:
    """Every (loss, level) the schema accepts → its ``Train`` settings (the default first),
    and the refused ones as ``loss@level``."""
    from matrixrl.config import Train
    from matrixrl.config.schema import IMPORTANCE_SAMPLING_LEVELS, LOSS_TYPES, loss_problem

    accepted, refused = {}, []
    for loss in LOSS_TYPES:
        for level in IMPORTANCE_SAMPLING_LEVELS:
            settings = dict(base, loss_type=loss, importance_sampling_level=level)
            if loss == "cispo":
                settings["epsilon_high"] = 5.0  # the schema's fix for cispo's cap (TRL's advice)
            if loss_problem(Train.model_construct(**settings)) is None:  # unvalidated: only asks why not
                accepted[(loss, level)] = Train(**settings)
            else:
                refused.append(f"{loss}@{level}")
    return accepted, refused


def rollout(args):
    """The policy, its tokenizer's pad id and one step's scored episodes (advantages set)."""
    import numpy as np
    import torch

    from matrixrl.config import Policies, TinyScale
    from matrixrl.models.policies import build_policy
    from matrixrl.models.tiny import build_char_tokenizer, build_tiny_model
    from matrixrl.tasks import build_task
    from matrixrl.tasks.arith import Settings as ArithSettings
    from matrixrl.train.rewards import assign_advantages
    from matrixrl.train.rollout import make_generate
    from matrixrl.workflows import build_workflow

    scale = TinyScale(kind="tiny", hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=256, max_length=128)
    tokenizer = build_char_tokenizer()
    torch.manual_seed(SEED)
    workflow = build_workflow(args.workflow)
    policy = build_policy(args.policy, build_tiny_model(scale, tokenizer, seed=SEED), workflow.roles, Policies())
    task = build_task("arith", ArithSettings(kind="arith", digits=1, terms=3, n_eval=16, seed=SEED))
    rng = np.random.default_rng(SEED)
    problems = task.train_problems(rng, args.problems)
    batch = [p for p in problems for _ in range(args.group)]
    groups = [g for g in range(len(problems)) for _ in range(args.group)]
    generate = make_generate(policy, tokenizer, max_new_tokens=MAX_NEW_TOKENS, temperature=1.0, sample=True)
    policy.train(False)
    episodes = workflow.run(batch, groups, generate)
    for episode in episodes:
        episode.reward = float(rng.random())
        for turn in episode.turns:
            turn.reward = episode.reward
    assign_advantages(episodes, scale_rewards=True)
    return policy, tokenizer.pad_token_id, episodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds of every variant (after one warm-up round)")
    parser.add_argument("--problems", type=int, default=4, help="problems of the step")
    parser.add_argument("--group", type=int, default=4, help="rollouts per problem (the GRPO group)")
    parser.add_argument("--workflow", default="voting")
    parser.add_argument("--policy", choices=("shared", "isolated"), default="shared")
    args = parser.parse_args()

    import torch

    from matrixrl.train.trainer import make_optimizers
    from matrixrl.train.update import update_policy

    torch.set_num_threads(1)
    policy, pad_token_id, episodes = rollout(args)
    base = dict(problems_per_step=args.problems, group_size=args.group, max_new_tokens=MAX_NEW_TOKENS, ppo_epochs=2, threads=1)
    configs, refused = variants(base)
    params = [p for _, ps in policy.parameter_sets().values() for p in ps if p.requires_grad]
    initial = [p.detach().clone() for p in params]

    def update(cfg) -> float:
        with torch.no_grad():  # the weights the rollout sampled with: the same old log-probs for all
            for p, value in zip(params, initial):
                p.copy_(value)
        optimizers = make_optimizers(policy, cfg)
        policy.train(True)
        began = time.process_time()
        update_policy(policy, optimizers, episodes, pad_token_id, cfg, micro_batch_tokens=cfg.micro_batch_tokens)
        return time.process_time() - began

    seconds: dict[tuple[str, str], list[float]] = {key: [] for key in configs}
    for repeat in range(args.repeats + 1):  # round 0 warms up
        for key, cfg in configs.items():
            taken = update(cfg)
            if repeat:
                seconds[key].append(taken)

    turns = [t for e in episodes for t in e.turns]
    tokens = sum(len(t.completion.completion_ids) for t in turns)
    learning = sum(t.advantage != 0.0 for t in turns)
    print(
        f"update_policy at ppo_epochs 2, {args.workflow} workflow, {args.policy} policy, tiny-s (random init), "
        f"{args.problems} problems x {args.group} = {len(episodes)} episodes, {len(turns)} turns ({learning} with an "
        f"advantage), {tokens} completion tokens, 1 thread; CPU seconds, median of {args.repeats} interleaved rounds:"
    )
    reference = statistics.median(seconds[REFERENCE])
    print(f"  {'loss':8s} {'level':8s} {'s/update':>9s} {'vs dapo@token':>14s}")
    for (loss, level), values in seconds.items():
        median = statistics.median(values)
        print(f"  {loss:8s} {level:8s} {median:9.4f} {median / reference:13.2f}x")
    if refused:
        print(f"refused by the schema (loss_problem), not run: {', '.join(refused)}")

if __name__ == "__main__":
    main()
