"""TRL's Triton log-softmax: where matrixrl meets it, and (on CUDA with Triton) its numerics and
memory against the torch path the estimate's bytes per logit were measured on.

TRL 1.16's ``selective_log_softmax`` and ``entropy_from_logits`` (trl.trainer.utils) run its
Triton kernel (trl.kernels.logprob_entropy: one fused pass computing log-probabilities and
entropies, the backward writing the logits' gradient in one tensor) whenever Triton imports and
the logits are on a CUDA (or XPU) device (``_supports_trl_loss_kernel``); elsewhere the torch
path. matrixrl's update calls the first (``grpo.completion_logps``) and its sampler the second
(``samplers.SampledChooser``, ``EntropyRecorder``), so on a GPU both take the kernel, and on
CPU, where every recorded result was computed, neither does.
"""

from __future__ import annotations

import pytest
import torch

from matrixrl.gpu_memory import model as memory_model

WHY_SKIPPED = (
    "needs CUDA and Triton: TRL switches selective_log_softmax and entropy_from_logits to its Triton kernel "
    "only on a CUDA device with Triton installed (trl.trainer.utils._supports_trl_loss_kernel)"
)


def _triton_here() -> bool:
    from transformers.utils import is_triton_available

    return torch.cuda.is_available() and is_triton_available()


def test_the_update_and_the_sampler_call_the_trl_functions_that_switch_to_triton():
    import trl.trainer.utils as trl_utils

    from matrixrl.train import grpo, samplers

    assert grpo.selective_log_softmax is trl_utils.selective_log_softmax
    assert samplers.entropy_from_logits is trl_utils.entropy_from_logits
    # On CPU the kernel is never taken: the torch path every CPU result was computed with.
    logits, index = torch.randn(2, 3, 11), torch.randint(0, 11, (2, 3))
    assert not trl_utils._supports_trl_loss_kernel(logits, index)
    assert not trl_utils._supports_trl_loss_kernel(logits[:, -1])


def test_the_estimate_takes_the_larger_bytes_per_logit_of_the_two_paths():
    assert memory_model.LOGIT_BYTES_TORCH == 12 and memory_model.LOGIT_BYTES_TRITON == 8
    assert memory_model.LOGIT_BYTES == max(memory_model.LOGIT_BYTES_TORCH, memory_model.LOGIT_BYTES_TRITON)


# --- on CUDA with Triton ----------------------------------------------------------------------------

ROWS, WIDTH, VOCAB = 4, 256, 151_936  # a micro-batch of 1,024 completion tokens at Qwen3's vocabulary
TEMPERATURE = 0.7


def _update_logits(torch_path: bool, monkeypatch, raw: torch.Tensor, ids: torch.Tensor):
    """``grpo.completion_logps``'s last two lines on ``raw`` (the model's bfloat16 logits of
    width + 1 positions) and a backward pass: (log-probabilities, the logits' gradient, peak
    bytes above what was allocated before, per completion logit)."""
    import trl.trainer.utils as trl_utils

    with monkeypatch.context() as patch:
        if torch_path:
            patch.setattr(trl_utils, "is_triton_available", lambda: False)
        leaf = raw.detach().clone().requires_grad_(True)
        weights = torch.linspace(-1, 1, ids.numel(), device=ids.device).view_as(ids)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        logits = leaf[:, -WIDTH - 1 : -1, :].float() / TEMPERATURE
        logps = trl_utils.selective_log_softmax(logits, ids)
        del logits
        (logps * weights).sum().backward()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    return logps.detach(), leaf.grad, peak / (ROWS * WIDTH * VOCAB)


@pytest.mark.skipif(not _triton_here(), reason=WHY_SKIPPED)
def test_the_triton_log_softmax_against_the_torch_path(monkeypatch):
    """The same log-probabilities and gradients up to float32 rounding, and a backward peak per
    completion logit within the estimate's (the larger of the two paths')."""
    generator = torch.Generator(device="cuda").manual_seed(0)
    raw = (4 * torch.randn(ROWS, WIDTH + 1, VOCAB, device="cuda", generator=generator)).to(torch.bfloat16)
    ids = torch.randint(0, VOCAB, (ROWS, WIDTH), device="cuda", generator=generator)
    fused, fused_grad, fused_bytes = _update_logits(False, monkeypatch, raw, ids)
    plain, plain_grad, plain_bytes = _update_logits(True, monkeypatch, raw, ids)
    print(f"bytes per completion logit at the peak: Triton {fused_bytes:.2f}, torch {plain_bytes:.2f}")
    assert torch.allclose(fused, plain, rtol=0, atol=1e-4), (fused - plain).abs().max()
    assert torch.allclose(fused_grad.float(), plain_grad.float(), rtol=1e-2, atol=1e-6)
    # The figures of gpu_memory.model, with room for a logsumexp row's temporaries and the leaf's gradient.
    assert fused_bytes <= plain_bytes
    assert fused_bytes <= memory_model.LOGIT_BYTES_TRITON + 2.5
    assert plain_bytes <= memory_model.LOGIT_BYTES_TORCH + 2.5


@pytest.mark.skipif(not _triton_here(), reason=WHY_SKIPPED)
def test_the_triton_entropy_against_the_torch_path(monkeypatch):
    """The sampler's entropies of a decoding step (192 rows), the same up to float32 rounding."""
    import trl.trainer.utils as trl_utils

    scores = 4 * torch.randn(192, VOCAB, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))
    fused = trl_utils.entropy_from_logits(scores / TEMPERATURE)
    with monkeypatch.context() as patch:
        patch.setattr(trl_utils, "is_triton_available", lambda: False)
        plain = trl_utils.entropy_from_logits(scores / TEMPERATURE)
    assert torch.allclose(fused, plain, rtol=1e-5, atol=1e-4), (fused - plain).abs().max()
