"""MemCollab memory (arXiv 2603.23234): constraints distilled from contrasting trajectories.

The method. Two models, a weaker and a stronger one, solve the same memory-building
problems. For each problem, the preferred trajectory τ+ is the weak model's if it is
correct, else the strong model's; the other is τ−. A distiller reads the pair and
writes a few abstract constraints, "When <situation>, enforce <what to do>; avoid
<the error seen in τ−>", free of the problem's answer and numbers. Each problem gets
a (category, subcategory) label. A new problem is labelled too; the memory of its
label's source problems is ranked by TF-IDF similarity of their questions to the new
one, and the entries of the top three are put into the prompt as guidance. Because
the contrast is between models, the memory keeps what is right about the task rather
than one model's habits, and one memory serves both models. The comparisons (``MODES``):
no memory, a model's own memory, the other model's own memory (naive transfer),
self-contrast (a model's own right vs wrong attempts) and MemCollab.

This package is the pure core: texts and records in, texts and records out; no model.
The caller renders the (system, user) messages with a chat template, generates, and
hands the completions back. Where the paper is silent, these are the choices (each
module's docstring gives its details; docs/memcollab.md collects them):

- Pairs (``modes``): MemCollab keeps only problems whose two outcomes differ (both
  right or both wrong: nothing to contrast). Self-contrast needs sampled attempts
  (``needed_trajectories``' samples, 4 by default) and takes one pair per problem,
  the first correct vs the first incorrect sample; every mode distils at most one
  pair per problem. Own and transfer memory distil a single trajectory: a correct
  one as τ+ alone ("what made it work"), an incorrect one as τ− alone ("where it
  went wrong"); the distiller never sees the reference answer.
- Entries (``distill``): one per line, "When" ... "enforce" required, "avoid"
  optional; dropped and counted when they address the reader (prompt injection), are
  too long, leak the answer (a ``\\boxed`` or the reference answer as a token),
  repeat one another or exceed the limit.
- Labels (``labels``): a fixed numbered taxonomy per family, so a small labeller's
  labels can match; anything unreadable is ``other / other``.
- Retrieval (``retrieval``): TF-IDF fitted once per memory on its source questions;
  ties go to the smaller problem id; a problem never retrieves its own entries.
- Use: the guidance block opens the user message; no entries, no change.
"""

from matrixrl.memcollab.data import Entry, Label, Pair, Trajectory
from matrixrl.memcollab.distill import (
    DISTILLER_PREFIX,
    DROP_REASONS,
    MAX_ENTRIES,
    ParseResult,
    completed,
    distiller_messages,
    entries_from,
    parse_entries,
    prompt_digest,
)
from matrixrl.memcollab.labels import OTHER, TAXONOMY, labeller_messages, options, parse_label
from matrixrl.memcollab.modes import MODES, needed_trajectories, pairs_for
from matrixrl.memcollab.retrieval import MemoryBank, guidance_block, retrieve, with_guidance

__all__ = [
    "DISTILLER_PREFIX",
    "DROP_REASONS",
    "MAX_ENTRIES",
    "MODES",
    "OTHER",
    "TAXONOMY",
    "Entry",
    "Label",
    "MemoryBank",
    "Pair",
    "ParseResult",
    "Trajectory",
    "completed",
    "distiller_messages",
    "entries_from",
    "guidance_block",
    "labeller_messages",
    "needed_trajectories",
    "options",
    "pairs_for",
    "parse_entries",
    "parse_label",
    "prompt_digest",
    "retrieve",
    "with_guidance",
]
