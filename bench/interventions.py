"""What each intervention costs per update, as a ratio to the same update without it.

One fixed batch of episodes (bench/diagnostics.py's rollout: a randomly initialised
tiny-s model, 16 arith problems × a group of 8, through ``voting``; the advantages
are seeded standard-normal values, so every variant backpropagates real gradients).
Each variant times one training update as ``grpo_step`` does it after the rollout:
``assign_advantages``, then ``update_policy`` with the gradient diagnostics on.

- ``none`` (the reference): today's defaults.
- ``KL anchor``: ``train.kl_beta: 0.1``. One more forward per agent through the
  reference (the base model: a frozen copy under full fine-tuning, the adapters off
  under LoRA), and the turns without advantage take part too.
- ``damper``: ``train.damper: 0.3``. Two more flat copies of ``.grad`` per role, and
  the cosine and rescaling.
- ``agent-wise advantages``: ``train.advantage_group: agent``. Other groups, same work.

Variants run interleaved, one update of each per round, ``--rounds`` rounds after one
untimed warm-up round, so machine noise hits all alike. The table gives medians and
each variant's ratio to ``none`` under the same policy mode and adapter.

    python bench/interventions.py [--rounds 7]
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

from diagnostics import rollout  # noqa: E402
from train_step import build_random_base, train_config  # noqa: E402

VARIANTS = {
    "none": {},
    "KL anchor": {"kl_beta": 0.1},
    "damper": {"damper": 0.3},
    "agent-wise advantages": {"advantage_group": "agent"},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds (one update of each variant per round)")
    args = parser.parse_args()

    import torch

    from matrixrl.config import Policies
    from matrixrl.models.policies import FullPolicy, build_policy, load_causal_lm
    from matrixrl.train.interventions import Damper, needs_reference
    from matrixrl.train.rewards import assign_advantages
    from matrixrl.train.trainer import make_optimizers
    from matrixrl.train.update import update_policy

    torch.set_num_threads(1)
    base_cfg = train_config()
    print(f"{'policy':<9} {'adapter':<7} {'variant':<22} {'median s':>9} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        base_dir = Path(tmp) / "base"
        build_random_base(base_dir)
        workflow, episodes, pad = rollout(base_dir, "voting")
        advantages = [t.advantage for e in episodes for t in e.turns]
        for mode in ("shared", "isolated"):
            for adapter in ("full", "lora"):
                runs = {}
                for variant, settings in VARIANTS.items():
                    cfg = base_cfg.model_copy(update=settings)
                    torch.manual_seed(0)
                    policy = build_policy(mode, load_causal_lm(base_dir), workflow.roles, Policies(adapter=adapter))
                    if needs_reference(cfg) and isinstance(policy, FullPolicy):
                        policy.attach_reference(load_causal_lm(base_dir))
                    policy.train(True)
                    runs[variant] = (cfg, policy, make_optimizers(policy, cfg), Damper.from_train(cfg))
                seconds: dict[str, list[float]] = {v: [] for v in VARIANTS}
                for round_ in range(1 + args.rounds):
                    for variant, (cfg, policy, optimizers, damper) in runs.items():
                        # the rewards as the rollout left them (standard normal), then this variant's groups
                        for turn, advantage in zip((t for e in episodes for t in e.turns), advantages):
                            turn.reward = advantage
                        began = time.perf_counter()
                        assign_advantages(episodes, scale_rewards=cfg.scale_rewards, group_by=cfg.advantage_group)
                        update_policy(policy, optimizers, episodes, pad, cfg, damper=damper)
                        if round_:  # round 0 warms up
                            seconds[variant].append(time.perf_counter() - began)
                reference = statistics.median(seconds["none"])
                for variant, values in seconds.items():
                    median = statistics.median(values)
                    print(f"{mode:<9} {adapter:<7} {variant:<22} {median:>9.3f} {median / reference:>6.2f}")


if __name__ == "__main__":
    main()
