"""The attention kernels a gradient may flow through: not cuDNN's, on CUDA.

On Hopper GPUs, torch 2.11 and later pick cuDNN's fused attention for
``scaled_dot_product_attention`` when a mask is passed, and its backward pass returns NaN
in the queries' gradient when a query row's log-sum-exp is very low (below about -88.7)
at some sequence lengths (pytorch/pytorch#196678; TRL met it in DPO, huggingface/trl#7181).
The update's batches are left-padded prompts (``grpo.TurnBatch``), so they always carry
a mask, and a padding position attends to nothing at all: the lowest log-sum-exp
there is. The forward pass stays finite and the loss with it; the gradient norm is NaN:
every eval_opt case on an H200, whose torch 2.11 gave NaN queries' gradients for a
left-padded row at lengths 192 and 704, none at 256 and 640, and none with cuDNN's kernel
left out (docs/performance.md, "The second GPU window").

So the forward passes the update differentiates run with cuDNN's kernel left out: SDPA
picks among flash, memory-efficient and math attention as it did before torch 2.11. The
rollout's decoding (no gradient) keeps every kernel. On CPU nothing changes: cuDNN
attention is CUDA's alone, and the context is not entered.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def differentiable_attention(device: torch.device | str) -> Iterator[None]:
    """Within the block, SDPA on ``device`` never takes cuDNN's kernel (the module docstring says why)."""
    if torch.device(device).type != "cuda":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        yield
