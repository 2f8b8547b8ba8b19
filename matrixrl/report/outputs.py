"""Where a command may write a path the user named: anywhere but over what the study reads."""

from __future__ import annotations

from pathlib import Path

from matrixrl.config import Config, HfScale
from matrixrl.errors import ConfigError
from matrixrl.layout import STORE_FILE, SUMMARY_FILE

STUDY_ENTRIES = ("base", "cells", "memory", "logs", ".matrixrl", ".snakemake", SUMMARY_FILE)
"""What matrixrl keeps right under ``results_dir`` (matrixrl.layout), besides the store and its
journal files (``matrixrl.sqlite``, ``matrixrl.sqlite-wal`` ...); ``plots/``, ``tensorboard/`` and
``wandb/`` hold outputs, which a later command may overwrite."""


def check_output(option: str, path: Path, config: Config, experiments: Path | None, example: str) -> None:
    """ConfigError when ``path``, given with ``option``, is (or lies inside) an input of the study
    of ``config`` read from ``experiments``; ``example`` is a path to suggest instead (report.html)."""
    target = path.resolve()  # through a symbolic link, what would be written
    fix = f"pass another path, such as {example}"
    if experiments is not None and target == Path(experiments).resolve():
        raise ConfigError(f"{option} {path}: is the experiments file this command reads; {fix}")
    results = Path(config.results_dir).resolve()
    if target.is_relative_to(results) and target != results:
        entry = target.relative_to(results).parts[0]
        if entry in STUDY_ENTRIES or entry.startswith(STORE_FILE):
            raise ConfigError(
                f"{option} {path}: is part of the study's results ({entry} in results_dir {results}); {fix}"
            )
    for key, given in _input_paths(config):
        source = Path(given).resolve()
        if target == source or target.is_relative_to(source):
            raise ConfigError(f"{option} {path}: is part of {key} ({source}), which the study reads; {fix}")


def _input_paths(config: Config) -> list[tuple[str, str]]:
    """(key, path) of each file or folder outside results_dir that the config names as an input."""
    found = [(f"tasks.{name}.path", task.path) for name, task in config.tasks.items() if getattr(task, "path", None)]
    for name, scale in config.scales.items():
        if isinstance(scale, HfScale) and Path(scale.path).is_absolute():  # a folder; a hub id is not a path
            found.append((f"scales.{name}.path", scale.path))
    return found
