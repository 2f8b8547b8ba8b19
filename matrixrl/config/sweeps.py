"""Extra grid axes: any setting, by its dotted key, with a list of values (docs/sweeps.md).

Each value is checked as ``--set KEY=VALUE`` would be; the first problem is one line naming ``grid.KEY``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from matrixrl.config.messages import format_validation_error
from matrixrl.config.schema import Config
from matrixrl.errors import ConfigError, did_you_mean
from matrixrl.settings import is_runtime

SWEEPABLE = ("train", "eval", "policies", "workflows", "tasks", "scales", "prompts", "memory")
"""The sections whose settings can be an axis: what a cell's spec is computed from."""


def spelled(value: Any) -> str:
    """An axis value as ``--only`` and ``--against`` take it, and tables name it: 5e-05, true, lora."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def is_value(raw: str, value: Any) -> bool:
    """Is ``raw``, as a user typed it after ``--only AXIS=`` or ``--against AXIS=``, the grid's
    ``value``? Its spelling (:func:`spelled`), or the same number: ``1.0e-4`` and ``1e-4`` are
    ``0.0001``."""
    if spelled(value) == raw:
        return True
    try:
        typed = yaml.safe_load(raw)
    except yaml.YAMLError:
        return False
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(typed) == float(value)  # YAML reads 1e-4 (no dot) as text; float() does not
        except (TypeError, ValueError):
            return False
    return typed == value


def key_parts(key: str, node: Any) -> list[str]:
    """``key``'s path of names through the nested mapping ``node``: split at its dots, except
    where dotted parts together name a key that ``node`` has, as a scale named ``qwen3-0.6b``
    in ``scales.qwen3-0.6b.path`` (the longest such name wins)."""
    parts = [part.strip() for part in key.split(".")]
    path, i = [], 0
    while i < len(parts):
        end = i + 1
        if isinstance(node, dict):
            end = next((j for j in range(len(parts), i + 1, -1) if ".".join(parts[i:j]) in node), i + 1)
        name = ".".join(parts[i:end])
        path.append(name)
        node = node.get(name) if isinstance(node, dict) else None
        i = end
    return path


def canonical(value: Any) -> str:
    """A value's identity as an axis value (1.0e-4 and 0.0001 are one value)."""
    return json.dumps(value, sort_keys=True)


def check_sweeps(config: Config) -> Config:
    """``config`` with every extra axis checked and its values as validated (``"1e-4"`` → 0.0001);
    ConfigError (``grid.KEY: …``) naming the first problem."""
    normalized = {}
    dumped = config.model_dump(mode="json") if config.grid.sweeps else {}
    for key, values in config.grid.sweeps.items():
        where = f"grid.{key}"
        parts = key_parts(key, dumped)
        if parts[0] not in Config.model_fields:  # a slip, as train.lr for trian.lr
            raise ConfigError(f"{where}: unknown section {parts[0]!r}; {did_you_mean(parts[0], SWEEPABLE)}")
        if parts[0] == "analysis":
            raise ConfigError(
                f"{where}: analysis settings are the report's thresholds, not part of what a cell computes, so they "
                f"cannot be an axis; try each value with --set {key}=VALUE (it reruns only analyse)"
            )
        if parts[0] not in SWEEPABLE:
            raise ConfigError(
                f"{where}: {parts[0]} settings are not part of what a cell computes, so they cannot be an axis; "
                f"sweep a key under one of: {', '.join(SWEEPABLE)}"
            )
        if parts[0] == "scales" and (len(parts) < 3 or parts[2] != "train"):
            raise ConfigError(
                f"{where}: a scale's definition chooses its base model, so it cannot be an axis; define a second "
                f"scale under scales: and list both in grid.scale (a scale's train: settings can be swept)"
            )
        if parts[0] == "memory" and key != "memory.train":
            raise ConfigError(
                f"{where}: the memory is built once per study, so its settings cannot be an axis; sweep "
                "memory.train (training with or without a memory), or use another results_dir"
            )
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where}: expected a non-empty list of values, e.g. {key}: [a, b]")
        validated = []
        for value in values:
            swept = with_settings(config, [(key, value)], where=where)
            owner, name = _owner(swept, parts)
            if owner is not None and is_runtime(type(owner).model_fields[name]):
                raise ConfigError(
                    f"{where}: a runtime setting (it changes no result), so it cannot be an axis; "
                    f"set it with --set {key}=VALUE"
                )
            validated.append(value_at(swept, key))
        texts = [canonical(v) for v in validated]
        repeated = [v for v, t in zip(values, texts) if texts.count(t) > 1]
        if repeated:
            raise ConfigError(f"{where}: {repeated[0]!r} is listed more than once (as another spelling, maybe); list each value once")
        normalized[key] = validated
    if not normalized:
        return config
    return config.model_copy(update={"grid": config.grid.model_copy(update={"sweeps": normalized})})


def with_settings(config: Config, assignments: Iterable[tuple[str, Any]], where: str | None = None) -> Config:
    """``config`` with each ``(dotted key, value)`` set, validated as a whole, without extra axes.

    A problem is a ConfigError naming ``where`` (default: the key) and what is wrong.
    """
    assignments = list(assignments)
    if not assignments:
        return config
    # Only what the file set, as --set sees it: validators that fill a default from
    # another key (eval.samples from eval.temperature) see the same as there.
    raw = config.model_dump(mode="json", exclude_unset=True)
    raw["grid"] = {k: v for k, v in raw["grid"].items() if k != "sweeps"}
    for key, value in assignments:
        node = raw
        parts = key_parts(key, raw)
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(
                    f"{where or 'grid.' + key}: {'.'.join(parts[: i + 1])} is a single value, not a section, "
                    f"so it has no key {parts[i + 1]!r}"
                )
            node = child
        node[parts[-1]] = copy.deepcopy(value)
    try:
        return Config.model_validate(raw)
    except ConfigError as exc:
        message = str(exc)
    except ValidationError as exc:
        message = format_validation_error(exc, "").removeprefix(": ")
    raise ConfigError(_named(message, assignments, where))


def _named(message: str, assignments: list[tuple[str, Any]], where: str | None) -> str:
    """``KEY: what`` → ``WHERE: what``; a problem of another key says which values caused it."""
    for key, _ in assignments:
        named = where or f"grid.{key}"
        if message.startswith(f"{key}: "):
            return f"{named}: {message[len(key) + 2:]}"
        if message.startswith(f"{key}."):  # an unknown key under it, say
            return f"{named}{message[len(key):]}"
    values = ", ".join(f"{key} = {value!r}" for key, value in assignments)
    return f"{where or 'grid'}: with {values}, {message}"


def value_at(config: Config, key: str) -> Any:
    """The validated value of the setting at ``key`` (JSON data), e.g. ``value_at(c, "train.lr")``."""
    node: Any = config
    for part in key_parts(key, config.model_dump(mode="json")):
        if isinstance(node, BaseModel):
            node = getattr(node, part)
        else:
            node = node[part]
    return node.model_dump(mode="json") if isinstance(node, BaseModel) else json.loads(json.dumps(node))


def _owner(config: Config, parts: list[str]) -> tuple[BaseModel | None, str]:
    """The settings model that holds the last key of ``parts``, and that key."""
    node: Any = config
    for part in parts[:-1]:
        node = getattr(node, part) if isinstance(node, BaseModel) else node.get(part)
    if isinstance(node, BaseModel) and parts[-1] in type(node).model_fields:
        return node, parts[-1]
    return None, parts[-1]
