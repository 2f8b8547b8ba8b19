"""rollout.decode's compaction: the thresholds it takes on each device, and that it follows them."""

from __future__ import annotations

import pytest
import torch

from matrixrl.config import TinyScale
from matrixrl.models.tiny import build_char_tokenizer, build_tiny_model
from matrixrl.train import rollout
from matrixrl.train.rollout import (
    COMPACT_SHARE,
    CPU_COMPACTION,
    GPU_COMPACTION,
    MIN_BATCH_ROWS,
    Compaction,
    compaction_for,
    decode,
)

TINY = TinyScale(kind="tiny", hidden_size=32, num_layers=1, intermediate_size=64, num_heads=2, num_kv_heads=1)


def test_the_cpu_thresholds_are_the_ones_every_cpu_result_was_computed_with() -> None:
    assert (COMPACT_SHARE, MIN_BATCH_ROWS) == (1 / 8, 4)
    assert CPU_COMPACTION == Compaction("cpu", 1 / 8, 4)


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu"), "meta"])
def test_a_cpu_device_takes_the_cpu_thresholds(device) -> None:
    assert compaction_for(device) is CPU_COMPACTION


@pytest.mark.parametrize("device", ["cuda", "cuda:1", torch.device("cuda", 0)])
def test_a_cuda_device_takes_the_gpu_thresholds(device) -> None:
    # Naming a CUDA device needs no GPU: the choice is made from the device alone.
    assert compaction_for(device) is GPU_COMPACTION
    assert GPU_COMPACTION.device == "cuda"


def expected_batches(batch: int, ends: list[int], steps: int, share: float, floor: int) -> list[int]:
    """The rows decode computes at each step when row i emits its EOS at step ``ends[i]``:
    the rule of its docstring, written out."""
    computed, sizes = list(range(batch)), []
    floor = min(batch, floor)
    for step in range(steps):
        sizes.append(len(computed))
        live = [r for r in computed if ends[r] > step]
        if not live or step + 1 == steps:
            break
        if len(computed) - max(len(live), floor) >= max(1, len(computed) * share):
            riding = [r for r in computed if ends[r] <= step][: max(0, floor - len(live))]
            computed = sorted(live + riding)
    return sizes


def run_decode(monkeypatch, device_type: str) -> tuple[list[int], list[list[int]]]:
    """decode over 16 rows of a tiny model, row i ending at step i, as on ``device_type``
    (the choice of thresholds is told the device is that; the tensors stay on CPU): the rows
    computed at each step, and the tokens."""
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(TINY, tokenizer, seed=0)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    chosen = []
    real = rollout.compaction_for
    monkeypatch.setattr(rollout, "compaction_for", lambda device: chosen.append(device) or real(device_type))
    sizes = []

    def choose(logits, rows, step):
        sizes.append(rows.shape[0])
        return torch.where(rows <= step, eos, 5 + rows)

    ids = torch.tensor([tokenizer.encode("1+2=", add_special_tokens=False)] * 16)
    tokens = decode(model, ids, torch.ones_like(ids), None, max_new_tokens=20, eos=eos, pad=pad, choose=choose)
    assert [torch.device(d).type for d in chosen] == ["cpu"]  # asked once, with the batch's device
    return sizes, tokens


def test_decode_on_cpu_drops_rows_at_the_cpu_thresholds(monkeypatch) -> None:
    sizes, tokens = run_decode(monkeypatch, "cpu")
    assert sizes == expected_batches(16, list(range(16)), 20, 1 / 8, 4)
    assert sizes[:4] == [16, 16, 14, 14]  # two of 16 rows finished: an eighth
    assert [len(t) for t in tokens] == list(range(1, 17))


def test_decode_on_a_cuda_device_drops_rows_at_the_gpu_thresholds(monkeypatch) -> None:
    # Values unlike either device's show that decode follows the GPU's constants, not the CPU's.
    monkeypatch.setattr(rollout, "GPU_COMPACTION", Compaction("cuda", 1 / 2, 6))
    sizes, tokens = run_decode(monkeypatch, "cuda")
    assert sizes == expected_batches(16, list(range(16)), 20, 1 / 2, 6)
    assert sizes != expected_batches(16, list(range(16)), 20, 1 / 8, 4)
    assert sizes[:10] == [16] * 8 + [8, 8]  # half of 16 rows finished
    assert [len(t) for t in tokens] == list(range(1, 17))  # the same tokens whatever is dropped when
