"""Every error a user can fix, under one base class: printed as one line, without a traceback."""

from __future__ import annotations

import contextlib
import difflib
import errno
import os
import re
import shutil
import sqlite3
from collections.abc import Iterable
from pathlib import Path


class UserError(Exception):
    """A problem the user can fix; the message is one line and says how."""

    exit_code = 2
    """The CLI's exit status: 2, a usage problem (click's convention), unless a subclass says else."""


def closest(name: object, valid: Iterable[object]) -> str | None:
    """The name of ``valid`` nearest to ``name`` when one is near enough to be what was meant
    (``difflib``'s ratio at least 0.6, case aside), else None."""
    by_lower: dict[str, str] = {}
    for v in valid:
        by_lower.setdefault(str(v).lower(), str(v))
    found = difflib.get_close_matches(str(name).lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[found[0]] if found else None


def did_you_mean(name: object, valid: Iterable[object], listed: str = "use one of", otherwise: str = "") -> str:
    """The fix for an unknown ``name``, the same wherever a user names something: ``did you mean
    X?`` with the nearest of ``valid``, or, when none is near, every valid name (``use one of:
    A, B, C``; ``listed`` words the list's lead, e.g. ``valid keys here``). ``otherwise``, a fix
    for a name that is new rather than misspelt (``define it under 'scales:'``), follows either,
    or stands alone when there is no valid name at all (``scales: {}``)."""
    valid = [str(v) for v in valid]
    if not valid:  # nothing to list ("use one of:  or ...")
        return f"{otherwise} (none is defined yet)" if otherwise else f"{listed}: none"
    match = closest(name, valid)
    if match is not None:
        return f"did you mean {match}? (or {otherwise})" if otherwise else f"did you mean {match}?"
    return f"{listed}: {', '.join(valid)}" + (f" or {otherwise}" if otherwise else "")


PLUGIN_HINT = "or, if a plugin defines it, name its module in MATRIXRL_PLUGINS (docs/extending.md)"
"""The fix for a registry's name (a workflow, a task kind) that is near no built-in one: it may
be a plugin's, not imported (matrixrl.plugins)."""


def did_you_mean_registered(name: object, valid: Iterable[object]) -> str:
    """:func:`did_you_mean` for a name of a registry that plugins add to: a name near a valid one
    gets it alone (a typo); one near none gets the list and :data:`PLUGIN_HINT`."""
    valid = [str(v) for v in valid]
    fix = did_you_mean(name, valid)
    return fix if closest(name, valid) is not None else f"{fix}; {PLUGIN_HINT}"


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


class DivergedError(UserError):
    """A training whose loss, gradient or reward stopped being a number."""

    exit_code = 1


class ProfileError(UserError):
    """A Snakemake profile that cannot be used."""


class SnakemakeError(UserError):
    """Snakemake could not evaluate the workflow."""

    exit_code = 1


class ModelLoadError(UserError):
    """A scale's model cannot be loaded; the message names the scale and the fix."""


class GpuMemoryError(UserError):
    """Jobs whose estimated GPU memory exceeds the GPU they would get (matrixrl.gpu_memory):
    one line per job, with the fixes."""


class GpuClaimError(UserError):
    """No GPU could be claimed for a job."""


class PluginError(UserError, ImportError):
    """A module ``MATRIXRL_PLUGINS`` names that cannot be imported (an ImportError too, for code
    that imports a registry)."""


class RegistrationError(UserError, ValueError):
    """A workflow, task kind or table that cannot be registered under its name (a plugin's
    mistake, so one line as any other: a ValueError too, for code that registers)."""


_DISK_FIXES = {
    errno.ENOSPC: "no space left on the device; free some space, or point results_dir at a larger disk",
    errno.EDQUOT: "the disk quota is exhausted; free some space, or point results_dir elsewhere",
    errno.EROFS: "the file system is read-only; point results_dir at a writable folder",
    errno.EACCES: "permission denied; make the folder writable for this user, or point results_dir elsewhere",
    errno.EPERM: "operation not permitted; make the folder writable for this user, or point results_dir elsewhere",
}


class DiskError(UserError):
    """A write that failed for want of space or permission; the message names what,
    where, and the fix."""

    exit_code = 1

    def __init__(self, message: str, fix: str):
        super().__init__(message)
        self.fix = fix


# SQLite's result codes for the same causes (its errors carry no errno).
_SQLITE_FIXES = {
    "SQLITE_FULL": _DISK_FIXES[errno.ENOSPC],
    "SQLITE_READONLY": "the file or its folder is read-only or not writable for this user; "
    "make it writable, or point results_dir elsewhere",
    # Creating a store in a folder this user cannot write (SQLite gives no errno).
    "SQLITE_CANTOPEN": "cannot create or open it; make its folder writable for this user, or point results_dir elsewhere",
}


def disk_error_message(exc: BaseException, where: str | Path = ".") -> str | None:
    """One line naming a disk-space or permission failure anywhere in ``exc``'s chain, or None;
    writers that lose the OS error (torch, Rust libraries, SQLite) are recognised by their text,
    torch's only while ``where``'s file system is nearly full.
    """
    cause = _disk_cause(exc, where)
    if cause is None:
        return None
    path, fix = cause
    return f"writing {path}: {fix}" if path else fix


@contextlib.contextmanager
def disk_errors_named(path: Path, what: str = ""):
    """Raise a disk-space or permission failure inside the block as a :class:`DiskError`
    naming ``path`` (and ``what`` was being written there, which an outer block's
    ``what`` replaces), with the fix."""
    path = Path(path).absolute()
    prefix = f"writing {what} {path}" if what else f"writing {path}"
    try:
        yield
    except DiskError as exc:
        if not what:
            raise
        raise DiskError(f"{prefix}: {exc.fix}", exc.fix) from exc
    except UserError:
        raise
    except Exception as exc:
        cause = _disk_cause(exc, existing_parent(path))
        if cause is None:
            raise
        raise DiskError(f"{prefix}: {cause[1]}", cause[1]) from exc


# Why a path the user named cannot be written, by errno: the OS's words say less.
_PATH_REASONS = {
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EEXIST: "a file is where a folder must go",
    errno.EISDIR: "it is a folder, where a file must go",
    errno.ENAMETOOLONG: "a name in it is too long for the file system",
    errno.ELOOP: "it loops through symbolic links",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "the file system is read-only",
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is exhausted",
}


def os_error_reason(exc: OSError) -> str:
    """Why an OS error about a path happened, in words (``permission denied``)."""
    return _PATH_REASONS.get(exc.errno, (exc.strerror or str(exc)).lower())


def os_error_line(exc: OSError) -> str | None:
    """One line for an OS error about a path (``PATH: why``), or None when it names no path."""
    return None if exc.filename is None else f"{exc.filename}: {os_error_reason(exc)}"


@contextlib.contextmanager
def output_named(option: str, path: Path | None):
    """Writes to a path the user gave with ``option`` (``--html``, ``--out``...): any OS error
    inside, a full disk or a permission problem too, becomes one line naming the option,
    the path and why, with the fix: another path (not results_dir, which it is not).
    ``path`` None (the option left out: a default under results_dir) changes nothing."""
    if path is None:
        yield
        return
    try:
        yield
    except (OSError, DiskError) as exc:
        cause = exc
        while cause is not None and not isinstance(cause, OSError):
            cause = cause.__cause__ or cause.__context__
        if cause is None:  # a DiskError without an OS error behind it: its own words
            raise
        why = os_error_reason(cause)
        # A file in the way on the path is worth naming, as the user spelled it: the deepest
        # part of the path that exists, when it is not a folder.
        existing = next((part for part in Path(path).parents if os.path.lexists(part)), None)
        where = f" ({existing})" if existing is not None and not existing.is_dir() else ""
        raise DiskError(f"{option} {path}: cannot write there{where}: {why}; choose another path", "choose another path") from exc


def disk_error_in_text(text: str) -> DiskError | None:
    """The :class:`DiskError` of an OS error another process reported as text
    (``OSError: [Errno 30] Read-only file system: 'PATH'``), if ``text`` holds one."""
    found = re.search(r"\[Errno (\d+)\][^:]*: '([^']+)'", text)
    if found is None or int(found[1]) not in _DISK_FIXES:
        return None
    fix = _DISK_FIXES[int(found[1])]
    return DiskError(f"writing {found[2]}: {fix}", fix)


def existing_parent(path: Path) -> Path:
    """``path`` if it exists, else its nearest parent that does (what a write there would meet)."""
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def _disk_cause(exc: BaseException | None, where: str | Path) -> tuple[str | None, str] | None:
    """(the file named by the failure, or None; the fix) for a disk failure behind ``exc``."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _DISK_FIXES:
            return exc.filename, _DISK_FIXES[exc.errno]
        if isinstance(exc, sqlite3.Error):
            name = getattr(exc, "sqlite_errorname", "") or ""
            for prefix, fix in _SQLITE_FIXES.items():
                if name.startswith(prefix):  # e.g. SQLITE_READONLY_DIRECTORY
                    return None, fix
        text = str(exc)
        if "No space left on device" in text or "os error 28" in text:
            return None, _DISK_FIXES[errno.ENOSPC]
        if "iostream error" in text or "PytorchStreamWriter failed" in text:
            try:
                usage = shutil.disk_usage(where)
            except OSError:
                usage = None
            if usage is not None and usage.free < max(64 * 2**20, usage.total // 200):
                free = f" ({usage.free // 2**20} MiB free under {Path(where).resolve()})"
                return None, _DISK_FIXES[errno.ENOSPC] + free
        exc = exc.__cause__ or exc.__context__
    return None
