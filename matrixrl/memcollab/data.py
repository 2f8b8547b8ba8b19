"""The memory's records: trajectories, the pairs a distiller reads, labels, entries (JSON round-trips)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


def _checked(cls, data: Any) -> dict:
    """``data``'s fields for ``cls``, or a ValueError naming the missing and unknown keys."""
    if not isinstance(data, dict):
        raise ValueError(f"a {cls.__name__} record must be a JSON object, not {type(data).__name__}")
    fields = dataclasses.fields(cls)
    required = {f.name for f in fields if f.default is dataclasses.MISSING}
    missing = sorted(required - set(data))
    unknown = sorted(set(data) - {f.name for f in fields})
    if missing or unknown:
        said = [f"missing {', '.join(missing)}"] * bool(missing) + [f"unknown {', '.join(unknown)}"] * bool(unknown)
        raise ValueError(f"a {cls.__name__} record has {'; '.join(said)} keys")
    return dict(data)


@dataclass(frozen=True)
class Trajectory:
    """One model's attempt at one problem (``sample``: its index among that model's attempts)."""

    problem_id: str
    question: str
    model: str
    completion: str
    answer: str
    correct: bool
    tokens: int
    sample: int = 0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Trajectory:
        return cls(**_checked(cls, data))


@dataclass(frozen=True)
class Pair:
    """What one distillation reads: a problem and a preferred (correct) and/or rejected (incorrect) trajectory."""

    problem_id: str
    question: str
    preferred: Trajectory | None
    rejected: Trajectory | None

    def __post_init__(self):
        sides = [t for t in (self.preferred, self.rejected) if t is not None]
        if not sides:
            raise ValueError(f"a pair of problem {self.problem_id!r} needs at least one trajectory")
        if any(t.problem_id != self.problem_id for t in sides):
            raise ValueError(f"a pair of problem {self.problem_id!r} holds a trajectory of another problem")
        if self.preferred is not None and not self.preferred.correct:
            raise ValueError(f"the preferred trajectory of problem {self.problem_id!r} must be correct")
        if self.rejected is not None and self.rejected.correct:
            raise ValueError(f"the rejected trajectory of problem {self.problem_id!r} must be incorrect")

    @classmethod
    def single(cls, trajectory: Trajectory) -> Pair:
        """A one-trajectory pair: preferred if it is correct, else rejected."""
        side = {"preferred" if trajectory.correct else "rejected": trajectory}
        return cls(trajectory.problem_id, trajectory.question, side.get("preferred"), side.get("rejected"))

    @property
    def contrastive(self) -> bool:
        return self.preferred is not None and self.rejected is not None

    @property
    def models(self) -> tuple[str, ...]:
        """The models whose trajectories it holds, preferred's first, each once."""
        return tuple(dict.fromkeys(t.model for t in (self.preferred, self.rejected) if t is not None))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Pair:
        data = _checked(cls, data)
        for side in ("preferred", "rejected"):
            if data[side] is not None:
                data[side] = Trajectory.from_dict(data[side])
        return cls(**data)


@dataclass(frozen=True)
class Label:
    """A problem's place in its family's taxonomy (``matrixrl.memcollab.labels``)."""

    category: str
    subcategory: str

    def __str__(self) -> str:
        return f"{self.category} / {self.subcategory}"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Label:
        return cls(**_checked(cls, data))


@dataclass(frozen=True)
class Entry:
    """One distilled constraint and where it came from: its source problem, models and distiller digest."""

    text: str
    problem_id: str
    question: str
    label: Label
    models: tuple[str, ...]
    mode: str
    distiller: str

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "models": list(self.models)}

    @classmethod
    def from_dict(cls, data: dict) -> Entry:
        data = _checked(cls, data)
        return cls(**{**data, "label": Label.from_dict(data["label"]), "models": tuple(data["models"])})
