"""Workflows: one module per topology, registered in ``WORKFLOWS`` (adding one: docs/extending.md)."""

import re

from matrixrl.errors import RegistrationError
from matrixrl.plugins import Registry, caller_module, load_plugins
from matrixrl.workflows import eval_opt, orch_workers, single, voting
from matrixrl.workflows.base import Completion, Episode, Turn, Workflow, WorkflowBase, WorkflowSettings
from matrixrl.workflows.styles.roles import STYLE_ROLES, RolePrompt

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
        raise RegistrationError(f"workflow {cls.__qualname__}: name {name!r} must be lower-case letters, digits and _")
    if not getattr(cls, "description", "").strip() or not getattr(cls, "roles", ()):
        raise RegistrationError(f"workflow {name!r}: give {cls.__qualname__} a one-line description and its roles")
    _check_roles(name, cls)
    return WORKFLOWS.add(name, cls, by=caller_module())


def workflow_code_digest(name: str) -> str | None:
    """The digest of a plugin workflow's source (the registering module's, its class's and its
    Settings'), part of the digests of what it computes; None for a built-in workflow."""
    cls = WORKFLOWS[name]
    return WORKFLOWS.code_digest(name, cls, cls.settings_model)


def _check_roles(name: str, cls: type[WorkflowBase]) -> None:
    """What can be told of a workflow's roles before it runs: each one has a prompt, and
    every role it prompts or runs in parallel is one of them. A role left out of ``roles``
    has no parameters of its own under isolated: its turns would be trained as no one's,
    or (a one-role workflow) isolated reported as a copy of shared. (Run time checks the
    rest: ``workflows.base.rollout``.)"""
    roles, where = cls.roles, f"workflow {name!r}: {cls.__qualname__}"
    if not isinstance(roles, tuple) or not all(isinstance(r, str) and _NAME.fullmatch(r) for r in roles) or len(set(roles)) != len(roles):
        raise RegistrationError(f"{where}.roles must be a tuple of distinct role names (lower-case letters, digits, _), got {roles!r}")
    for attribute, listed in (("prompts", tuple(cls.prompts)), ("parallel_roles", tuple(cls.parallel_roles))):
        for role in listed:
            if role not in roles:
                raise RegistrationError(f"{where}.{attribute} names role {role!r}, which is not in its roles {roles}; add it to roles")
    for role in roles:
        if role not in cls.prompts and role not in STYLE_ROLES:
            raise RegistrationError(
                f"{where} has no prompt for its role {role!r}; declare it in prompts as a RolePrompt "
                f"(the styles write only the built-in roles: {', '.join(STYLE_ROLES)})"
            )


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
    "workflow_code_digest",
]
