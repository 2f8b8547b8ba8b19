"""decode's compaction thresholds on a GPU, on paper: call time per share and floor.

``rollout.decode`` drops the rows that have finished once ``share`` of the rows computed have
finished, keeping at least ``floor``. This script prices a decoding call with the project's one
time model (bench/gpu_timing.py; no torch, no GPU; a few seconds), for the eager decoder
(host launches at ``HOST_OP_S`` against the weights and the cache moved ``passes`` times at the
bandwidth) and for the decode engine (a graph replay a step: its kernels and the bytes of the
static cache of the rows kept; a compaction is a switch to a smaller bucket,
``gpu_timing.switch_seconds``). Replies end uniformly over the call, or early (exponential, mean a
sixth of the cap). For each share and floor it prints the worst loss over the cases against the
best share (or floor 4) of each case. docs/performance.md, "Decode compaction on a GPU".

    python bench/decode_compaction.py
"""

from __future__ import annotations

import numpy as np

from gpu_timing import EAGER_DECODE_OPS, Hardware, eager_step_seconds, ops_per_step, step_seconds, switch_seconds

H200 = Hardware("H200", 989e12, 4.8e12)
SHARES = (1 / 64, 1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2)
FLOORS = (1, 4, 8, 16, 32)
CAPS = (64, 256, 1024, 4096)
PASSES = (3, 7, 11)

LORA, FULL = EAGER_DECODE_OPS["lora"], EAGER_DECODE_OPS["full"]
# (name, rows, prompt, layers, eager launches a step, KV bytes per token and layer (bf16 K and V), weight bytes)
SHAPES = (
    ("qwen3-0.6b worker call, LoRA", 192, 610, 28, 28 * LORA[0] + LORA[1], 1024 * 4, 1.2e9),
    ("qwen3-4b synthesizer evaluation", 64, 2044, 36, 36 * FULL[0] + FULL[1], 1024 * 4, 8.0e9),
    ("qwen3-4b worker call, LoRA", 192, 610, 36, 36 * LORA[0] + LORA[1], 1024 * 4, 8.0e9),
    ("qwen3-0.6b, 768 rows of 2,000 tokens", 768, 2000, 28, 28 * LORA[0] + LORA[1], 1024 * 4, 1.2e9),
    ("qwen3-4b, 32 rows of 3,000 tokens", 32, 3000, 36, 36 * FULL[0] + FULL[1], 1024 * 4, 8.0e9),
)


def call_seconds(rows, prompt, layers, ops, kv, weights, cap, ends, share, floor, passes, graphs=False) -> float:
    """One call's seconds: ``ends[i]``, the step after which row i has finished; ``graphs``: the
    decode engine (its static cache, bucket switches), else the eager decoder (``passes``)."""
    kept = np.arange(rows)
    seconds = 0.0
    per_token = layers * kv
    kernels = ops_per_step(layers, qk_norm=True, lora="merged")
    for step in range(cap):
        computed = len(kept)
        moved = weights + computed * (prompt + (cap if graphs else step)) * per_token * (1 if graphs else passes)
        live = ends[kept] > step + 1
        going = int(live.sum())
        switch = None
        if going and computed - max(going, min(rows, floor)) >= max(1, computed * share):  # decode's rule
            keep = max(going, min(rows, floor))
            switch = keep * (prompt + (cap if graphs else step)) * per_token  # the kept rows' cache, read and written
            finished = kept[~live]
            kept = np.concatenate([kept[live], finished[: keep - going]])
        if graphs:  # a replay, then the switch launched between replays
            seconds += step_seconds(H200, 0.0, moved, kernels)
            seconds += switch_seconds(H200, layers, switch, True) if switch is not None else 0.0
        else:  # the step's launches and the compaction's against its traffic and the copy's
            extra_ops, extra_bytes = (2 * layers + 12, 2 * switch) if switch is not None else (0, 0)
            seconds += eager_step_seconds(H200, 0.0, moved + extra_bytes, ops + extra_ops)
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


def engine_losses() -> dict[float, float]:
    """The worst loss of each share (floor 4) for the decode engine: its steps read the rows kept
    at the bucket's length, a compaction switches buckets (the KV passes do not apply)."""
    by_share = {s: 0.0 for s in SHARES}
    for (_, rows, prompt, layers, ops, kv, weights), cap, ends, passes in cases():
        if passes != PASSES[0]:
            continue
        seconds = {s: call_seconds(rows, prompt, layers, ops, kv, weights, cap, ends, s, 4, passes, graphs=True) for s in SHARES}
        best = min(seconds.values())
        for s, t in seconds.items():
            by_share[s] = max(by_share[s], t / best - 1)
    return by_share


def main() -> None:
    by_share, by_floor, by_cap = worst_losses()
    print(f"{len(SHAPES)} shapes x {len(CAPS)} reply caps x 2 ways replies end x {len(PASSES)} KV passes a step; the worst loss")
    print("share (floor 4): " + ", ".join(f"1/{round(1 / s)} {v:+.1%}" for s, v in by_share.items()))
    for cap, row in by_cap.items():
        print(f"  {cap:>5} new tokens: " + ", ".join(f"1/{round(1 / s)} {v:+.1%}" for s, v in row.items()))
    print("floor (share 1/8) against floor 4: " + ", ".join(f"{f} {v:+.2%}" for f, v in by_floor.items()))
    print("the engine, share (floor 4): " + ", ".join(f"1/{round(1 / s)} {v:+.1%}" for s, v in engine_losses().items()))


if __name__ == "__main__":
    main()
