"""The attention kernels a gradient may flow through: not cuDNN's, on CUDA.

cuDNN's fused attention returns NaN gradients for left-padded rows (pytorch/pytorch#196678), so
the forward passes the update differentiates leave it out; decoding and CPU are untouched.
docs/performance.md, "The second GPU window".
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
