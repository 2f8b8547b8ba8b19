"""decode's compaction thresholds on a GPU, on paper: call time per share and floor in a launch-vs-traffic model.

``rollout.decode`` drops the rows that have finished once ``share`` of the rows computed
have finished, keeping at least ``floor``. On CPU the thresholds (1/8, 4 rows) were set
there, the floor for exactness (MKL's kernels); nothing was measured on a GPU. This
script models a decoding call on one (no torch, no GPU; a few seconds):

- a step takes the longer of the host's time, its kernel launches one after another at
  ``HOST_OP_S`` each (``ops`` per step: bench/gpu_smoke.py's counts, 122 per layer under
  LoRA on all seven projections, 69 without adapters, 56 outside the layers), and the
  device's, the weights read once and every computed row's KV cache read and written
  ``passes`` times (attention reads it once, ``torch.cat`` reads and writes it to grow it:
  3; with a padding mask transformers repeats grouped keys and values to every head
  first: 7 at 2 query heads per KV head, 11 at 4) at ``BANDWIDTH``;
- a compaction adds ``2 × layers + 12`` launches (``DynamicCache.batch_select_indices``
  and decode's own indexing) and one read and write of the kept rows' cache;
- replies end uniformly over the call, or early (exponential, mean a sixth of the cap).

For each share and floor it prints the worst loss over the cases against the best share
(or floor 4) of each case. At 3 passes (bench/gpu_smoke.py's model) the paper's calls are
host-bound, where any share is within 0.3% of any other; the losses come from
device-bound calls: long caches, many rows, repeated keys and values.

    python bench/decode_compaction.py
"""

from __future__ import annotations

import numpy as np

HOST_OP_S = 29e-6  # bench/gpu_smoke.py's HOST_OP_S, measured on an H200 node (8e-6 was the guess before)
BANDWIDTH = 4.8e12  # H200, bytes/s
SHARES = (1 / 64, 1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2)
FLOORS = (1, 4, 8, 16, 32)
CAPS = (64, 256, 1024, 4096)
PASSES = (3, 7, 11)

# (name, rows, prompt, layers, launches per step, KV bytes per token and layer (bf16 K and V), weight bytes)
SHAPES = (
    ("qwen3-0.6b worker call, LoRA", 192, 610, 28, 28 * 122 + 56, 1024 * 4, 1.2e9),
    ("qwen3-4b synthesizer evaluation", 64, 2044, 36, 36 * 69 + 56, 1024 * 4, 8.0e9),
    ("qwen3-4b worker call, LoRA", 192, 610, 36, 36 * 122 + 56, 1024 * 4, 8.0e9),
    ("qwen3-0.6b, 768 rows of 2,000 tokens", 768, 2000, 28, 28 * 122 + 56, 1024 * 4, 1.2e9),
    ("qwen3-4b, 32 rows of 3,000 tokens", 32, 3000, 36, 36 * 69 + 56, 1024 * 4, 8.0e9),
)


def call_seconds(rows, prompt, layers, ops, kv, weights, cap, ends, share, floor, passes) -> float:
    """One call's seconds in the model: ``ends[i]``, the step after which row i has finished."""
    kept = np.arange(rows)
    seconds = 0.0
    per_token = layers * kv
    for step in range(cap):
        computed = len(kept)
        host = ops * HOST_OP_S
        device = weights / BANDWIDTH + computed * (prompt + step) * per_token * passes / BANDWIDTH
        live = ends[kept] > step + 1
        going = int(live.sum())
        if going and computed - max(going, min(rows, floor)) >= max(1, computed * share):  # decode's rule
            keep = max(going, min(rows, floor))
            host += (2 * layers + 12) * HOST_OP_S
            device += 2 * keep * (prompt + step) * per_token / BANDWIDTH
            finished = kept[~live]
            kept = np.concatenate([kept[live], finished[: keep - going]])
        seconds += max(host, device)
        if not going:
            break
    return seconds


def cases(seed: int = 0):
    rng = np.random.default_rng(seed)
    for shape in SHAPES:
        _, rows, *_ = shape
        for cap in CAPS:
            for how in ("uniform", "early"):
                if how == "uniform":
                    ends = rng.integers(1, cap + 1, rows)
                else:
                    ends = np.minimum(cap, rng.exponential(cap / 6, rows).astype(int) + 1)
                for passes in PASSES:
                    yield shape, cap, ends, passes


def worst_losses() -> tuple[dict[float, float], dict[int, float], dict[int, dict[float, float]]]:
    """The worst loss of each share (floor 4) and of each floor (share 1/8) over every case,
    and of each share per reply cap."""
    by_share = {s: 0.0 for s in SHARES}
    by_floor = {f: 0.0 for f in FLOORS}
    by_cap = {c: {s: 0.0 for s in SHARES} for c in CAPS}
    for (_, rows, prompt, layers, ops, kv, weights), cap, ends, passes in cases():
        args = (rows, prompt, layers, ops, kv, weights, cap, ends)
        seconds = {s: call_seconds(*args, s, 4, passes) for s in SHARES}
        best = min(seconds.values())
        for s, t in seconds.items():
            by_share[s] = max(by_share[s], t / best - 1)
            by_cap[cap][s] = max(by_cap[cap][s], t / best - 1)
        base = seconds[1 / 8]
        for f in FLOORS:
            t = base if f == 4 else call_seconds(*args, 1 / 8, f, passes)
            by_floor[f] = max(by_floor[f], t / base - 1)
    return by_share, by_floor, by_cap


def main() -> None:
    by_share, by_floor, by_cap = worst_losses()
    print(f"{len(SHAPES)} shapes x {len(CAPS)} reply caps x 2 ways replies end x {len(PASSES)} KV passes a step; the worst loss")
    print("share (floor 4): " + ", ".join(f"1/{round(1 / s)} {v:+.1%}" for s, v in by_share.items()))
    for cap, row in by_cap.items():
        print(f"  {cap:>5} new tokens: " + ", ".join(f"1/{round(1 / s)} {v:+.1%}" for s, v in row.items()))
    print("floor (share 1/8) against floor 4: " + ", ".join(f"{f} {v:+.2%}" for f, v in by_floor.items()))


if __name__ == "__main__":
    main()
