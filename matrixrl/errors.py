"""Every error a user can fix, under one base class.

The CLI and a job's entry point catch :class:`UserError` once and print its message,
one line that names the file or key at fault and the fix, without a traceback. Any
other exception is a bug in matrixrl and keeps its traceback.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path


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


_DISK_FIXES = {
    errno.ENOSPC: "no space left on the device; free some space, or point results_dir at a larger disk",
    errno.EDQUOT: "the disk quota is exhausted; free some space, or point results_dir elsewhere",
    errno.EROFS: "the file system is read-only; point results_dir at a writable folder",
    errno.EACCES: "permission denied; make the folder writable for this user, or point results_dir elsewhere",
    errno.EPERM: "operation not permitted; make the folder writable for this user, or point results_dir elsewhere",
}


def disk_error_message(exc: BaseException, where: str | Path = ".") -> str | None:
    """One line naming a disk-space or permission failure anywhere in ``exc``'s chain, or None.

    Some writers lose the OS error on the way (torch reports a full disk as
    ``basic_ios::clear: iostream error``, Rust libraries as ``os error 28``); those are
    recognised by their text, the former only while ``where``'s file system is nearly full.
    """
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _DISK_FIXES:
            path = f"writing {exc.filename}: " if exc.filename else ""
            return f"{path}{_DISK_FIXES[exc.errno]}"
        text = str(exc)
        if "No space left on device" in text or "os error 28" in text:
            return _DISK_FIXES[errno.ENOSPC]
        if "iostream error" in text or "PytorchStreamWriter failed" in text:
            try:
                usage = shutil.disk_usage(where)
            except OSError:
                usage = None
            if usage is not None and usage.free < max(64 * 2**20, usage.total // 200):
                return f"{_DISK_FIXES[errno.ENOSPC]} ({usage.free // 2**20} MiB free under {Path(where).resolve()})"
        exc = exc.__cause__ or exc.__context__
    return None
