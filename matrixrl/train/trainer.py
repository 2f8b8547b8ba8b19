"""The GRPO training loop for one cell (workflow × task × scale × policy × seed).

Step ``s`` draws from ``(seed, s)``, so a resumed run replays an uninterrupted one. docs/architecture.md, "The
GRPO step".
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from matrixrl.config import Train
from matrixrl.config.schema import AUTO_MICRO_BATCH_TOKENS
from matrixrl.errors import DivergedError
from matrixrl.grid import CellSpec, checkpoint_steps, save_steps
from matrixrl.layout import checkpoint_dir
from matrixrl.models.policies import Policy
from matrixrl.tasks import Task
from matrixrl.train.cell import build_cell
from matrixrl.train.checkpoints import STATE_FILE, resume_point, save_checkpoint
from matrixrl.train.interventions import Damper, needs_reference
from matrixrl.train.metrics import role_metrics
from matrixrl.train.rewards import assign_advantages, assign_rewards, score_episodes
from matrixrl.train.update import update_policy
from matrixrl.workflows import Workflow
from matrixrl.workflows.base import Generate, rollout
from matrixrl.workflows.styles import PromptGuide

def step_seed(seed: int, step: int) -> int:
    return int(np.random.SeedSequence([seed, step]).generate_state(1)[0])


def init_seed(seed: int) -> int:
    """Seeds what building the policy draws (LoRA's initial A matrices), whatever the
    process drew before: a cell's initial adapters depend on its seed alone."""
    return int(np.random.SeedSequence([seed, 0x1A17]).generate_state(1)[0])


def make_optimizers(policy, cfg: Train) -> dict[str, torch.optim.Optimizer]:
    """One AdamW per parameter set of ``policy``: ``cfg.lr``, betas 0.9/0.99, no weight decay."""
    return {
        name: torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.99), weight_decay=0.0)
        for name, (_, params) in policy.parameter_sets().items()
    }


def train_cell(
    spec: CellSpec, base_dir: Path, cell_dir: Path, log: Callable[[str], None] = print,
    guide: Callable[[Task], PromptGuide] | None = None, on_step: Callable[[dict], None] | None = None,
) -> dict:
    """Train one cell to ``spec.train.steps``, resuming from its last checkpoint if any.

    ``on_step`` gets each newly trained step's metrics row; ``guide`` makes a guided cell's
    :class:`PromptGuide` (under ``fork_rng``).
    """
    cfg = spec.train
    torch.set_num_threads(cfg.threads)
    cell = build_cell(spec, base_dir)
    prepare = None
    if spec.memory is not None and guide is None:
        raise ValueError(f"{spec.cell.id} trains with memory {spec.memory.mode}: its prompt guide is needed")
    if guide is not None:
        with torch.random.fork_rng(devices=[]):  # making the guide must not move the training's RNG
            hook = guide(cell.task)
        prepare = lambda problems: hook.apply(cell.style, problems)  # noqa: E731
    saves = set(save_steps(cfg))

    digest = spec.resume_digest()
    exact = cell.source.device == "cpu"  # docs/real-models.md, "What is exact where"
    start = resume_point(cell_dir, digest, cfg.steps, log, evaluated=checkpoint_steps(cfg), exact=exact)
    anchored = needs_reference(cfg)
    damper = Damper.from_train(cfg)
    if start is None:
        torch.manual_seed(init_seed(spec.cell.seed))
        policy = cell.new_policy(reference=anchored)
        metrics: list[dict] = []
        diagnostics: list[dict] = []
        roles: list[dict] = []
    else:
        policy = cell.load_policy(checkpoint_dir(cell_dir, start), reference=anchored)
        log(f"resuming {spec.cell.id} from its checkpoint at step {start}")
    if getattr(spec.scale, "gradient_checkpointing", False):
        policy.enable_gradient_checkpointing()
    optimizers = make_optimizers(policy, cfg)

    def logs() -> dict:
        kept = {"metrics": metrics, "diagnostics": diagnostics, "roles": roles}
        return {**kept, "damper": damper.state_dict()} if damper is not None else kept

    if start is None:
        start = 0
        save_checkpoint(cell_dir, 0, policy, optimizers, logs(), digest)
    else:
        # On CPU first: load_state_dict moves optimizer state to its parameters' device.
        state = torch.load(checkpoint_dir(cell_dir, start) / STATE_FILE, weights_only=False, map_location="cpu")
        for name, opt in optimizers.items():
            opt.load_state_dict(state["optimizers"][name])
        torch.set_rng_state(state["torch_rng"])
        # The logs up to the resumed step (a checkpoint past ``steps`` is never resumed from).
        metrics = state["metrics"]
        diagnostics = state["diagnostics"]
        roles = state["roles"]
        if damper is not None:
            damper.load_state_dict(state["damper"])

    run = GrpoRun(
        seed=spec.cell.seed,
        policy=policy,
        optimizers=optimizers,
        workflow=cell.workflow,
        task=cell.task,
        generate=cell.make_generate(
            policy, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, sample=True,
            **({"batch_size": cfg.rollout_batch_size} if cfg.rollout_batch_size else {}),
        ),
        pad_token_id=cell.tokenizer.pad_token_id,
        cfg=cfg,
        damper=damper,
        prepare=prepare,
    )
    for step in range(start, cfg.steps):
        row, step_roles, step_diagnostics = grpo_step(run, step)
        check_finite(spec.cell.id, row)
        if on_step is not None:
            on_step(row)
        roles.extend(step_roles)
        diagnostics.extend(step_diagnostics)
        metrics.append(row)
        log(
            f"step {step + 1}/{cfg.steps} reward {row['reward_mean']:.3f} loss {row['loss']:+.4f} "
            f"entropy {row['entropy']:.3f} len {row['response_length']:.2f} grad {row['grad_norm']:.3f}"
        )
        if step + 1 in saves:
            save_checkpoint(cell_dir, step + 1, policy, optimizers, logs(), digest)
    return {
        "cell": spec.cell.id,
        "axes": spec.cell.axes(),
        "spec_digest": spec.train_digest(),
        "steps": cfg.steps,
        "metrics": metrics,
        "diagnostics": diagnostics,
        "roles": roles,
    }


def check_finite(cell_id: str, row: dict) -> None:
    """A step's metrics must be numbers: a NaN or infinite loss, gradient or reward means
    the numerics failed (no result file can hold it), which a lower learning rate fixes."""
    for field in ("loss", "grad_norm", "entropy", "reward_mean"):
        if not math.isfinite(row[field]):
            raise DivergedError(
                f"{cell_id}: training diverged at step {row['step']}: {field} is {row[field]}; "
                "lower train.lr (docs/lr-sweep.md) or train.max_grad_norm, or check that the model's weights are finite"
            )


@dataclass
class GrpoRun:
    """What every GRPO step of one training run works on; ``policy`` and ``optimizers`` change in place."""

    seed: int
    policy: Policy
    optimizers: dict[str, torch.optim.Optimizer]
    workflow: Workflow
    task: Task
    generate: Generate
    pad_token_id: int
    cfg: Train
    damper: Damper | None = None  # the damper's moving averages, when it is on
    prepare: Callable | None = None  # called with each step's problems before the rollouts (a PromptGuide's)


def grpo_step(run: GrpoRun, step: int):
    """One GRPO update of ``run`` at 0-based ``step``: its metrics row, per-role rows and diagnostics rows
    (1-based step)."""
    policy, task, cfg = run.policy, run.task, run.cfg
    began = time.perf_counter()
    rng = np.random.default_rng(step_seed(run.seed, step))
    torch.manual_seed(step_seed(run.seed, step))
    problems = task.train_problems(rng, cfg.problems_per_step)
    if run.prepare is not None:
        run.prepare(problems)
    batch = [p for p in problems for _ in range(cfg.group_size)]
    groups = [g for g in range(len(problems)) for _ in range(cfg.group_size)]

    policy.train(False)
    episodes = rollout(run.workflow, batch, groups, run.generate)
    scores = score_episodes(task, episodes)  # every answer of the step in one batch
    assign_rewards(episodes, task, cfg.reward, scores)
    roles = [{"step": step + 1, **r} for r in role_metrics(episodes, task, scores)]
    group_sizes = assign_advantages(episodes, scale_rewards=cfg.scale_rewards, group_by=cfg.advantage_group)
    roles += [{"step": step + 1, "role": r, "metric": "group_size", "value": n} for r, n in group_sizes.items()]

    policy.train(True)
    micro_batch_tokens = AUTO_MICRO_BATCH_TOKENS if cfg.micro_batch_tokens == "auto" else cfg.micro_batch_tokens
    update = update_policy(
        policy, run.optimizers, episodes, run.pad_token_id, cfg, damper=run.damper, micro_batch_tokens=micro_batch_tokens
    )
    row = dict(update.metrics)
    roles += update.role_rows(step + 1)
    rewards = [e.reward for e in episodes]
    row.update(
        step=step + 1,
        reward_mean=float(np.mean(rewards)),
        reward_std=float(np.std(rewards)),
        group_size=min(group_sizes.values()),
        seconds=time.perf_counter() - began,
        completion_tokens=sum(len(t.completion.completion_ids) for e in episodes for t in e.turns),
    )
    return row, roles, [{"step": step + 1, **d} for d in update.diagnostics]
