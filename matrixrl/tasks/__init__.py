"""Tasks: one module per task family; ``build_task`` maps a config's ``kind`` to it.

- ``arith``: seeded multi-term addition (math, tiny models);
- ``pyfunc``: seeded program synthesis from input/output examples (code, tiny models);
- ``gsm8k``, ``math``, ``math_generic``: math problems from files (``mathdata``);
- ``humaneval``, ``code_generic``: code problems with unit tests from files (``code``).

Each module holds its task class and that task's ``Settings`` (its entry under
``tasks:``, a pydantic model whose ``kind`` field lists the kinds it serves; the
class names it as ``Task.Settings``). Adding a task kind means its module and one
line in ``TASK_KINDS``: experiments.yaml's ``tasks:`` schema is built from it
(``TASK_SETTINGS``). Nothing here imports ``matrixrl.config``.
"""

from matrixrl.tasks.arith import ArithTask
from matrixrl.tasks.base import Problem, Task
from matrixrl.tasks.code import CodeTask
from matrixrl.tasks.mathdata import MathTask
from matrixrl.tasks.pyfunc import PyfuncTask

TASK_KINDS = {
    "arith": ArithTask,
    "pyfunc": PyfuncTask,
    "gsm8k": MathTask,
    "math": MathTask,
    "math_generic": MathTask,
    "humaneval": CodeTask,
    "code_generic": CodeTask,
}

TASK_SETTINGS = tuple(dict.fromkeys(task.Settings for task in TASK_KINDS.values()))
"""Each task module's settings model, once each, in ``TASK_KINDS`` order: the members of
the config's ``TaskConfig`` union (their ``kind`` values, in this order, are what an
error lists as valid)."""


def build_task(name: str, config) -> Task:
    return TASK_KINDS[config.kind](name, config)


__all__ = ["Problem", "Task", "TASK_KINDS", "TASK_SETTINGS", "build_task"]
