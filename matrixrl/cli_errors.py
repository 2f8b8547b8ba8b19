"""A mistyped command line (an unknown option, a value of the wrong kind) as one ``Error:`` line.

:class:`OneLineErrors` prints click's usage errors as ``Error: OPTION VALUE: what is wrong; the fix``, exit 2.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import sys
from enum import Enum

import typer
from typer.core import TyperGroup

from matrixrl.errors import closest, did_you_mean

# The module of click's exceptions that this typer raises (typer's own click, or the click package).
_click = sys.modules[typer.BadParameter.__module__]
UsageError = _click.UsageError
_HELP = tuple(getattr(_click, name) for name in ("NoArgsIsHelpError",) if hasattr(_click, name))
"""Usage errors that print help, not an error (click 8.2 and later: a group run bare)."""

PROGRAM = "matrixrl"


class OneLineErrors(TyperGroup):
    """The group of the ``matrixrl`` app (and of its subgroups): every usage error click raises
    while parsing the command line, the group's or a command's, is one line (:func:`usage_line`)."""

    def make_context(self, info_name, args, parent=None, **extra):
        with one_line_usage_errors(parent):
            return super().make_context(info_name, args, parent=parent, **extra)

    def invoke(self, ctx):
        with one_line_usage_errors(ctx):
            return super().invoke(ctx)

    def resolve_command(self, ctx, args):
        try:
            name, command, rest = super().resolve_command(ctx, args)
        except UsageError as exc:
            name = args[0] if args else ""
            if (_HELP and isinstance(exc, _HELP)) or not name or name.startswith("-"):
                raise
            raise _Line(f"{_where(ctx)}{name}: no such command; {did_you_mean(name, self.list_commands(ctx))}") from exc
        # Some of click's errors of the command's options carry no context: they are about this one.
        ctx.meta[_COMMAND] = f"{_where(ctx)}{name} "
        return name, command, rest


_COMMAND = "matrixrl.command"


class _Line(UsageError):
    """A usage error whose message is already the line to print."""


@contextlib.contextmanager
def one_line_usage_errors(ctx=None):
    """Print a usage error raised inside as ``Error: LINE`` on stderr and exit with its status (2).
    ``ctx``: the group's context, whose command an error without a context of its own is about."""
    try:
        yield
    except UsageError as exc:
        if _HELP and isinstance(exc, _HELP):
            raise
        command = _where(exc.ctx) if getattr(exc, "ctx", None) is not None else ctx.meta.get(_COMMAND, "") if ctx else ""
        print(f"Error: {usage_line(exc, command)}", file=sys.stderr)
        raise typer.Exit(exc.exit_code) from None


def usage_line(exc, command: str = "") -> str:
    """One line for click's usage error ``exc``: what was given, what is wrong, the fix.
    ``command``: the (sub)command it is about as typed after ``matrixrl``, with a space (``report ``)."""
    if isinstance(exc, _Line):
        return exc.message
    ctx = getattr(exc, "ctx", None)
    param = getattr(exc, "param", None)
    see = f"see {PROGRAM} {command}--help"
    kind = type(exc).__name__
    if kind == "NoSuchOption":
        option = exc.option_name
        near = _closest_option(option, _option_names(ctx))
        return f"{option}: no such option; " + (f"did you mean {near}?" if near else see)
    if kind == "BadOptionUsage":  # Option '-c' requires an argument. Option '--wide' does not take a value.
        said = exc.message.removeprefix(f"Option '{exc.option_name}' ")
        return f"{exc.option_name}: {'needs a value' if 'requires an argument' in said else _plain(said)}; {see}"
    if kind == "MissingParameter" and param is not None:
        choices = _choices(param)
        fix = f"use one of: {', '.join(choices)}" if choices else see
        return f"{command.strip() or PROGRAM}: missing {_name(param)}; {fix}"
    if param is not None:
        return _bad_value(exc, param, command)
    extra = re.match(r"Got unexpected extra argument\S* \((.*)\)", exc.message or "")  # argument(s) (a b)
    if extra:
        return f"{command}{extra[1]}: unexpected argument; {see}"
    return f"{_plain(exc.message)}; {see}"


def _bad_value(exc, param, command: str) -> str:
    """The line of a value that click could not convert: ``OPTION VALUE: what; the fix``."""
    option = _name(param)
    given = _given(exc)
    where = f"{option} {shlex.quote(str(given))}" if given not in (None, "") else option  # --out '' reads as --out
    if getattr(param, "param_type_name", "option") == "argument" and given is not None:
        where = f"{command}{shlex.quote(str(given))}"  # as typed: export tensorbord
    choices = _choices(param)
    if choices is not None and given is not None:
        return f"{where}: unknown {param.name}; {did_you_mean(given, choices)}"
    problem = _pydantic_error(exc)
    bound = _BOUNDS.get(problem.get("type")) if problem else None
    if bound is not None and bound[0] in problem.get("ctx", {}):
        return f"{where}: must be {bound[1]} {problem['ctx'][bound[0]]}"
    if _whole_number(param):
        return f"{where}: expected a whole number, e.g. {option} {max(2, getattr(param, 'min', None) or 0)}"
    return f"{where}: {_plain(exc.message)}"


_BOUNDS = {
    "greater_than_equal": ("ge", "at least"),
    "greater_than": ("gt", "more than"),
    "less_than_equal": ("le", "at most"),
    "less_than": ("lt", "less than"),
}


def _name(param) -> str:
    """How the command line names ``param``: its long option (``--cores``), else its short
    one, or an argument's metavar (``TRACKER``)."""
    opts = list(getattr(param, "opts", None) or [])
    if getattr(param, "param_type_name", "option") == "argument" or not opts:
        return (getattr(param, "name", None) or "value").upper()
    return next((o for o in opts if o.startswith("--")), opts[0])


def _given(exc):
    """The value the user gave, where the error keeps it (the validation error behind it),
    or its message quotes it (``'two' is not a valid integer``); None if neither."""
    problem = _pydantic_error(exc)
    if problem and isinstance(problem.get("input"), (str, int, float)):
        return problem["input"]
    quoted = re.search(r"'([^']*)' is not", exc.message or "")
    return quoted[1] if quoted else None


def _pydantic_error(exc) -> dict:
    """The first error of the pydantic ValidationError behind ``exc`` (typer 0.2x converts
    values with pydantic), or {}."""
    errors = getattr(exc.__cause__, "errors", None)
    if not callable(errors):
        return {}
    try:
        found = errors()
    except Exception:  # not pydantic's: nothing to read
        return {}
    return dict(found[0]) if found else {}


def _annotation(param):
    return getattr(getattr(param, "type_descriptor", None), "annotation", None)


def _choices(param) -> list[str] | None:
    """The values an option of a fixed set (an Enum, click's Choice) takes, else None."""
    annotation = _annotation(param)
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return [str(member.value) for member in annotation]
    choices = getattr(getattr(param, "type", None), "choices", None)
    return [str(getattr(c, "value", c)) for c in choices] if choices else None


def _whole_number(param) -> bool:
    annotation = _annotation(param)
    return annotation is int or str(getattr(getattr(param, "type", None), "name", "")).startswith("integer")


def _option_names(ctx) -> list[str]:
    command = getattr(ctx, "command", None)
    names = [o for p in getattr(command, "params", []) for o in (*p.opts, *getattr(p, "secondary_opts", []))]
    return [n for n in names if n.startswith("-")] + ["--help"]


def _closest_option(option: str, names: list[str]) -> str | None:
    """The option of ``names`` nearest ``option``, compared without their dashes (which every
    option shares, and which would make --bogus near --columns)."""
    bare = {name.lstrip("-"): name for name in names}
    near = closest(option.lstrip("-"), bare)
    return bare[near] if near is not None else None


def _where(ctx) -> str:
    """The subcommand a message is about, as typed after ``matrixrl`` (``models ``), or ''."""
    names = []
    while ctx is not None and ctx.parent is not None:
        names.append(ctx.info_name)
        ctx = ctx.parent
    return "".join(f"{name} " for name in reversed(names))


def _plain(message: str) -> str:
    """Click's message as a clause: no ``Value error, `` lead, no full stop, lower-case start."""
    text = (message or "").removeprefix("Value error, ").strip().rstrip(".")
    return text[:1].lower() + text[1:]
