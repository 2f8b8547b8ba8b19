"""Registries, and the plugins that add to them from outside the package (docs/extending.md).

Imports nothing heavy.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import sys
import traceback

from matrixrl.environment import PLUGINS as ENV
from matrixrl.errors import PluginError, RegistrationError

# A module as ``import`` names it: a relative name (.x) or a path (../x) has no package to start from.
_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")

_loaded: str | None = None  # the value of ENV whose modules are imported (or being imported)


def plugin_modules() -> list[str]:
    """The modules ``MATRIXRL_PLUGINS`` names, in order."""
    return [name.strip() for name in os.environ.get(ENV, "").split(",") if name.strip()]


def load_plugins() -> None:
    """Import the modules of ``MATRIXRL_PLUGINS`` (once per process; a call made while they are
    being imported, by a plugin importing a registry, returns at once)."""
    global _loaded
    if _loaded is not None:
        return
    _loaded = os.environ.get(ENV, "")
    try:
        for name in plugin_modules():
            if not _MODULE_NAME.fullmatch(name):
                raise PluginError(
                    f"{ENV} names {name!r}, which is no module name; name each plugin as Python imports it "
                    "(my_plugins.toy), with its folder on PYTHONPATH (docs/extending.md)"
                )
            try:
                importlib.import_module(name)
            except ModuleNotFoundError as exc:
                if exc.name is None or not (name == exc.name or name.startswith(f"{exc.name}.")):
                    raise PluginError(_failed_import(name, exc, f"install {exc.name!r} or drop that import")) from exc
                raise PluginError(
                    f"{ENV} names {name!r}, which is not importable here; put the folder that holds it on "
                    "PYTHONPATH (docs/extending.md)"
                ) from exc
            except RegistrationError as exc:
                raise PluginError(f"{ENV} names {name!r}, which cannot register: {exc}") from exc
            except Exception as exc:  # the plugin's own bug: where, and how to see the whole traceback
                raise PluginError(_failed_import(name, exc, f"python -c 'import {name}' shows the traceback")) from exc
    except BaseException:
        _loaded = None  # not loaded: the next import of a registry says so again
        raise


def _failed_import(name: str, exc: BaseException, fix: str) -> str:
    """One line for a plugin whose import raised: the error and the plugin's line that raised it."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<frozen")]
    where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    error = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return f"{ENV} names {name!r}, whose import failed{where}: {error}; {fix}"


class Registry(dict):
    """Names → what they mean (a workflow class, a task class, a table), in registration order.

    :meth:`add` is how a plugin adds one; once sealed (the config schema derives from it), a
    later ``add`` is an error rather than a silent omission.
    """

    def __init__(self, kind: str, entries: dict | None = None):
        super().__init__(entries or {})
        self.kind = kind
        self.sealed_by: str | None = None
        self.registered_by: dict[str, str] = {}  # name → the module that added it (built-ins: none)

    def add(self, name: str, value, by: str | None = None):
        if self.sealed_by is not None and name not in self:
            raise RegistrationError(
                f"{self.kind} {name!r} is registered after {self.sealed_by} was built from the {self.kind}s; "
                f"register it when the plugin module is imported, before that module imports {self.sealed_by}"
            )
        if name in self and self[name] is not value:
            raise RegistrationError(
                f"{self.kind} {name!r} is registered already (by {_origin(self[name])}); give yours a name of its own"
            )
        self[name] = value
        if by is not None:
            self.registered_by.setdefault(name, by)
        return value

    def code_digest(self, name: str, *classes: type) -> str | None:
        """A digest of the plugin source ``name`` runs (None for a built-in entry): see :func:`code_digest`."""
        if name not in self.registered_by:
            return None
        return code_digest([self.registered_by[name], *(m for cls in classes for m in _plugin_modules_of(cls))])

    def seal(self, by: str) -> None:
        if self.sealed_by is None:
            self.sealed_by = by


def _origin(value) -> str:
    return getattr(value, "__module__", None) or type(value).__module__


def caller_module(depth: int = 2) -> str | None:
    """The name of the module whose code called the function that calls this (a registration's plugin)."""
    try:
        return sys._getframe(depth).f_globals.get("__name__")
    except ValueError:
        return None


# Where a class's own code ends: the package's bases (WorkflowBase, SeededTask, Strict) and the libraries under them.
_NOT_PLUGIN = ("matrixrl", "builtins", "abc", "typing", "pydantic")


def _plugin_modules_of(cls: type) -> list[str]:
    """The modules of ``cls`` and of its bases down to the first one of matrixrl's (or a library's)."""
    modules = []
    for klass in cls.__mro__:
        if klass.__module__.split(".")[0] in _NOT_PLUGIN:
            break
        modules.append(klass.__module__)
    return modules


def code_digest(modules) -> str | None:
    """A digest of the source files of ``modules`` (plugin modules: a registration's and those of
    the classes it registered), so that the results computed with a plugin's task kind or
    workflow change digests when its code does (docs/extending.md); None when there are none.
    A module without a file (``__main__`` run from a prompt) counts by its name alone."""
    names = sorted({name for name in modules if name and name.split(".")[0] not in _NOT_PLUGIN})
    if not names:
        return None
    digest = hashlib.sha256()
    for name in names:
        path = getattr(sys.modules.get(name), "__file__", None)
        digest.update(name.encode() + b"\0")
        if path is not None and os.path.isfile(path):
            with open(path, "rb") as source:
                digest.update(source.read())
        digest.update(b"\0")
    return digest.hexdigest()[:12]
