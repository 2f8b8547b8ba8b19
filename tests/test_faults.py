"""Failures a user can fix are named as such: a full disk, a read-only or forbidden folder."""

from __future__ import annotations

import errno

import pytest

from matrixrl.errors import disk_error_message


def test_a_full_disk_is_named_with_the_path_and_the_fix() -> None:
    with pytest.raises(OSError) as caught:
        with open("/dev/full", "w") as full:  # every write to /dev/full fails with ENOSPC
            full.write("x")
    assert caught.value.errno == errno.ENOSPC
    assert disk_error_message(caught.value) == (
        "no space left on the device; free some space, or point results_dir at a larger disk"
    )


def test_the_cause_is_found_behind_a_wrapping_error() -> None:
    try:
        try:
            raise OSError(errno.EROFS, "Read-only file system", "/data/results/cells/x/train.json")
        except OSError as exc:
            raise RuntimeError("saving the checkpoint failed") from exc
    except RuntimeError as wrapped:
        assert disk_error_message(wrapped) == (
            "writing /data/results/cells/x/train.json: the file system is read-only; "
            "point results_dir at a writable folder"
        )


def test_a_library_that_keeps_only_the_text_is_understood() -> None:
    # safetensors (Rust) reports a full disk this way.
    assert disk_error_message(RuntimeError("I/O error: No space left on device (os error 28)")) == (
        "no space left on the device; free some space, or point results_dir at a larger disk"
    )


def test_other_errors_keep_their_traceback() -> None:
    assert disk_error_message(ValueError("a bug")) is None
    assert disk_error_message(FileNotFoundError(errno.ENOENT, "No such file", "x")) is None
