"""matrixrl's own environment variables (``MATRIXRL_*``): each named, read and checked here.

The CLI checks every one before a command starts (:func:`check_environment`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from matrixrl.errors import UserError

JOB_SERVER_LINGER_S = "MATRIXRL_JOB_SERVER_LINGER_S"
"""Seconds a job server stays once no process that asked it for a job is alive (0: it ends with its runs)."""
GPU_WAIT_S = "MATRIXRL_GPU_WAIT_S"
"""Seconds a job waits for a GPU that other jobs hold."""
GPU_LOCK_DIR = "MATRIXRL_GPU_LOCK_DIR"
"""The folder of the GPUs' lock files (default: TMPDIR/matrixrl-gpus)."""
PLUGINS = "MATRIXRL_PLUGINS"
"""Modules outside the package that add workflows, task kinds and tables (matrixrl.plugins)."""

SECONDS = {JOB_SERVER_LINGER_S: 300.0, GPU_WAIT_S: 600.0}
"""The variables that hold seconds, and their defaults."""


class EnvironmentVariableError(UserError):
    """A ``MATRIXRL_*`` variable whose value cannot be used."""


def seconds(name: str, env: Mapping[str, str] | None = None) -> float:
    """The seconds ``name`` (one of :data:`SECONDS`) holds in ``env`` (default: this process's
    environment), its default where unset or empty; an EnvironmentVariableError for anything but
    a finite number of seconds, 0 or more."""
    raw = (os.environ if env is None else env).get(name, "")
    if not raw.strip():
        return SECONDS[name]
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise EnvironmentVariableError(f"{name}={raw!r}: expected seconds, e.g. {SECONDS[name]:g}")
    return value


def check_environment(env: Mapping[str, str] | None = None) -> None:
    """An EnvironmentVariableError for the first ``MATRIXRL_*`` variable of ``env`` whose value cannot be used."""
    env = os.environ if env is None else env
    for name in SECONDS:
        seconds(name, env)
    lock_dir = env.get(GPU_LOCK_DIR, "")
    if lock_dir and os.path.exists(lock_dir) and not os.path.isdir(lock_dir):
        raise EnvironmentVariableError(f"{GPU_LOCK_DIR}={lock_dir!r}: is a file; name a folder for the GPUs' lock files")
