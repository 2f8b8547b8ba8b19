"""Workflows: one module per topology; ``build_workflow`` maps a name to it.

Adding a workflow means one module (a ``WorkflowBase`` with ``name``, ``roles``, ``run`` and
``warmstart_pairs``, plus its ``Settings``) and one line here. Every workflow takes a
prompt style (``matrixrl.workflows.styles``); without one it uses the compact style.
"""

from matrixrl.workflows import eval_opt, orch_workers, single, voting
from matrixrl.workflows.base import Completion, Episode, Turn, Workflow

WORKFLOWS = {
    "single": single.Single,
    "voting": voting.Voting,
    "eval_opt": eval_opt.EvalOpt,
    "orch_workers": orch_workers.OrchWorkers,
}


def build_workflow(name: str, settings=None, style=None) -> Workflow:
    return WORKFLOWS[name](settings, style)


__all__ = ["Completion", "Episode", "Turn", "Workflow", "WORKFLOWS", "build_workflow"]
