"""Generation and update throughput, and model FLOPs utilisation, on this machine's accelerator.

One model, measured as its jobs run it: the measurement to take on the first GPU.

The model loads as a job loads its scale (``ModelSource``: bfloat16 on a GPU with
``dtype: auto``, SDPA attention). Three measurements, each the median of
``--repeats`` after a warm-up:

- ``generate``: matrixrl's ``decode`` (as rollouts call it: torch-sampled at
  temperature 1, entropy recorded) on ``--batch`` rows of ``--prompt`` random prompt
  tokens, ``--new`` tokens each (no row stops early: the steady state of a full
  batch). Prefill and decoding are timed apart; the model FLOPs of a token are
  ≈ 2·N in either.
- ``update``: one GRPO update as the trainer takes it (``update.update_policy``
  over ``--batch`` turns of ``--prompt`` + ``--new`` tokens with nonzero advantages,
  optimizers from ``trainer.make_optimizers``): forward, backward, clipping, AdamW.
  Model FLOPs per token ≈ 6·N (full fine-tuning; 4·N under LoRA, whose frozen
  matrices get no weight gradient). Timed with the per-agent gradient diagnostics
  as training computes them, and without (``diagnostics=False``).
- ``--compare-hf``: transformers' ``generate`` on the same batch, with its default
  dynamic cache and with ``cache_implementation="static"`` (compiled forward, CUDA
  graphs), to check ``decode``'s choice of cache on this device.

N counts the weights of the matrix products (every ``nn.Linear``, the output head
included), not the embedding lookup. MFU = model FLOPs / seconds / peak, the peak
from a table of dense bf16 tensor-core figures by device name, or ``--peak-tflops``
(on a CPU, or for a device the table lacks, MFU is not printed without it).

    python bench/gpu.py --model Qwen/Qwen3-0.6B [--batch 64] [--prompt 256] [--new 256] [--adapter lora]
    python bench/gpu.py --model tiny --batch 4 --prompt 8 --new 8     # CPU smoke test
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s, from NVIDIA's data sheets; the
# first entry whose name occurs in torch.cuda.get_device_name() is taken.
PEAK_BF16_TFLOPS = (
    ("H100 PCIe", 756.0),
    ("H100", 989.0),  # SXM
    ("H200", 989.0),
    ("GH200", 989.0),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L4", 121.0),
)


# Memory bandwidth in TB/s (10^12 bytes per second), from the same data sheets (the smaller
# figure where a name covers two memories: A100 40GB, GH200 with HBM3); matched as above.
PEAK_BANDWIDTH_TBS = (
    ("H100 PCIe", 2.0),
    ("H100", 3.35),  # SXM
    ("GH200", 4.0),  # before H200, which its name contains
    ("H200", 4.8),
    ("B200", 8.0),
    ("A100", 1.555),
    ("L40S", 0.864),
    ("L4", 0.3),
)


def peak_tflops(device_name: str) -> float | None:
    return next((peak for name, peak in PEAK_BF16_TFLOPS if name in device_name), None)


def peak_bandwidth(device_name: str) -> float | None:
    """The device's memory bandwidth in bytes per second, from ``PEAK_BANDWIDTH_TBS``; None where unknown."""
    found = next((tbs for name, tbs in PEAK_BANDWIDTH_TBS if name in device_name), None)
    return found * 1e12 if found is not None else None


def matmul_parameters(model) -> int:
    """Weights that take part in a matrix product per token (every nn.Linear; not the embedding lookup)."""
    import torch

    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(run, device, repeats: int) -> float:
    run()  # warm-up
    times = []
    for _ in range(repeats):
        synchronize(device)
        began = time.perf_counter()
        run()
        synchronize(device)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def generate_flops(n: int, tokens: int) -> float:
    """Model FLOPs of ``tokens`` prefilled or decoded by a model of ``n`` matmul parameters: 2·N each."""
    return 2 * n * tokens


def update_flops(n: int, tokens: int, adapter: str) -> float:
    """Model FLOPs of an update over ``tokens``: 6·N each (forward, backward), 4·N under LoRA (no weight gradient)."""
    return (6 if adapter == "full" else 4) * n * tokens


def mfu(flops: float, seconds: float, peak: float | None) -> float | None:
    """The fraction of ``peak`` TFLOP/s that ``flops`` in ``seconds`` achieve; None without a peak."""
    return flops / seconds / 1e12 / peak if peak else None


def utilisation(flops: float, seconds: float, peak: float | None) -> str:
    achieved, fraction = flops / seconds / 1e12, mfu(flops, seconds, peak)
    return f"{achieved:.3g} TFLOP/s, MFU {fraction:.1%}" if fraction is not None else f"{achieved:.3g} TFLOP/s, MFU n/a"


def tiny_folder(tmp: Path) -> str:
    """A random-init tiny-s (hidden 128, 2 layers) with the character tokenizer, for a CPU run."""
    from matrixrl.config import TinyScale
    from matrixrl.models.tiny import build_char_tokenizer, build_tiny_model

    tokenizer = build_char_tokenizer()
    scale = TinyScale(kind="tiny", hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=256, max_length=4096)
    build_tiny_model(scale, tokenizer, seed=0).save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    return str(tmp)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="a hub id or model folder (as a scale's path:), or 'tiny'")
    parser.add_argument("--batch", type=int, default=64, help="rows (a step's problems x group)")
    parser.add_argument("--prompt", type=int, default=256, help="prompt tokens per row")
    parser.add_argument("--new", type=int, default=256, help="generated tokens per row")
    parser.add_argument("--adapter", choices=("full", "lora"), default="lora", help="the update's parameter set")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--dtype", choices=("auto", "bfloat16", "float16", "float32"), default="auto")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the device's peak (default: from the table)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compare-hf", action="store_true", help="also time transformers' generate (dynamic and static cache)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")

    import torch
    from transformers.utils import logging as hf_logging

    from matrixrl.config import Policies, Train
    from matrixrl.models.hf import ModelSource, resolve_device, resolve_dtype
    from matrixrl.models.policies import build_policy
    from matrixrl.train.rollout import decode
    from matrixrl.train.samplers import SampledChooser
    from matrixrl.train.trainer import make_optimizers
    from matrixrl.train.update import update_policy
    from matrixrl.workflows.base import Completion, Episode, Turn

    hf_logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_folder(Path(tmp)) if args.model == "tiny" else args.model
        device = resolve_device("bench", SimpleNamespace(kind="hf", device=args.device))
        if device == "cpu":
            torch.set_num_threads(1)  # as a job runs (train.threads); more threads on a shared CPU only contend
        dtype = resolve_dtype(args.dtype, device)
        source = ModelSource("bench", path, dtype=dtype, device=device, pretrained=args.model != "tiny")
        tokenizer = source.load_tokenizer()
        model = source.load_model()
        n = matmul_parameters(model)
        on = model.device
        name = torch.cuda.get_device_name(on) if on.type == "cuda" else "cpu"
        peak = args.peak_tflops or (peak_tflops(name) if on.type == "cuda" else None)
        print(f"device: {name}; dtype {dtype}; attention {model.config._attn_implementation}; "
              f"peak {f'{peak:.0f} TFLOP/s' if peak else 'unknown (MFU needs --peak-tflops)'}; torch {torch.__version__}")
        print(f"model: {args.model}; matmul parameters N = {n / 1e6:.2f} M")

        vocab = model.config.vocab_size
        special = set(tokenizer.all_special_ids)
        ordinary = torch.tensor([t for t in range(min(vocab, len(tokenizer))) if t not in special])
        generator = torch.Generator().manual_seed(0)
        ids = ordinary[torch.randint(len(ordinary), (args.batch, args.prompt), generator=generator)].to(on)
        mask = torch.ones_like(ids)
        b, p, t = args.batch, args.prompt, args.new

        def prefill():
            decode(model, ids, mask, None, max_new_tokens=1, eos=-1, pad=tokenizer.pad_token_id, choose=SampledChooser(1.0, b, 1, on))

        def generate():
            decode(model, ids, mask, None, max_new_tokens=t, eos=-1, pad=tokenizer.pad_token_id, choose=SampledChooser(1.0, b, t, on))

        with torch.no_grad():
            prefill_s = median_seconds(prefill, on, args.repeats)
            total_s = median_seconds(generate, on, args.repeats)
        decode_s = max(total_s - prefill_s, 1e-9)  # the first new token comes with the prefill
        print(f"generate: batch {b}, prompt {p}, new {t}: prefill {b * p / prefill_s:,.0f} tok/s "
              f"({utilisation(generate_flops(n, b * p), prefill_s, peak)}); decode {b * (t - 1) / decode_s:,.0f} tok/s "
              f"({utilisation(generate_flops(n, b * (t - 1)), decode_s, peak)}); {total_s:.3f} s per call")

        if args.compare_hf:
            for cache in (None, "static"):
                def hf_generate(cache=cache):
                    model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=t, min_new_tokens=t, do_sample=True,
                                   top_k=0, top_p=1.0, pad_token_id=tokenizer.pad_token_id, cache_implementation=cache)

                with torch.no_grad():
                    seconds = median_seconds(hf_generate, on, args.repeats)
                print(f"hf generate ({cache or 'dynamic'} cache): {b * t / seconds:,.0f} tok/s, {seconds:.3f} s per call "
                      f"(decode takes {total_s / seconds:.2f}x its time)")

        policy = build_policy("shared", model, ("generator",), Policies(adapter=args.adapter))
        cfg = Train(max_new_tokens=t)
        optimizers = make_optimizers(policy, cfg)
        prompt_ids = ids.tolist()
        completion_ids = ordinary[torch.randint(len(ordinary), (b, t), generator=generator)].tolist()
        episodes = [
            Episode(problem=None, group=i // 2, turns=[Turn("generator", "generator0", 0, "", Completion("", prompt_ids[i], completion_ids[i]), advantage=1.0 if i % 2 else -1.0)])
            for i in range(b)
        ]
        flops = update_flops(n, b * (p + t), args.adapter)
        for diagnostics in (True, False):
            def update(diagnostics=diagnostics):
                policy.train(True)
                update_policy(policy, optimizers, episodes, tokenizer.pad_token_id, cfg, diagnostics=diagnostics)

            seconds = median_seconds(update, on, args.repeats)
            print(f"update ({args.adapter}, {'with' if diagnostics else 'without'} diagnostics): batch {b} x {p + t} tokens: "
                  f"{seconds:.3f} s per step, {b * (p + t) / seconds:,.0f} tok/s ({utilisation(flops, seconds, peak)})")


if __name__ == "__main__":
    main()
