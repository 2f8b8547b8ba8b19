"""The decode engine (matrixrl.train.engine) against today's decoder (rollout.decode): ops, exactness, time.

Every measurement prints one JSON line as it goes ("what" names it). Ratios and comparisons are
against today's decoder measured in the same run.

On CPU (the default, ``--scale-down``): Qwen3-0.6B's layer structure (28 layers, 16 query and 8
KV heads) with tiny widths, so that the host's cost per op dominates as it does on a GPU:

- ``ops``: ATen ops (views aside, as bench/gpu_smoke.py's ``count_ops``) per decoding step under
  bfloat16 autocast, as a GPU job runs: today's decoder with shared LoRA, isolated LoRA (3
  adapters) and a full model, the engine merged and unmerged, and ``gpu_timing.ops_per_step``;
- ``compile``: the engine's step traced by ``torch.compile(fullgraph=True)`` (no graph break: the
  proxy for capturing it as a CUDA graph);
- ``greedy``: float32 greedy tokens of the engine and today's decoder on every row, through a
  bucket switch (rows end at different steps), for shared LoRA, isolated LoRA and full models;
- ``step_ms``: ms per step, the engine eagerly against today's decoder (noisy on a shared CPU).

With ``--device cuda`` (the GPU window, a few steps per measurement, minutes on an H200):
Qwen3-0.6B's real widths with random weights in bfloat16, three LoRA rank-64 adapters (isolated),
192 rows x ~600-token prompts: ``step_ms`` today's decoder, the engine eager and graphed, merged
and unmerged; ``merge_ms`` (a role switch); ``greedy`` tokens and logits against today's decoder;
``sweep``: graphed ms per step at ~700, 1,600 and 2,600 tokens of context against the bytes floor
(weights and KV cache read once per step at the bandwidth a large copy measures).

    python bench/decode_engine.py
    python bench/decode_engine.py --device cuda
    python bench/decode_engine.py --window --scale-down    # the window's path on CPU, tiny widths
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_timing import ops_per_step  # noqa: E402

from matrixrl.config import Policies  # noqa: E402
from matrixrl.models.hf import compute_context, with_compute_dtype  # noqa: E402
from matrixrl.models.policies import build_policy  # noqa: E402
from matrixrl.train import engine as engine_module  # noqa: E402
from matrixrl.train.engine import Engine, Sampler  # noqa: E402
from matrixrl.train.engine_plan import PROJECTIONS, bucket_length  # noqa: E402
from matrixrl.train.rollout import decode  # noqa: E402
from matrixrl.train.samplers import SampledChooser, greedy_chooser  # noqa: E402

ROLES = ("generator", "evaluator", "judge")
QWEN3_06B = dict(hidden_size=1024, intermediate_size=3072, num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151_936)
"""Qwen3-0.6B's published widths (tests/fixtures/qwen3_configs.json), 28 layers."""
TINY = dict(hidden_size=64, intermediate_size=96, num_attention_heads=16, num_key_value_heads=8, head_dim=8, vocab_size=48)


def emit(what: str, **fields) -> dict:
    line = {"what": what, **fields}
    print(json.dumps(line), flush=True)
    return line


class Counted(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += not func.is_view
        return func(*args, **(kwargs or {}))


def build(widths: dict, device: str, dtype: str, adapter: str, rank: int, layers: int = 28, init: float = 0.02, mode: str = "isolated"):
    """A policy (``mode``) at ``widths``: LoRA adapters (B drawn, so that merging changes the
    weights) on a frozen base in the compute dtype, or full models, one per role. ``init``: the
    weights' initial scale (0.3 makes a tiny model's greedy rows end at many different steps)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        num_hidden_layers=layers, max_position_embeddings=8192, tie_word_embeddings=True, initializer_range=init, **widths
    )
    torch.manual_seed(0)
    with torch.device(device):
        base = Qwen3ForCausalLM(config).eval()
    if adapter == "lora" and dtype != "float32":
        base.to(getattr(torch, dtype)).requires_grad_(False)
    with_compute_dtype(base, dtype)
    lora = {"rank": rank, "alpha": rank, "target_modules": list(PROJECTIONS)}
    policy = build_policy(mode, base, ROLES, Policies(adapter=adapter, lora=lora))
    torch.manual_seed(1)
    if adapter == "lora":
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.data.normal_(0, 0.02 if device == "cuda" else 0.5)
    elif mode == "isolated":
        for role in ROLES[1:]:
            for p in policy.model_for(role).parameters():
                p.data.add_(torch.randn_like(p) * 0.01)
    return policy


def prompts(rows: int, width: int, vocab: int, device: str, padded: int = 3):
    torch.manual_seed(2)
    ids = torch.randint(5, vocab, (rows, width), device=device)
    mask = torch.ones_like(ids)
    for r in range(min(padded, rows)):
        mask[r, : 1 + 2 * r] = 0
    return ids.masked_fill(mask == 0, 0), mask


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def today(model, ids, mask, steps: int, sampler: str = "training", eos: int = -1):
    choose = SampledChooser(1.0, ids.shape[0], steps, ids.device) if sampler == "training" else greedy_chooser()
    with compute_context(model):
        return decode(model, ids, mask, None, max_new_tokens=steps, eos=eos, pad=0, choose=choose)


def engined(engine: Engine, model, ids, mask, steps: int, sampler: str = "training", eos: int = -1):
    with compute_context(model):
        return engine.decode(model, ids, mask, None, max_new_tokens=steps, eos=eos, pad=0, sampler=Sampler(sampler))


def per_step(run, device: str, short: int, long: int) -> float:
    """Seconds per decoding step: (a call of ``long`` steps - one of ``short``) / (long - short)."""
    times = {}
    for steps in (short, long):
        sync(device)
        began = time.perf_counter()
        run(steps)
        sync(device)
        times[steps] = time.perf_counter() - began
    return (times[long] - times[short]) / (long - short)


def ops_per_decoding_step(run, short: int = 2, long: int = 4) -> float:
    counts = {}
    for steps in (short, long):
        with (mode := Counted()):
            run(steps)
        counts[steps] = mode.n
    return (counts[long] - counts[short]) / (long - short)


def count_ops(args) -> None:
    """Ops per step, bfloat16 autocast, the training sampler, tiny widths at 28 layers."""
    ids, mask = prompts(8, 12, TINY["vocab_size"], "cpu")
    reference = None
    for label, adapter in (("shared LoRA", "lora"), ("isolated LoRA (3 adapters)", "lora"), ("full model", "full")):
        policy = build(TINY, "cpu", "bfloat16", adapter, rank=4, mode="shared" if "shared" in label else "isolated")
        model = policy.model_for(ROLES[1])
        ops = ops_per_decoding_step(lambda n: today(model, ids, mask, n))
        reference = reference or ops
        emit("ops", decoder="rollout.decode", policy=label, ops_per_step=ops)
        for lora in ("merged", "unmerged") if adapter == "lora" else ("merged",):
            engine = Engine(lora=lora, graphs=False, check_every=64)
            engine.load(model, torch.bfloat16)
            counted = ops_per_decoding_step(lambda n: engined(engine, model, ids, mask, n))
            analytic = ops_per_step(28, qk_norm=True, lora=lora if adapter == "lora" else "merged", sampler="training")
            emit("ops", decoder=f"engine, {lora}", policy=label, ops_per_step=counted, analytic=analytic, vs_decoder=counted / ops)


def check_compile() -> None:
    policy = build(TINY, "cpu", "float32", "lora", rank=4)
    model = policy.model_for(ROLES[0])
    ids, mask = prompts(8, 12, TINY["vocab_size"], "cpu")
    torch._dynamo.reset()
    compiled = torch.compile(engine_module.decode_step, fullgraph=True, backend="eager")
    real, engine_module.decode_step = engine_module.decode_step, compiled
    try:
        engine = Engine(graphs=False, check_every=4)
        engine.load(model, torch.float32)
        began = time.perf_counter()
        got = engine.decode(model, ids, mask, None, max_new_tokens=6, eos=-1, pad=0, sampler=Sampler("greedy")).tokens
        seconds = time.perf_counter() - began
    except torch._dynamo.exc.Unsupported as exc:  # fullgraph=True: a graph break raises
        emit("compile", layers=28, fullgraph=True, traced_whole=False, reason=str(exc).splitlines()[0])
        return
    finally:
        engine_module.decode_step = real
    expected = decode(model, ids, mask, None, max_new_tokens=6, eos=-1, pad=0, choose=greedy_chooser())
    emit("compile", layers=28, fullgraph=True, traced_whole=True, trace_s=round(seconds, 1), tokens_equal=got == expected)


def spread_eos(model, ids, mask, steps: int, vocab: int) -> int:
    """A token ending many greedy rows (up to three quarters count) at as many distinct steps as can
    be: taken as the EOS, rows end at different steps and the call switches to a smaller bucket."""
    full = decode(model, ids, mask, None, max_new_tokens=steps, eos=-1, pad=0, choose=greedy_chooser())

    def spread(t):
        ends = [row.index(t) for row in full if t in row]
        return (min(len(ends), 3 * len(full) // 4), len(set(ends)))

    return max(range(5, vocab), key=spread)


def check_greedy_cpu() -> None:
    ids, mask = prompts(24, 12, TINY["vocab_size"], "cpu")
    for label, adapter, roles in (("shared LoRA", "lora", ROLES[:1]), ("isolated LoRA", "lora", ROLES), ("full", "full", ROLES)):
        policy = build(TINY, "cpu", "float32", adapter, rank=4, init=0.3, mode="shared" if "shared" in label else "isolated")
        engine = Engine(graphs=False, check_every=4)
        for role in roles:
            model = policy.model_for(role)
            eos = spread_eos(model, ids, mask, 32, TINY["vocab_size"])
            expected = decode(model, ids, mask, None, max_new_tokens=32, eos=eos, pad=0, choose=greedy_chooser())
            engine.load(model, torch.float32)
            got = engine.decode(model, ids, mask, None, max_new_tokens=32, eos=eos, pad=0, sampler=Sampler("greedy")).tokens
            emit(
                "greedy", policy=label, role=role, dtype="float32", rows=len(expected),
                rows_equal=sum(a == b for a, b in zip(got, expected)), ends=sorted({len(r) for r in expected}),
                bucket_switches=engine.switches,
            )  # fmt: skip


def step_ms_cpu() -> None:
    policy = build(TINY, "cpu", "bfloat16", "lora", rank=4)
    model = policy.model_for(ROLES[0])
    ids, mask = prompts(8, 12, TINY["vocab_size"], "cpu")
    reference = per_step(lambda n: today(model, ids, mask, n), "cpu", 4, 20)
    emit("step_ms", decoder="rollout.decode", ms=reference * 1e3)
    engine = Engine(graphs=False, check_every=8)
    engine.load(model, torch.bfloat16)
    ms = per_step(lambda n: engined(engine, model, ids, mask, n), "cpu", 4, 20)
    emit("step_ms", decoder="engine, merged, eager", ms=ms * 1e3, vs_decoder=ms / reference)


# --- the GPU window ----------------------------------------------------------------------------


def release(device: str) -> None:
    if device == "cuda":
        torch.cuda.empty_cache()


def bandwidth(device: str) -> float:
    """Bytes per second a large device-to-device copy moves (read and write)."""
    src = torch.empty((2 << 30) if device == "cuda" else (256 << 20), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    began = time.perf_counter()
    for _ in range(5):
        dst.copy_(src)
    sync(device)
    rate = 2 * src.numel() * 5 / (time.perf_counter() - began)
    del src, dst
    return rate


def gpu_window(args) -> None:
    """The window's measurements; with ``--scale-down`` on CPU at tiny widths (no graphs there)."""
    device, rows = args.device, args.rows
    widths, rank = (TINY, 4) if args.scale_down else (QWEN3_06B, 64)
    cuda = device == "cuda"
    policy = build(widths, device, "bfloat16", "lora", rank=rank)
    name = torch.cuda.get_device_name() if cuda else "cpu"
    emit("model", shape="qwen3-0.6b" if widths is QWEN3_06B else "0.6B layers, tiny widths", widths=widths, layers=28, adapters=len(ROLES), rank=rank, device=name)
    model = policy.model_for(ROLES[0])
    ids, mask = prompts(rows, args.prompt, widths["vocab_size"], device)
    short, long = 8, 8 + args.steps

    reference = per_step(lambda n: today(model, ids, mask, n), device, short, long)
    emit("step_ms", decoder="rollout.decode", rows=rows, prompt=args.prompt, ms=reference * 1e3)
    engines = {}
    for lora, graphs in (("merged", False), ("merged", True), ("unmerged", True)):
        graphs = graphs and cuda
        engine = engines[lora, graphs] = Engine(lora=lora, graphs=graphs, check_every=8, log=lambda line: emit("log", line=line))
        began = time.perf_counter()
        engine.load(model, torch.bfloat16)
        sync(device)
        load_s = time.perf_counter() - began
        ms = per_step(lambda n: engined(engine, model, ids, mask, n), device, short, long) * 1e3
        emit(
            "step_ms", decoder=f"engine, {lora}, {'graphed' if graphs else 'eager'}", rows=rows, prompt=args.prompt, ms=ms,
            vs_decoder=ms / (reference * 1e3), captures=engine.captures, load_ms=load_s * 1e3,
            copy_bytes=engine.weights.copy_bytes(),
        )  # fmt: skip

    merged = engines["merged", cuda]
    times = []
    for role in ROLES[1:] + ROLES[:1]:  # role switches: each merges another adapter into the one copy
        other = policy.model_for(role)
        sync(device)
        began = time.perf_counter()
        merged.load(other, torch.bfloat16)
        sync(device)
        times.append(time.perf_counter() - began)
    emit("merge_ms", per_switch_ms=[t * 1e3 for t in times], median_ms=statistics.median(times) * 1e3)

    compare_greedy(engines["merged", False], model, ids, mask)
    release(device)

    rate = bandwidth(device)
    emit("bandwidth", bytes_per_s=rate)
    weight_bytes = sum(t.numel() * t.element_size() for t in merged.weights._buffers.values())
    weight_bytes += merged.weights.embed.numel() * merged.weights.embed.element_size()
    kv_per_token = 28 * 2 * widths["num_key_value_heads"] * widths["head_dim"] * 2
    for context in args.sweep:
        release(device)
        sweep_ids, sweep_mask = prompts(rows, context, widths["vocab_size"], device, padded=0)
        try:
            ms = per_step(lambda n: engined(merged, model, sweep_ids, sweep_mask, n), device, 8, 8 + args.steps) * 1e3
        except torch.OutOfMemoryError as exc:
            emit("sweep", context=context, rows=rows, error=str(exc).splitlines()[0])
            continue
        read = bucket_length(context + 8 + args.steps // 2)  # the columns attention reads mid-way
        floor_ms = (weight_bytes + rows * read * kv_per_token) / rate * 1e3
        emit("sweep", context=context, rows=rows, ms=ms, floor_ms=floor_ms, vs_floor=ms / floor_ms, columns_read=read)


def compare_greedy(engine: Engine, model, ids, mask, steps: int = 16) -> None:
    """Greedy tokens of the eager engine and today's decoder in bfloat16, and their logits at the
    steps where a row's tokens still agree."""
    logged = {"engine": [], "decoder": []}
    real_choose = engine_module.choose

    def recording(logits, s, out, sampler, batch):
        logged["engine"].append(logits[:batch].clone())
        return real_choose(logits, s, out, sampler, batch)

    def choose(logits, rows, step):
        logged["decoder"].append(logits.clone())
        return logits.argmax(dim=-1)

    engine_module.choose = recording
    try:
        with compute_context(model):
            got = engine.decode(model, ids, mask, None, max_new_tokens=steps, eos=-1, pad=0, sampler=Sampler("greedy")).tokens
    finally:
        engine_module.choose = real_choose
    with compute_context(model):
        expected = decode(model, ids, mask, None, max_new_tokens=steps, eos=-1, pad=0, choose=choose)
    agree = [next((i for i, (a, b) in enumerate(zip(g, e)) if a != b), steps) for g, e in zip(got, expected)]
    worst = 0.0
    for step, (a, b) in enumerate(zip(logged["engine"], logged["decoder"])):
        same = torch.tensor([n > step for n in agree], device=a.device)
        if same.any():
            worst = max(worst, float((a[same] - b[same]).abs().max()))
    emit(
        "greedy", dtype="bfloat16", rows=len(got), steps=steps, rows_equal=sum(n == steps for n in agree),
        mean_agreeing_steps=sum(agree) / len(agree), max_logit_diff_while_equal=worst,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--scale-down", action="store_true", help="tiny widths at 28 layers (the window's measurements on CPU)")
    parser.add_argument("--window", action="store_true", help="the GPU window's measurements (implied by --device cuda)")
    parser.add_argument("--rows", type=int, default=192)
    parser.add_argument("--prompt", type=int, default=600)
    parser.add_argument("--steps", type=int, default=32, help="steps timed per measurement (beyond 8 warm-up ones)")
    parser.add_argument("--sweep", type=int, nargs="*", default=[700, 1600, 2600])
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("decode_engine: --device cuda needs a CUDA device (none is visible); run it on CPU with --window --scale-down")
    if args.device == "cuda" or args.window:
        if args.device == "cpu":
            if not args.scale_down:
                sys.exit("decode_engine: the window's measurements at real widths need --device cuda; on CPU add --scale-down")
            torch.set_num_threads(1)
            args.rows, args.prompt, args.steps, args.sweep = 12, 24, 8, [28, 64, 104]
        gpu_window(args)
        return
    torch.set_num_threads(1)
    count_ops(args)
    check_compile()
    check_greedy_cpu()
    step_ms_cpu()


if __name__ == "__main__":
    main()
