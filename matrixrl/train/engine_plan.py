"""The decode engine's buckets, copy and op count, without torch (what estimates price it by).

``matrixrl.train.engine`` decodes with these buckets; the estimates of ``matrixrl.gpu_memory``
price the engine's memory and time with them on paper."""

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


def copy_bytes(*, layers: int, hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int, dtype_bytes: int = 2) -> int:
    """Bytes of the merged inference copy (``DecodeWeights.copy_bytes`` once loaded): every layer's
    fused q, k, v, o, gate, up and down products in the compute dtype. The embedding and norms
    are not copied when the model holds them in the compute dtype already."""
    per_layer = hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden + 3 * intermediate * hidden
    return layers * per_layer * dtype_bytes


SAMPLER_OPS = {"greedy": 0, "training": 14, "keyed": 40}
"""Ops a sampler adds to greedy's argmax. Training: scale, log-softmax, entropy (exp, mul, sum, neg)
and its record, the noise (empty, exponential_, its rows), softmax, the division, the log-prob
(gather) and its record. Keyed: ``samplers.keyed_scores``, splitmix64 over every token id."""


def ops_per_step(layers: int, *, qk_norm: bool = True, lora: str = "merged", sampler: str = "training", dtype: str = "bfloat16") -> int:
    """ATen ops (views aside) that one ``decode_step`` launches: a function of the layer count,
    whether the layers normalise queries and keys (Qwen3: yes, Llama: no), ``lora`` (``merged``,
    which a full model's step is too, or ``unmerged``: an adapter on all seven projections), the
    ``sampler`` (``greedy``, ``training``, ``keyed``) and the compute ``dtype`` (a 16-bit one casts
    around every RMSNorm). tests/test_engine.py checks it against the ops counted on CPU."""
    sixteen = dtype != "float32"
    norm = 6 + 2 * sixteen  # pow, mean, add, rsqrt, mul, mul by the weight; in 16 bits a cast to float32 and back
    per_layer = (
        (2 + qk_norm) * norm  # before attention and the MLP; queries and keys together
        + 5  # RoPE: two muls, neg and cat (rotate_half), add
        + 2  # the key and value written into the cache in place
        + 1  # attention
        + 4  # the products: q, k, v fused, o, gate and up fused, down
        + 2  # the residuals
        + 2  # SiLU and the gate's product
    )
    if lora == "unmerged":  # three products and an add per projection, q, k, v and gate, up apart and joined
        per_layer += 7 * 3 + 3 + 2
    outside = (
        1  # the embedding
        + 1  # the mask's new column
        + 5  # RoPE's angles: positions to float, mul, cat, cos, sin
        + norm  # the final norm
        + 1  # the output layer
        + 1  # the tokens' record
        + 4  # live &= chosen != eos (2), the next input where(live, chosen, pad) (2)
        + 1  # ... copied into the state
        + 3  # positions, cache column and step advanced
        + 1  # argmax
        + 3 * sixteen  # cos, sin to the compute dtype, the logits to float32
        + SAMPLER_OPS[sampler]
    )
    return layers * per_layer + outside
