"""The decode engine's buckets, without torch (what the memory estimate prices it by)."""

from __future__ import annotations

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LENGTH_GRANULE = 256
"""Cache lengths are multiples of this many positions."""
CHECK_EVERY = 8
"""Steps between two reads of "does any row still generate?" (the step's only host synchronisation)."""


def bucket_rows(n: int) -> int:
    """The smallest bucket of at least ``n`` rows: 4, 6, 8, 12, 16, 24, 32, 48, ... (2^k and 1.5 x 2^k)."""
    size = 4
    while size < n:
        size = size * 3 // 2 if size & (size - 1) == 0 else size * 4 // 3
    return size


def bucket_length(n: int) -> int:
    """The smallest cache length of at least ``n`` positions: a multiple of ``LENGTH_GRANULE``."""
    return -(-n // LENGTH_GRANULE) * LENGTH_GRANULE
