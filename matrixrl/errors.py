"""Every error a user can fix, under one base class.

The CLI and a job's entry point catch :class:`UserError` once and print its message,
one line that names the file or key at fault and the fix, without a traceback. Any
other exception is a bug in matrixrl and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix; the message is one line and says how."""

    exit_code = 2
    """The CLI's exit status: 2, a usage problem (click's convention), unless a subclass says else."""


class ConfigError(UserError):
    """experiments.yaml, a ``--set`` or an ``--only`` that cannot be used."""


class DataError(UserError):
    """A task's data that cannot be used, attributed to one of the task's config keys."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


class ResultFileError(UserError):
    """A result file (``train.json``, an evaluation) that cannot be read or validated."""


class ProfileError(UserError):
    """A Snakemake profile that cannot be used."""


class SnakemakeError(UserError):
    """Snakemake could not evaluate the workflow."""

    exit_code = 1


class ModelLoadError(UserError):
    """A scale's model cannot be loaded; the message names the scale and the fix."""


class GpuClaimError(UserError):
    """No GPU could be claimed for a job."""
