"""The library versions matrixrl needs, and the guard where a wrong one would fail silently."""

from __future__ import annotations

import importlib.metadata

from matrixrl.errors import UserError

REQUIRED: dict[str, tuple[str, str]] = {
    "transformers": (
        ">=5.24,<6",
        "5.24 is the first whose models take the KV cache as `cache=` (older ones ignore the "
        "argument, and rollouts decode without their cache)",
    ),
    "torch": (
        ">=2.6",
        "transformers 5 turns PyTorch off below 2.6 (it logs it once), and no model loads",
    ),
    "typer": (
        ">=0.29",
        "0.29 is the first that converts options through pydantic, whose errors the CLI's one-line "
        "usage errors read (older ones word them otherwise, or misparse options)",
    ),
    "statsmodels": (
        ">=0.14.5",
        "older ones fail on import with current scipy (`_lazywhere` was removed), and the claims table needs it",
    ),
}
"""Library → (its requirement, as pyproject.toml writes it; why those bounds)."""


class LibraryVersionError(UserError):
    """An installed library outside the range matrixrl needs, or one that behaves as if it were."""


def installed_version(name: str) -> str | None:
    """The installed distribution's version, or None when it is not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


PINNED_FIRST = {
    "torch": "install torch first and pinned, e.g. pip install torch==2.13.0 (a looser spec can pull a multi-GB "
    "CUDA build), then pip install -e .",
}
"""Libraries whose fix is not a plain ``pip install`` of the range."""


def fix_for(name: str) -> str:
    """The install line that brings ``name`` within its requirement."""
    return PINNED_FIRST.get(name, f"pip install '{name}{REQUIRED[name][0]}'")


def outside(name: str, version: str | None = None) -> str | None:
    """Why ``name`` at ``version`` (default: the installed one) breaks ``REQUIRED``'s
    requirement, in words, or None when it meets it."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    spec, why = REQUIRED[name]
    version = installed_version(name) if version is None else version
    if version is None:
        return f"{name} is not installed"
    try:
        admitted = Version(version) in SpecifierSet(spec)
    except InvalidVersion:
        return f"{name}'s version {version!r} cannot be read"
    return None if admitted else f"{name} {version} is outside matrixrl's requirement {spec}: {why}"


def require(name: str) -> None:
    """Raise :class:`LibraryVersionError` (one line: what is installed, the fix) when ``name``
    is outside its requirement."""
    problem = outside(name)
    if problem is not None:
        raise LibraryVersionError(f"{problem}; fix: {fix_for(name)}")


def check_kv_cache_kept(cache, expected: int) -> None:
    """Raise :class:`LibraryVersionError` unless ``cache`` holds ``expected`` positions after a
    forward pass given it as ``cache=``: a model that dropped it would decode each token
    without its context, with no error of its own."""
    held = cache.get_seq_length()
    if held == expected:
        return
    problem = outside("transformers")
    cause = f"{problem}; fix: {fix_for('transformers')}" if problem else (
        f"transformers {installed_version('transformers')} is within the requirement, so the model's own forward "
        "drops the argument; "
        "fix: use a model class that accepts `cache=` (transformers' own, not remote code written for older versions)"
    )  # fmt: skip
    raise LibraryVersionError(
        f"refusing to decode: the model kept {held} of {expected} positions in the KV cache passed as `cache=`, "
        f"so every token would be decoded without its context; {cause}"
    )
