"""Retrieval and use: the entries a new problem is shown, and how they enter a prompt.

docs/memcollab.md, "Retrieval and use".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import cached_property

from matrixrl.memcollab.data import Entry, Label
from matrixrl.tasks.base import Problem

GUIDANCE_HEADER = (
    "Constraints learned from similar past problems. Use those that apply to this problem and "
    "ignore the rest; they are reminders, not solutions to copy."
)


class MemoryBank:
    """One memory's entries, grouped by source problem, with a TF-IDF index of the source questions."""

    def __init__(self, entries: Iterable[Entry]):
        self.entries = tuple(entries)
        self.by_problem: dict[str, list[Entry]] = {}
        for entry in self.entries:
            group = self.by_problem.setdefault(entry.problem_id, [])
            if group and (group[0].question, group[0].label) != (entry.question, entry.label):
                raise ValueError(f"entries of source problem {entry.problem_id!r} disagree on its question or label")
            group.append(entry)

    def __len__(self) -> int:
        return len(self.entries)

    @cached_property
    def _index(self):
        """(vectoriser, one l2-normalised row per source problem), or None when the questions have no words."""
        from sklearn.feature_extraction.text import TfidfVectorizer  # imported here: ~4 s, only where retrieval runs

        vectorizer = TfidfVectorizer()
        try:
            rows = vectorizer.fit_transform([group[0].question for group in self.by_problem.values()])
        except ValueError:  # an empty vocabulary: no question has a word of two characters
            return None
        return vectorizer, rows

    def similarities(self, question: str) -> dict[str, float]:
        """Each source problem's cosine similarity to ``question``."""
        if not self.by_problem or self._index is None:
            return dict.fromkeys(self.by_problem, 0.0)
        import numpy as np

        vectorizer, rows = self._index
        scores = (rows @ vectorizer.transform([question]).T).toarray().ravel()
        return dict(zip(self.by_problem, np.round(scores, 12).tolist()))


def retrieve(
    bank: MemoryBank, problem: Problem, label: Label, top_p: int = 3, per_problem: int = 3, limit: int | None = None
) -> list[Entry]:
    """The entries ``problem`` (labelled ``label``) is shown (see the module's rules)."""
    if top_p < 1 or per_problem < 1 or (limit is not None and limit < 0):
        raise ValueError(f"retrieval needs top_p, per_problem >= 1 and limit >= 0, got {top_p}, {per_problem}, {limit}")
    sources = [pid for pid, group in bank.by_problem.items() if pid != problem.id and group[0].label == label]
    if not sources:
        return []
    scores = bank.similarities(problem.question)
    ranked = sorted(sources, key=lambda pid: (-scores[pid], pid))[:top_p]
    found = [entry for pid in ranked for entry in bank.by_problem[pid][:per_problem]]
    return found if limit is None else found[:limit]


def guidance_block(entries: Sequence[Entry]) -> str:
    """The text a role is shown for ``entries``: a header and one line per distinct entry; "" for none."""
    texts = list(dict.fromkeys(entry.text for entry in entries))
    if not texts:
        return ""
    return GUIDANCE_HEADER + "\n" + "\n".join(f"- {text}" for text in texts)


def with_guidance(system: str, user: str, entries: Sequence[Entry]) -> tuple[str, str]:
    """A role's (system, user) messages with ``entries``' guidance at the start of the user message."""
    block = guidance_block(entries)
    return system, f"{block}\n\n{user}" if block else user
