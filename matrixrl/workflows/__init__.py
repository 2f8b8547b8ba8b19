"""Workflows: one module per topology; ``build_workflow`` maps a name to it."""

from matrixrl.workflows.base import Completion, Episode, Turn, Workflow
from matrixrl.workflows.single import Single

WORKFLOWS = {"single": Single}


def build_workflow(name: str, settings=None) -> Workflow:
    return WORKFLOWS[name](settings)


__all__ = ["Completion", "Episode", "Turn", "Workflow", "build_workflow"]
