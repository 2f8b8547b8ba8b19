"""Tasks: one module per task family; ``build_task`` maps a config's ``kind`` to it.

- ``arith``: seeded multi-term addition (math, tiny models);
- ``pyfunc``: seeded program synthesis from input/output examples (code, tiny models);
- ``gsm8k``, ``math``, ``math_generic``: math problems from files (``mathdata``);
- ``humaneval``, ``code_generic``: code problems with unit tests from files (``code``).
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


def build_task(name: str, config) -> Task:
    return TASK_KINDS[config.kind](name, config)


__all__ = ["Problem", "Task", "TASK_KINDS", "build_task"]
