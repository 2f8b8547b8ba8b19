"""Workflows: one module per topology, registered in ``WORKFLOWS``.

Adding a workflow means one module (a ``WorkflowBase`` with ``name``, ``description``,
``roles``, ``run`` and ``warmstart_pairs``, plus its ``Settings``) and one line in
``WORKFLOWS``, or, outside the package, ``register_workflow`` in a plugin module
(docs/extending.md). The rest derives from the registry: experiments.yaml's
``workflows:`` section (each workflow's ``Settings`` and ``description``), the valid
values and help of ``grid.workflow``, the roles that per-role settings may name, the
warm-start's role formats. Every workflow takes a prompt style
(``matrixrl.workflows.styles``); without one it uses the compact style. A role that
the styles have no method for gets its prompt from ``RolePrompt``\\ s the workflow
declares (``WorkflowBase.prompts``): a new role touches no style.
"""

import re

from matrixrl.plugins import Registry, load_plugins
from matrixrl.workflows import eval_opt, orch_workers, single, voting
from matrixrl.workflows.base import Completion, Episode, Turn, Workflow, WorkflowBase, WorkflowSettings
from matrixrl.workflows.styles.roles import RolePrompt

WORKFLOWS: Registry = Registry(
    "workflow",
    {
        "single": single.Single,
        "voting": voting.Voting,
        "eval_opt": eval_opt.EvalOpt,
        "orch_workers": orch_workers.OrchWorkers,
    },
)
"""Every workflow by name: the one list of them (``grid.workflow``'s values, in this order)."""

_NAME = re.compile(r"[a-z][a-z0-9_]*")


def register_workflow(cls: type[WorkflowBase]) -> type[WorkflowBase]:
    """Add workflow class ``cls`` under ``cls.name`` (a plugin's line of ``WORKFLOWS``; it
    can decorate the class). Its ``Settings`` must be a ``WorkflowSettings`` whose every
    field has a default and a description, as the built-in workflows' are."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"workflow {cls.__qualname__}: name {name!r} must be lower-case letters, digits and _")
    if not getattr(cls, "description", "").strip() or not getattr(cls, "roles", ()):
        raise ValueError(f"workflow {name!r}: give {cls.__qualname__} a one-line description and its roles")
    return WORKFLOWS.add(name, cls)


def build_workflow(name: str, settings=None, style=None) -> Workflow:
    return WORKFLOWS[name](settings, style)


load_plugins()

__all__ = [
    "Completion",
    "Episode",
    "RolePrompt",
    "Turn",
    "Workflow",
    "WorkflowBase",
    "WorkflowSettings",
    "WORKFLOWS",
    "build_workflow",
    "register_workflow",
]
