"""Atomic writes: a reader, or a run after a kill, sees the old content or the new, never half.

Written beside the target under a temporary name, then renamed over it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from matrixrl.errors import disk_errors_named


def write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` (parents created) through a uniquely named temporary file.

    A full disk or a read-only folder is a ``DiskError`` naming ``path``, not the temporary file.
    """
    path = Path(path)
    with disk_errors_named(path):
        _write_bytes(path, data)


def _write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: str | Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


@contextmanager
def replaced_dir(target: str | Path, tmp: str | Path | None = None) -> Iterator[Path]:
    """Fill the yielded temporary folder; on success it replaces ``target`` (removed first).
    A full disk or a read-only folder is a ``DiskError`` naming ``target``.

    ``tmp`` defaults to ``TARGET.tmp``, emptied first (what a kill left); pass a unique name where
    two processes may write the same target. On an exception the temporary folder is removed.
    """
    target = Path(target)
    tmp = Path(tmp) if tmp is not None else target.with_name(target.name + ".tmp")
    with disk_errors_named(target):
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            yield tmp
            if target.exists():
                shutil.rmtree(target)
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
