"""Tasks whose problems are records read from local files (or, with a network, the hub).

Where records come from and how the evaluation set is fixed: docs/tasks.md.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from abc import abstractmethod
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from matrixrl.errors import ConfigError, DataError
from matrixrl.settings import Strict
from matrixrl.tasks.base import BatchScorer, Problem

if TYPE_CHECKING:
    import numpy as np

SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".parquet")


class Settings(Strict):
    """Where a file-based task's problems are and how they split: the settings every
    file-based task kind shares (``mathdata.Settings``, ``code.Settings`` add theirs)."""

    path: str | None = Field(
        None,
        description="a .jsonl/.jsonl.gz/.json/.parquet file, or a folder of one such file per split "
        "(test.jsonl, train.jsonl); relative to the experiments file",
    )
    hub: str | None = Field(None, description="a hub dataset id for datasets.load_dataset (needs the network)")
    hub_config: str | None = Field(None, description="the hub dataset's configuration, e.g. main for openai/gsm8k")
    split: str = Field("test", min_length=1, description="the evaluated split: a file of the folder or a hub split")
    train_split: str | None = Field(
        None, min_length=1, description="the split training draws from; null: the problems of split that n_eval leaves"
    )
    n_eval: int | None = Field(
        100, ge=1, description="problems in the fixed evaluation set; null: all of split (then set train_split)"
    )
    eval_pick: Literal["first", "random"] = Field("random", description="first n_eval of split, or drawn with seed")
    seed: int = Field(0, ge=0, description="seeds the evaluation pick")

    @model_validator(mode="after")
    def _one_source(self):
        if self.path is not None and self.hub is not None:
            raise ValueError("set either path (local data) or hub (a dataset id), not both")
        if self.hub_config is not None and self.hub is None:
            raise ValueError("hub_config applies to hub datasets only; remove it or set hub")
        if self.n_eval is None and self.train_split is None:
            raise ValueError(
                "n_eval: none evaluates the whole split and leaves nothing to train on; set train_split or a number"
            )
        return self


def _split_files(folder: Path, split: str) -> list[Path]:
    return [folder / f"{split}{suffix}" for suffix in SUFFIXES if (folder / f"{split}{suffix}").is_file()]


def splits_in(folder: Path) -> list[str]:
    """The split names a folder offers (``train`` for ``train.jsonl``)."""
    names = set()
    for file in folder.iterdir():
        for suffix in SUFFIXES:
            if file.name.endswith(suffix) and file.is_file():
                names.add(file.name[: -len(suffix)])
    return sorted(names)


def locate(path: Path, split: str, train_split: str | None) -> dict[str, Path]:
    """The files holding the evaluation split (``"eval"``) and the training split (``"train"``, if any).

    Raises ``DataError`` naming the config key to fix.
    """
    if path.is_file():
        if train_split is not None:
            raise DataError(
                "train_split",
                f"path {path} is one file, not a folder of splits; remove train_split "
                "(training then draws from the problems left after n_eval) or point path at a folder",
            )
        return {"eval": path}
    if not path.is_dir():
        raise DataError("path", f"no such file or folder {path}; fix the path or put the data there")
    found = {}
    for role, name, key in (("eval", split, "split"), ("train", train_split, "train_split")):
        if name is None:
            continue
        files = _split_files(path, name)
        if not files:
            offered = ", ".join(splits_in(path)) or "none"
            raise DataError(
                key,
                f"{path} has no {', '.join(name + s for s in SUFFIXES)}; splits found there: {offered}",
            )
        if len(files) > 1:
            raise DataError(key, f"{path} holds split {name!r} twice ({', '.join(f.name for f in files)}); keep one")
        found[role] = files[0]
    return found


def read_records(path: Path) -> list[dict]:
    """The records of a ``.jsonl``, ``.jsonl.gz``, ``.json`` (a list) or ``.parquet`` file."""
    name = path.name
    try:
        if name.endswith(".parquet"):
            import pandas as pd

            return pd.read_parquet(path).to_dict("records")
        opener = gzip.open if name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as handle:
            if name.endswith(".json"):
                records = json.load(handle)
            else:
                records = [json.loads(line) for line in handle if line.strip()]
    except (OSError, ValueError, ImportError) as exc:
        raise DataError("path", f"cannot read {path}: {str(exc).splitlines()[0]}") from None
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise DataError("path", f"{path} does not hold a list of records (objects with named fields)")
    return records


def read_hub(name: str, config: str | None, split: str) -> list[dict]:
    """One split of a hub dataset; a one-line ``DataError`` when it cannot be had."""
    try:
        import datasets
    except ImportError:
        raise DataError("hub", "reading from the hub needs the datasets package: pip install datasets") from None
    try:
        return list(datasets.load_dataset(name, config, split=split))
    except ConnectionError:
        raise DataError(
            "hub",
            f"cannot reach the Hugging Face hub to load {name!r}; download the data and set path: to "
            "the file or folder instead",
        ) from None
    except Exception as exc:  # datasets raises many kinds: all mean "not loadable as configured"
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError("hub", f"cannot load {name!r} (config {config!r}, split {split!r}): {first}") from None


def question_key(question: str) -> str:
    """A stable id for a question: identical questions (after blank normalisation) share it."""
    return hashlib.sha1(" ".join(question.split()).encode()).hexdigest()[:12]


def field(record: dict, key: str, where: str) -> str:
    """``record[key]`` as text; a ``DataError`` naming the record when it is missing."""
    value = record.get(key)
    if value is None:
        raise DataError("path", f"{where} has no {key!r} field")
    return value if isinstance(value, str) else str(value)


class FileTask(BatchScorer):
    """A task over records: the split logic, with the record format left to subclasses."""

    # --- subclasses --------------------------------------------------------------------

    @abstractmethod
    def _problem(self, record: dict, where: str) -> Problem: ...

    def _default_records(self) -> tuple[str, list[dict]]:
        """Records when neither ``path`` nor ``hub`` is set (only tasks with packaged data)."""
        raise DataError("path", "set path: (a file or folder) or hub: (a dataset id)")

    # --- loading and splitting -----------------------------------------------------------

    def _error(self, exc: DataError):
        return ConfigError(f"tasks.{self.name}.{exc.field}: {exc.message}")

    def _load(self, role: str) -> tuple[str, list[dict]] | None:
        cfg = self.config
        if cfg.hub is not None:
            split = cfg.split if role == "eval" else cfg.train_split
            if split is None:
                return None
            return f"{cfg.hub} split {split}", read_hub(cfg.hub, cfg.hub_config, split)
        if cfg.path is None:
            return self._default_records() if role == "eval" else None
        files = locate(Path(cfg.path), cfg.split, cfg.train_split)
        if role not in files:
            return None
        return str(files[role]), read_records(files[role])

    def _problems(self, role: str) -> list[Problem] | None:
        loaded = self._load(role)
        if loaded is None:
            return None
        source, records = loaded
        problems: dict[str, Problem] = {}
        for i, record in enumerate(records):
            problem = self._problem(record, f"{source} record {i + 1}")
            problems.setdefault(problem.id, problem)  # a repeated question counts once
        if not problems:
            raise DataError("path", f"{source} holds no records")
        return list(problems.values())

    @cached_property
    def _split(self) -> tuple[list[Problem], list[Problem]]:
        try:
            return self._make_split()
        except DataError as exc:
            raise self._error(exc) from None

    def _make_split(self) -> tuple[list[Problem], list[Problem]]:
        cfg = self.config
        pool = self._problems("eval")
        n_eval = len(pool) if cfg.n_eval is None else cfg.n_eval
        separate = self._problems("train")
        spare = 0 if separate is not None else 1  # the split must also leave training problems
        if n_eval + spare > len(pool):
            need = "fewer than" if spare else "at most"
            raise DataError("n_eval", f"{n_eval} but the evaluation split has {len(pool)} problems; use {need} {len(pool)}")
        if cfg.eval_pick == "first":
            chosen = list(range(n_eval))
        else:
            import numpy as np

            chosen = sorted(np.random.default_rng([cfg.seed, 1]).permutation(len(pool))[:n_eval].tolist())
        evaluated = [pool[i] for i in chosen]
        eval_ids = {p.id for p in evaluated}
        train = [p for p in (separate if separate is not None else pool) if p.id not in eval_ids]
        if not train:
            raise DataError("train_split", "every training problem is also in the evaluation set; use another split")
        return evaluated, train

    def eval_problems(self) -> list[Problem]:
        return list(self._split[0])

    def train_problems(self, rng: np.random.Generator, n: int) -> list[Problem]:
        pool = self._split[1]
        picks = rng.choice(len(pool), size=n, replace=n > len(pool))
        return [pool[int(i)] for i in picks]

    def warmstart_problems(self, rng: np.random.Generator, n: int) -> list[Problem]:
        # Real data has no easier shape; a warm-start (tiny scales only) sees training problems.
        return self.train_problems(rng, n)
