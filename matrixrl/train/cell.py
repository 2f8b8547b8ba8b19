"""``build_cell``: what training and evaluation of one cell both build from its spec.

The caller sets torch's thread count first.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from matrixrl.grid import CellSpec
from matrixrl.models.hf import ModelSource, model_source
from matrixrl.models.policies import FullPolicy, Policy, build_policy, load_policy
from matrixrl.tasks import Task, build_task
from matrixrl.train.rollout import make_generate
from matrixrl.workflows import Workflow, build_workflow
from matrixrl.workflows.styles import PromptStyle, build_style


@dataclass(frozen=True)
class CellParts:
    """One cell's task, workflow and model source, as ``build_cell`` made them from ``spec``."""

    spec: CellSpec
    source: ModelSource
    tokenizer: object
    task: Task
    style: PromptStyle
    workflow: Workflow

    def new_policy(self, reference: bool = False) -> Policy:
        """The cell's policy (shared or isolated) on a fresh load of the base model;
        ``reference``: with the base model as the KL anchor's reference too."""
        spec = self.spec
        base = self.source.load_model(frozen=spec.policies.adapter == "lora")  # LoRA's base never trains
        policy = build_policy(spec.cell.policy, base, self.workflow.roles, spec.policies)
        return self._with_reference(policy) if reference else policy

    def load_policy(self, checkpoint: Path, reference: bool = False) -> Policy:
        """The cell's policy as saved in ``checkpoint`` (``reference``: see :meth:`new_policy`)."""
        spec = self.spec
        policy = load_policy(spec.cell.policy, checkpoint, self.workflow.roles, spec.policies, self.source)
        return self._with_reference(policy) if reference else policy

    def _with_reference(self, policy: Policy) -> Policy:
        if isinstance(policy, FullPolicy):  # LoRA's reference is its own base, adapters off
            with torch.random.fork_rng(devices=[]):  # loading must not move the training's RNG
                policy.attach_reference(self.source.load_model())
        return policy

    def make_generate(self, policy: Policy, **sampling):
        """A batched ``generate`` over ``policy`` with this cell's tokenizer (``rollout.make_generate``'s settings)."""
        return make_generate(policy, self.tokenizer, **sampling)


def build_cell(spec: CellSpec, base_dir: Path, device: str | None = None) -> CellParts:
    """The parts of cell ``spec`` whose base model is in ``base_dir`` (tiny scales).

    ``device`` overrides the scale's device (the ``cuda`` of the GPU a job claimed: models.devices.claimed_gpu).
    """
    source = model_source(spec.cell.scale, spec.scale, base_dir, device=device)
    tokenizer = source.load_tokenizer()
    task = build_task(spec.cell.task, spec.task)
    style = build_style(spec.scale.prompt_style, task.family, tokenizer, spec.prompts)
    workflow = build_workflow(spec.cell.workflow, spec.workflow, style)
    return CellParts(spec=spec, source=source, tokenizer=tokenizer, task=task, style=style, workflow=workflow)
