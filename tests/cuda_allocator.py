"""A model of PyTorch's CUDA caching allocator at its default settings, and decode's allocations.

What it follows (c10/cuda/CUDACachingAllocator.cpp; defaults of torch 2.x, 2.13's included:
no ``max_split_size``, no expandable segments, no garbage-collection threshold):

- a request is rounded up to 512 bytes; up to 1 MiB it is served from the small pool, above
  from the large pool;
- the free block of its pool that is the smallest one at least that large (then the lowest
  address) serves it, split when the rest is 512 bytes or more (small pool) or more than
  1 MiB (large pool);
- else a new segment is reserved (cudaMalloc): 2 MiB for a small request, 20 MiB for one under
  10 MiB, else the request rounded up to 2 MiB;
- a freed block merges with its free neighbours in its segment; segments stay reserved
  until a reservation fails (the GPU is full, or ``cap`` is reached: what
  ``set_per_process_memory_fraction`` imposes), which releases every segment wholly free
  and retries; a block still split cannot be released, so what the rest of its segment
  holds free is lost until its block is freed.

:func:`decode_allocations` replays what one ``rollout.decode`` call allocates and frees, in
order, with transformers' ``DynamicCache`` growing each layer's keys and values by
``torch.cat`` (a block one position longer, then the old one freed) and each step's
temporaries (a layer's activations; the logits, their float32 copy, the chooser's).
Used by tests/test_gpu_memory.py to check the estimate's allowance for it
(``gpu_memory.peak.decode_slack``).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

MIN_BLOCK = 512
SMALL = 1 << 20
SMALL_BUFFER = 2 << 20
LARGE_BUFFER = 20 << 20
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20


class OutOfMemory(Exception):
    pass


@dataclass(eq=False, repr=False)
class Block:
    size: int
    address: int
    small: bool
    prev: Block | None = None
    next: Block | None = None
    free: bool = True


@dataclass
class Allocator:
    cap: int | None = None  # the most it may reserve (None: unbounded)
    reserved: int = 0
    allocated: int = 0
    peak_reserved: int = 0
    peak_allocated: int = 0
    releases: int = 0  # failed reservations that released the cache (each a device-wide sync)
    _free: dict = field(default_factory=lambda: {True: [], False: []}, repr=False)  # pool -> sorted [(size, address, block)]
    _next_address: int = field(default=0, repr=False)

    def _insert(self, block: Block) -> None:
        bisect.insort(self._free[block.small], (block.size, block.address, block))

    def _remove(self, block: Block) -> None:
        pool = self._free[block.small]
        del pool[bisect.bisect_left(pool, (block.size, block.address))]

    def _release(self) -> None:
        self.releases += 1
        for small, pool in self._free.items():
            kept = []
            for entry in pool:
                block = entry[2]
                if block.prev is None and block.next is None:
                    self.reserved -= block.size
                else:
                    kept.append(entry)
            self._free[small] = kept

    def malloc(self, size: int) -> Block:
        size = max(MIN_BLOCK, -(-size // MIN_BLOCK) * MIN_BLOCK)
        small = size <= SMALL
        pool = self._free[small]
        i = bisect.bisect_left(pool, (size, -1))
        if i < len(pool):
            block = pool.pop(i)[2]
        else:
            segment = SMALL_BUFFER if small else LARGE_BUFFER if size < MIN_LARGE_ALLOC else -(-size // ROUND_LARGE) * ROUND_LARGE
            if self.cap is not None and self.reserved + segment > self.cap:
                self._release()
                if self.reserved + segment > self.cap:
                    raise OutOfMemory(f"{size:,} bytes: {self.allocated:,} allocated, {self.reserved:,} reserved")
            block = Block(segment, self._next_address, small)
            self._next_address += segment + (1 << 40)  # segments are never adjacent
            self.reserved += segment
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        rest = block.size - size
        if (rest >= MIN_BLOCK) if small else (rest > SMALL):
            remainder = Block(rest, block.address + size, small, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = remainder
            block.next, block.size = remainder, size
            self._insert(remainder)
        block.free = False
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return block

    def free(self, block: Block) -> None:
        self.allocated -= block.size
        block.free = True
        for other in (block.prev, block.next):
            if other is not None and other.free:
                self._remove(other)
                if other is block.prev:
                    block.address, block.prev = other.address, other.prev
                    if other.prev is not None:
                        other.prev.next = block
                else:
                    block.next = other.next
                    if other.next is not None:
                        other.next.prev = block
                block.size += other.size
        self._insert(block)


CHOOSER_TEMPORARIES = {"greedy": (), "sampled": (4,) * 6, "keyed": (8,) * 5}
"""Bytes per row and vocabulary entry of each temporary a chooser makes (its total is
gpu_memory.model.SAMPLING_BYTES: the sampled chooser's float32 tensors, the keyed one's
int64 and float64 ones)."""


def decode_allocations(
    allocator: Allocator, *, rows: int, prompt: int, reply: int, layers: int, kv_width: int, hidden: int, mlp: int,
    vocab: int, chooser: str, compute: int = 2,
) -> int:
    """Replay one decode call through ``allocator`` (raises :class:`OutOfMemory` past its cap);
    the peak of the bytes live, as the estimate counts tensors (exact sizes)."""
    per_token = rows * kv_width * compute  # one layer's keys (or values) per position
    cache = [allocator.malloc(per_token * prompt) for _ in range(2 * layers)]
    live = peak = 2 * layers * per_token * prompt
    for step in range(reply):
        longer = per_token * (prompt + step + 1)
        for layer in range(layers):
            sizes = (rows * hidden * compute, rows * mlp * compute, rows * mlp * compute)
            temporaries = [allocator.malloc(n) for n in sizes]
            live += sum(sizes)
            for i in (2 * layer, 2 * layer + 1):  # keys, then values: torch.cat, then the old freed
                grown = allocator.malloc(longer)
                live += longer
                peak = max(peak, live)
                allocator.free(cache[i])
                live -= longer - per_token
                cache[i] = grown
            for block in reversed(temporaries):
                allocator.free(block)
            live -= sum(sizes)
        sizes = [rows * vocab * compute, rows * vocab * 4] + [rows * vocab * n for n in CHOOSER_TEMPORARIES[chooser]]
        temporaries = [allocator.malloc(n) for n in sizes]
        peak = max(peak, live + sum(sizes))
        for block in reversed(temporaries):
            allocator.free(block)
    return peak
