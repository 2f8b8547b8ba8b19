"""matrixrl: experiment matrices for RL training of multi-agent LLM workflows.

``matrixrl.Study`` is the Python API (:mod:`matrixrl.study`, docs/api.md). It is
imported on first use, so that ``import matrixrl`` (and the CLI's start) loads
none of pandas, torch or matplotlib.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"
__all__ = ["Study", "__version__"]

if TYPE_CHECKING:
    from matrixrl.study import Study


def __getattr__(name: str):
    if name == "Study":
        from matrixrl.study import Study

        return Study
    raise AttributeError(f"module 'matrixrl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
