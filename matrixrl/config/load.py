"""Reading an experiments file: YAML, ``--set`` and ``--only``, validation, paths.

Every problem is a one-line ``ConfigError``.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from matrixrl.config.messages import format_validation_error
from matrixrl.config.schema import AXES, Config, HfScale
from matrixrl.config.sweeps import check_sweeps, is_value, key_parts, spelled
from matrixrl.errors import ConfigError, DataError, closest, did_you_mean, existing_parent
from matrixrl.tasks.files import locate


class DuplicateKeyError(yaml.YAMLError):
    """A mapping that names a key twice (YAML would silently keep the last)."""


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping: in an experiments
    file the second ``steps:`` under ``train:`` would silently win."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                mark = key_node.start_mark
                raise DuplicateKeyError(f"{key!r} is given twice in one mapping (line {mark.line + 1}); keep one")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def parse_set(assignment: str) -> tuple[list[str], Any]:
    key, sep, raw = assignment.partition("=")
    path = [part.strip() for part in key.split(".")]
    if not sep or not all(path):
        raise ConfigError(f"--set {assignment!r}: expected dotted.key=VALUE, e.g. --set train.steps=4")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        raise ConfigError(f"--set {assignment!r}: the value is not valid YAML; quote it or fix its syntax")
    return path, value


def apply_set(raw: dict, assignment: str) -> None:
    path, value = parse_set(assignment)
    path = key_parts(".".join(path), raw)  # scales.qwen3-0.6b.path names the scale qwen3-0.6b
    if path[0] == "grid" and len(path) > 2:
        # grid.train.lr=[...]: the extra axis train.lr, a dotted key under grid:
        path = ["grid", ".".join(path[1:])]
    node = raw
    for i, part in enumerate(path[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            where = ".".join(path[: i + 1])
            raise ConfigError(
                f"--set {assignment!r}: {where} is a single value, not a section, so it has no key "
                f"{path[i + 1]!r}; use --set {where}=VALUE"
            )
        node = child
    node[path[-1]] = value


def parse_only(assignment: str) -> tuple[str, list[str]]:
    axis, sep, raw = assignment.partition("=")
    axis = axis.strip()
    wanted = [v.strip() for v in raw.split(",") if v.strip()]
    if sep and axis and axis not in AXES and "." not in axis:
        fix = did_you_mean(axis, AXES)
        example = "" if closest(axis, AXES) else ", e.g. --only seed=0,1"
        raise ConfigError(f"--only {assignment!r}: unknown axis {axis!r}; {fix}{example}")
    if not sep or not axis or not wanted:
        raise ConfigError(
            f"--only {assignment!r}: expected AXIS=V1,V2 with AXIS one of {', '.join(AXES)}, "
            "e.g. --only seed=0,1"
        )
    if any("=" in w for w in wanted):  # --only scale=tiny-s,task=arith: the values after task= are task's
        groups = [[axis, []]]
        for w in wanted:
            if "=" in w:
                name, _, w = w.partition("=")
                groups.append([name.strip(), []])
            groups[-1][1] += [w.strip()] if w.strip() else []
        if not all(name in AXES or "." in name for name, _ in groups[1:]):
            # scale=tiny-s=x: not a second axis, a value with an '=' (which no value of a grid holds)
            bad = next(w for w in wanted if "=" in w)
            name = bad.partition("=")[0].strip()
            meant = name or bad.partition("=")[2].strip()  # tiny-s of tiny-s=x, 1 of seed==1
            example = ",".join([*groups[0][1], *([meant] if meant else [])]) or "V1,V2"
            why = f"{name} is no axis" if name else "no axis is named before it"
            raise ConfigError(
                f"--only {assignment!r}: the value {bad} holds an '=' and {why}; "
                f"give one AXIS=V1,V2 per --only, e.g. --only {axis}={example}"
            )
        split = " ".join(f"--only {name}={','.join(values) or 'V1,V2'}" for name, values in groups)
        raise ConfigError(f"--only {assignment!r}: one axis per --only; repeat the option: {split}")
    repeated = sorted({w for w in wanted if wanted.count(w) > 1}, key=wanted.index)
    if repeated:
        raise ConfigError(f"--only {assignment!r}: {', '.join(repeated)} given more than once; list each value once")
    return axis, wanted


def apply_only(raw: dict, assignment: str, earlier: str | None = None) -> None:
    """Narrow ``raw``'s grid to ``assignment``'s values; ``earlier``: an --only that narrowed
    the same axis before (the two intersect), named when a value is not left."""
    axis, wanted = parse_only(assignment)
    grid = raw.get("grid")
    values = grid.get(axis) if isinstance(grid, dict) else None
    if values is None and "." in axis:
        raise ConfigError(
            f"--only {assignment!r}: {axis} is not an axis of this grid; "
            f"--only narrows the grid, use --set grid.{axis}=[...] to make it one"
        )
    if not isinstance(values, list):
        return  # validation will report the missing axis
    by_text = {spelled(v): v for v in values}
    for w in wanted:  # another spelling of a grid's value (1.0e-4 for 0.0001) means that value
        if w not in by_text and (same := [v for v in values if is_value(w, v)]):
            by_text[w] = same[0]
    missing = [w for w in wanted if w not in by_text]
    if missing and earlier is not None:
        raise ConfigError(
            f"--only {assignment!r}: {', '.join(missing)} not left by --only {earlier!r}, which narrowed "
            f"grid.{axis} first (repeated --only options intersect); give the values in one: --only {axis}=V1,V2"
        )
    if missing:
        # A name may be misspelt (tiny-x for tiny-s); a number is another value, not a slip.
        names = [text for text, value in by_text.items() if isinstance(value, str) and text not in wanted]
        if len(missing) == 1 and (near := closest(missing[0], names)) is not None:
            raise ConfigError(
                f"--only {assignment!r}: {missing[0]} not in grid.{axis}; did you mean {near}? "
                f"(or --set grid.{axis}=[...] to change the grid)"
            )
        raise ConfigError(
            f"--only {assignment!r}: {', '.join(missing)} not in grid.{axis} "
            f"[{', '.join(map(str, values))}]; --only narrows the grid, "
            f"use --set grid.{axis}=[...] to change it"
        )
    chosen = [by_text[w] for w in wanted]
    if twice := [w for i, w in enumerate(wanted) if any(is_value(w, v) for v in chosen[:i])]:
        raise ConfigError(f"--only {assignment!r}: {twice[0]} is another spelling of a value given before; list each value once")
    grid[axis] = chosen


def load_config(path: str | Path, sets: list[str] = (), only: list[str] = ()) -> Config:
    """Read, override and validate an experiments file; raise ConfigError on any problem."""
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{source}: no such file; pass -c PATH or create experiments.yaml")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: not UTF-8 text (byte {exc.start} is {exc.object[exc.start]:#04x}); save it as UTF-8")
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read it ({exc.strerror})")
    try:
        raw = yaml.load(text, Loader=UniqueKeyLoader)
    except DuplicateKeyError as exc:
        raise ConfigError(f"{source}: {exc}")
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "syntax error"
        context, start = getattr(exc, "context", None), getattr(exc, "context_mark", None)
        if context and start and (start.line, start.column) != (getattr(mark, "line", None), getattr(mark, "column", None)):
            # Where the broken construct began: usually the line to fix.
            problem += f" ({context} that starts at line {start.line + 1}, column {start.column + 1})"
        raise ConfigError(f"{source}: not valid YAML{where}: {problem}")
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping of sections (grid:, scales:, ...) at the top level")
    as_read = copy.deepcopy(raw)
    _override(raw, sets, only)
    try:
        config = validate(raw, source, sets)
    except ConfigError as exc:
        raise _blamed(exc, as_read, source, sets, only) from None
    base = path.resolve().parent
    _check_results_dir(base / config.results_dir, _with_set(source, "results_dir", sets))
    scales = {name: _resolve_model_path(name, scale, base, source, sets) for name, scale in config.scales.items()}
    tasks = {name: _resolve_task_data(name, task, base, source, sets) for name, task in config.tasks.items()}
    return config.model_copy(
        update={"results_dir": str((base / config.results_dir).resolve()), "scales": scales, "tasks": tasks}
    )


def _override(raw: dict, sets: list[str], only: list[str]) -> None:
    """``raw`` with ``sets`` applied, then narrowed by ``only``."""
    for assignment in sets:
        apply_set(raw, assignment)
    narrowed: dict[str, str] = {}  # axis -> the --only that narrowed it first: a later one narrows further
    for assignment in only:
        axis = parse_only(assignment)[0]
        apply_only(raw, assignment, narrowed.get(axis))
        narrowed.setdefault(axis, assignment)


def _blamed(exc: ConfigError, as_read: dict, source: str, sets: list[str], only: list[str]) -> ConfigError:
    """``exc``, a validation error of the file with its overrides, naming the ``--set`` without which
    it does not happen when its key named none (``--set scales={}`` leaves grid.scale's names
    undefined): the file may be right."""
    message = str(exc)
    if not sets or not message.startswith(f"{source}: "):
        return exc
    for assignment in reversed(sets):
        trial = copy.deepcopy(as_read)
        try:
            _override(trial, [s for s in sets if s != assignment], only)
        except ConfigError:
            continue  # the others alone do not apply: no test of this one
        try:
            validate(trial, source)
        except ConfigError as other:
            if str(other) == message:
                continue  # the same error without it: not this one's
        return ConfigError(f"{source} with --set {assignment!r}: {message[len(source) + 2 :]}")
    return exc


def _check_results_dir(results: Path, source: str) -> None:
    """``results`` can be a folder: neither it nor a part of its path is a file (which every
    command would meet as an OS error about some file below it)."""
    blocker = existing_parent(results)
    if blocker.is_dir():
        return
    if blocker == results:
        raise ConfigError(f"{source}: results_dir: {results} is a file, not a folder; point results_dir at a folder")
    raise ConfigError(
        f"{source}: results_dir: {results} is under {blocker}, a file, not a folder; point results_dir at a folder"
    )


def _resolve_task_data(name: str, task, base: Path, source: str, sets: list[str] = ()):
    """A file-based task's ``path`` made absolute (relative to the experiments file) and checked.

    Only that the files exist is checked here; their records are read by the task.
    """
    if getattr(task, "path", None) is None:
        return task
    path = (base / Path(task.path).expanduser()).resolve()
    try:
        locate(path, task.split, task.train_split)
    except DataError as exc:
        key = f"tasks.{name}.{exc.field}"
        raise ConfigError(f"{_with_set(source, key, sets)}: {key}: {exc.message}") from None
    return task.model_copy(update={"path": str(path)})


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


def _resolve_model_path(name: str, scale, base: Path, source: str, sets: list[str] = ()):
    """An hf scale's ``path`` as an absolute folder, or unchanged when it is a hub id.

    A path that starts with ``/``, ``./``, ``../`` or ``~``, or names an existing folder, is a
    folder; anything else must look like a hub id (``NAME`` or ``ORG/NAME``).
    """
    if not isinstance(scale, HfScale):
        return scale
    where = f"{_with_set(source, f'scales.{name}.path', sets)}: scales.{name}.path"
    text = scale.path
    explicit = text.startswith(("/", "./", "../", "~"))
    folder = (base / Path(text).expanduser()).resolve()
    if folder.is_dir():
        return scale.model_copy(update={"path": str(folder)})
    if explicit:
        raise ConfigError(
            f"{where}: no folder {folder}; point it at a model folder (config.json, weights, tokenizer) "
            "or use a hub id such as Qwen/Qwen3-0.6B"
        )
    if not _HUB_ID.fullmatch(text):
        raise ConfigError(
            f"{where}: {text!r} is neither a folder (relative to {base}) nor a hub id such as Qwen/Qwen3-0.6B; fix the path"
        )
    return scale


def validate(raw: dict, source: str, sets: list[str] = ()) -> Config:
    """``raw`` (a parsed experiments file) as a :class:`Config`; a one-line ConfigError naming ``source`` if not,
    and the ``--set`` behind the value when one of ``sets`` wrote it (the file may be right)."""
    try:
        return check_sweeps(Config.model_validate(raw))
    except ConfigError as exc:  # a check across keys: ``KEY.PATH: what is wrong; the fix``
        message = str(exc)
        key = re.match(r"[^\s:]+(?=: )", message)
        raise ConfigError(f"{_with_set(source, key[0] if key else '', sets)}: {message}") from None
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, _with_set(source, _error_key(exc), sets))) from None


def _error_key(err: ValidationError) -> str:
    """The dotted key ``err`` is first about (``grid.seed[0]``), as a ``--set`` spells it."""
    loc = list(err.errors()[0]["loc"])
    if len(loc) > 2 and loc[0] in ("scales", "tasks"):
        del loc[2]  # the discriminated union's kind tag, which a key path does not spell
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" if i else str(part) for i, part in enumerate(loc))


def _with_set(source: str, key: str, sets: list[str]) -> str:
    """``source``, with the last of ``sets`` that wrote the value at the dotted ``key`` (or a
    section holding it, or a value under it) when one did: the file may be right. An error of
    the whole file (``key`` empty) is the file's."""

    def under(a: str, b: str) -> bool:
        return a == b or a.startswith((f"{b}.", f"{b}["))

    for assignment in reversed(sets):
        written = ".".join(parse_set(assignment)[0])  # as typed: grid.train.lr, scales.qwen3-0.6b.path
        if key and (under(key, written) or under(written, key)):
            return f"{source} with --set {assignment!r}"
    return source
