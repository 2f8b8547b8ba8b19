"""Tasks: one module per task family; ``build_task`` maps a config's ``kind`` to it.

Adding a kind: docs/extending.md. Nothing here imports ``matrixrl.config``.
"""

from typing import get_args

from matrixrl.errors import RegistrationError
from matrixrl.plugins import Registry, caller_module, load_plugins
from matrixrl.settings import Strict, kind_values
from matrixrl.tasks.arith import ArithTask
from matrixrl.tasks.base import Family, Problem, Task
from matrixrl.tasks.code import CodeTask
from matrixrl.tasks.mathdata import MathTask
from matrixrl.tasks.pyfunc import PyfuncTask

TASK_KINDS: Registry = Registry(
    "task kind",
    {
        "arith": ArithTask,
        "pyfunc": PyfuncTask,
        "gsm8k": MathTask,
        "math": MathTask,
        "math_generic": MathTask,
        "humaneval": CodeTask,
        "code_generic": CodeTask,
    },
)


def _settings() -> tuple:
    return tuple(dict.fromkeys(task.Settings for task in TASK_KINDS.values()))


def register_task_kind(kind: str, task: type) -> type:
    """Add task class ``task`` under ``kind`` (a plugin's line of ``TASK_KINDS``); its
    ``Settings`` must list ``kind`` among the values of its ``kind`` field."""
    global TASK_SETTINGS
    if kind not in kind_values(task.Settings):
        raise RegistrationError(f"task kind {kind!r}: {task.__qualname__}.Settings has no kind {kind!r}")
    # A plain BaseModel ignores a misspelt key in experiments.yaml; a family the styles and
    # eval_opt do not know failed only deep in a job (KeyError: 'text').
    if not issubclass(task.Settings, Strict):
        raise RegistrationError(
            f"task kind {kind!r}: {task.__qualname__}.Settings must subclass matrixrl.settings.Strict "
            "(a plain pydantic BaseModel ignores unknown keys)"
        )
    if getattr(task, "family", None) not in get_args(Family):
        raise RegistrationError(
            f"task kind {kind!r}: {task.__qualname__}.family is {getattr(task, 'family', None)!r}; it must be one of "
            f"{', '.join(get_args(Family))} (a new family is more than a plugin: docs/extending.md)"
        )
    TASK_KINDS.add(kind, task, by=caller_module())
    TASK_SETTINGS = _settings()
    return task


def task_code_digest(kind: str) -> str | None:
    """The digest of a plugin task kind's source (the registering module's, its class's and its
    Settings'), part of the digests of what it computes; None for a built-in kind."""
    task = TASK_KINDS[kind]
    return TASK_KINDS.code_digest(kind, task, task.Settings)


def build_task(name: str, config) -> Task:
    return TASK_KINDS[config.kind](name, config)


load_plugins()

TASK_SETTINGS = _settings()
"""Each task module's settings model, once each, in ``TASK_KINDS`` order: the members of
the config's ``TaskConfig`` union (their ``kind`` values, in this order, are what an
error lists as valid)."""

__all__ = ["Problem", "Task", "TASK_KINDS", "TASK_SETTINGS", "build_task", "register_task_kind", "task_code_digest"]
