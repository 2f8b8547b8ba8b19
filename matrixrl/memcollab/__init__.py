"""MemCollab memory (arXiv 2603.23234): constraints distilled from contrasting trajectories.

The pure core, no model; the method and its choices: docs/memcollab.md.
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
