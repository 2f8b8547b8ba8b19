"""The update's forward passes leave cuDNN's attention out on CUDA (matrixrl.train.attention).

On CPU: the context switches SDPA's backends as it says, and only for a CUDA device. On CUDA
(skipped elsewhere, with the reason): gradients through the kernels left are finite on the
inputs that make cuDNN's backward return NaN (pytorch/pytorch#196678), and the update's
log-probabilities of left-padded turns give finite gradients at lengths where that bug bites.
"""

from __future__ import annotations

import math

import pytest
import torch

from matrixrl.train.attention import differentiable_attention

ON_CUDA = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs CUDA: cuDNN's attention, which the update leaves out, exists only there",
)


def _backends() -> dict[str, bool]:
    cuda = torch.backends.cuda
    return {
        "cudnn": cuda.cudnn_sdp_enabled(),
        "flash": cuda.flash_sdp_enabled(),
        "efficient": cuda.mem_efficient_sdp_enabled(),
        "math": cuda.math_sdp_enabled(),
    }


def test_on_cuda_the_update_attends_through_every_kernel_but_cudnns_and_on_cpu_through_any():
    before = _backends()
    with differentiable_attention("cuda"):
        assert _backends() == {"cudnn": False, "flash": True, "efficient": True, "math": True}
    with differentiable_attention(torch.device("cuda", 0)):
        assert not _backends()["cudnn"]
    assert _backends() == before  # restored
    with differentiable_attention("cpu"):
        assert _backends() == before


@ON_CUDA
def test_gradients_through_the_updates_attention_stay_finite_where_cudnns_backward_makes_nan():
    # pytorch/pytorch#196678's inputs: length 64 past a multiple of 128, an explicit mask, every
    # row's log-sum-exp below ln(FLT_MAX) = -88.7; cuDNN's backward gives NaN in grad_q there.
    torch.manual_seed(0)
    length, dim = 704, 64
    q = torch.randn(1, 1, length, dim, device="cuda", dtype=torch.bfloat16) * 0.1
    k = torch.randn(1, 1, length, dim, device="cuda", dtype=torch.bfloat16) * 0.1
    v = torch.randn(1, 1, length, dim, device="cuda", dtype=torch.bfloat16)
    q[..., 0], k[..., 0] = 1.0, -120 * math.sqrt(dim)
    for t in (q, k, v):
        t.requires_grad_()
    mask = torch.ones(length, length, dtype=torch.bool, device="cuda").tril()[None, None]
    with differentiable_attention("cuda"):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out.backward(torch.randn_like(out))
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


@ON_CUDA
@pytest.mark.parametrize("length", [192, 704])
def test_the_updates_gradient_of_left_padded_turns_is_finite_on_cuda(length):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from matrixrl.train.grpo import TurnBatch, completion_logps
    from matrixrl.workflows.base import Completion, Turn

    config = Qwen3Config(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
        intermediate_size=256, vocab_size=200, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to("cuda", torch.bfloat16)
    model.config._attn_implementation = "sdpa"
    reply = 12
    prompts = [length - reply - pad for pad in (0, 40, 90)]  # left padding: rows that attend to nothing
    turns = [
        Turn("g", "g0", 0, "", Completion("", [3 + (i + j) % 150 for j in range(p)], [5 + (i * j) % 150 for j in range(reply)]),
             advantage=1.0 if i % 2 else -1.0)
        for i, p in enumerate(prompts)
    ]  # fmt: skip
    batch = TurnBatch.from_turns(turns, pad_token_id=0).to("cuda")
    assert batch.input_ids.shape == (3, length)
    logps = completion_logps(model, batch, temperature=1.0)
    (-(logps * batch.completion_mask).sum() * batch.advantages.mean()).backward()
    assert torch.isfinite(logps).all()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
