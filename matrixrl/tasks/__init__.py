"""Tasks: one module per task family; ``build_task`` maps a config's ``kind`` to it."""

from matrixrl.tasks.arith import ArithTask
from matrixrl.tasks.base import Problem, Task

TASK_KINDS = {"arith": ArithTask}


def build_task(name: str, config) -> Task:
    return TASK_KINDS[config.kind](name, config)


__all__ = ["Problem", "Task", "build_task"]
