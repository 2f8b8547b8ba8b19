"""A job's parts on paper: time from FLOPs, bytes through device memory, and launches.

The one time model of the project's GPU checks: ``bench/gpu_smoke.py --dry`` and its budget,
and ``bench/decode_compaction.py``, price with it. A part takes the longer of the device's
time (FLOPs at the peak, at ``MATMUL_EFFICIENCY`` where compute-bound, or bytes at the memory
bandwidth) and the host's (ATen ops launched one after the other). Decoding on CUDA goes through
the decode engine: one CUDA graph replayed per step (:func:`ops_per_step` kernels at
``GRAPH_KERNEL_S`` each, plus the weights and the static KV cache bucket read once); eager
decoding (CPU, and ``Hardware.graphs`` off: the decoder before the engine) launches every op
from the host. Assumptions, sources and the figures before and after: docs/performance.md,
"Time on paper".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from matrixrl.train.engine_plan import CHECK_EVERY, PROJECTIONS, bucket_length

HOST_OP_S = 29e-6
"""Host seconds per ATen op launched eagerly (measured on an H200 node: docs/performance.md)."""
GRAPH_KERNEL_S = 3e-6
"""Device seconds per kernel inside a replayed CUDA graph, beyond its bytes and FLOPs (assumed:
docs/performance.md, "Time on paper: the decode engine", gives the source)."""
GRAPH_LAUNCH_S = 10e-6
"""Host seconds to launch one graph replay."""
SYNC_S = 50e-6
"""Host seconds of one such read (a device-to-host copy and a synchronisation)."""
MATMUL_EFFICIENCY = 0.5
"""The share of the peak that prefill and the update's matrix products reach (an assumption)."""
KV_PASSES = 3
"""Times an eager decoding step moves the KV cache: attention reads it; ``torch.cat`` reads and writes it."""
EAGER_DECODE_OPS = {"full": (69, 52), "lora": (122, 56)}
"""ATen ops of an eager decoding step (per layer, outside the layers) under bfloat16 autocast;
LoRA on all seven projections (tests/test_gpu_smoke.py counts them)."""
UPDATE_OPS = {"full": (194, 64), "lora": (295, 31)}
"""ATen ops of an update's micro-batch, forward and backward (per layer, outside)."""
MERGE_OPS = 3
"""Ops per adapted projection to merge a role's LoRA into the inference copy (B·A, scale and add, copy)."""


def copy_bytes(*, layers: int, hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int, dtype_bytes: int = 2) -> int:
    """Bytes of the engine's merged inference copy (``DecodeWeights.copy_bytes`` once loaded): every layer's
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


@dataclass(frozen=True)
class Hardware:
    """What the time on paper counts with: dense bfloat16 FLOP/s, memory bytes/s, host seconds
    per eager op, whether host and device overlap (a GPU; a CPU computes as it launches), and
    whether decoding replays CUDA graphs (the engine) or launches every op (eager)."""

    name: str
    flops: float
    bandwidth: float
    host_op_s: float = HOST_OP_S
    overlap: bool = True
    nominal: bool = False  # figures not from a table: an unknown device or a CPU
    graphs: bool = True

    def line(self) -> str:
        what = f"{self.flops / 1e12:,.0f} TFLOP/s, {self.bandwidth / 1e12:.3g} TB/s, host {self.host_op_s * 1e6:g} µs per op"
        decoder = "; decoding by graph replay" if self.graphs else "; decoding eagerly"
        return f"{self.name} ({what}{decoder}{', nominal figures' if self.nominal else ''})"


@dataclass
class Work:
    """A part's work on paper: FLOPs, bytes through device memory, ops launched, kernels replayed, seconds."""

    flops: float = 0.0
    moved: float = 0.0
    ops: float = 0.0
    kernels: float = 0.0
    seconds: float = 0.0
    what: str = ""

    def add(self, hw: Hardware, flops: float, moved: float, ops: float, times: float = 1, efficiency: float = 1.0) -> None:
        """``times`` eager phases: the longer of device and host (their sum where they do not overlap)."""
        device = max(flops / (hw.flops * efficiency), moved / hw.bandwidth)
        host = ops * hw.host_op_s
        self.seconds += times * (max(device, host) if hw.overlap else device + host)
        self.flops, self.moved, self.ops = self.flops + times * flops, self.moved + times * moved, self.ops + times * ops

    def replay(self, hw: Hardware, flops: float, moved: float, kernels: float, times: float = 1) -> None:
        """``times`` graph replays: ``step_seconds`` each."""
        self.seconds += times * step_seconds(hw, flops, moved, kernels)
        self.flops, self.moved, self.kernels = self.flops + times * flops, self.moved + times * moved, self.kernels + times * kernels

    def summary(self) -> str:
        if not self.flops:  # the model: bytes through the disk
            return f"{self.what}: {self.seconds:,.1f} s"
        replayed = f", {self.kernels / 1e6:.3g} M kernels replayed" if self.kernels else ""
        return (
            f"{self.what}: {self.flops / 1e15:.3g} PFLOP, {self.moved / 1e12:.3g} TB through memory, "
            f"{self.ops / 1e6:.3g} M ops launched{replayed}: {self.seconds:,.1f} s"
        )

    def as_dict(self) -> dict:
        return {"what": self.what, "flops": self.flops, "bytes_moved": self.moved, "ops": self.ops,
                "kernels": self.kernels, "seconds": self.seconds}  # fmt: skip


def step_seconds(hw: Hardware, flops: float, moved: float, kernels: float) -> float:
    """One graph replay: its kernels one after another on the device, each ``GRAPH_KERNEL_S``
    beyond its work, and the work (FLOPs or bytes, the longer); the host launches the replay
    and reads the rows' state every ``CHECK_EVERY`` steps, overlapped with the device."""
    device = kernels * GRAPH_KERNEL_S + max(flops / hw.flops, moved / hw.bandwidth)
    return max(device, GRAPH_LAUNCH_S + SYNC_S / CHECK_EVERY)


def eager_step_seconds(hw: Hardware, flops: float, moved: float, ops: float) -> float:
    """One eager decoding step: the longer of the device's work and the host's launches."""
    device, host = max(flops / hw.flops, moved / hw.bandwidth), ops * hw.host_op_s
    return max(device, host) if hw.overlap else device + host


def switch_seconds(hw: Hardware, layers: int, kept_bytes: float, graphs: bool) -> float:
    """Compacting a call to its live rows: the engine launches a gather per layer's keys and
    values into the smaller bucket and a few copies of its state (about ``2 × layers + 12`` ops),
    and the kept rows' cache is read and written once; the eager decoder's
    ``DynamicCache.batch_select_indices`` and indexing launch as many."""
    ops = 2 * layers + 12
    return max(ops * hw.host_op_s, 2 * kept_bytes / hw.bandwidth) if graphs or hw.overlap else ops * hw.host_op_s + 2 * kept_bytes / hw.bandwidth


# --- a job's calls and turns -----------------------------------------------------------------------


@dataclass(frozen=True)
class Replayed:
    """One ``generate`` call: its prompts' kind and role, rows, distinct prompts, prompt tokens,
    and the agent of each block of rows (rows split evenly, in order)."""

    kind: str
    role: str
    rows: int
    distinct: int
    prompt: int
    agents: tuple[str, ...]


def role_of(kind: str) -> str:
    return "generator" if kind == "refine" else kind


def training_calls(spec) -> tuple[list[Replayed], list]:
    """A training step's ``generate`` calls in the order the workflow makes them, as the memory
    estimate plans them (``workload.workflow_plan``), and the plan's agents. eval_opt's later
    rounds repeat its evaluator and refine calls."""
    from matrixrl.gpu_memory.workload import eval_opt_rounds, workflow_plan

    cfg = spec.train
    calls, agents = workflow_plan(spec, cfg.problems_per_step * cfg.group_size, cfg.problems_per_step, cfg.max_new_tokens)
    ordered = list(calls)
    if spec.cell.workflow == "eval_opt" and len(calls) == 3:
        ordered = [calls[0], *calls[1:] * (eval_opt_rounds(spec) - 1)]
    replayed = []
    for call in ordered:
        role = role_of(call.kind)
        names = tuple(a.agent for a in agents if a.role == role)
        replayed.append(Replayed(call.kind, role, call.rows, call.distinct, call.prompt, names))
    return replayed, agents


def evaluation_chunk(spec, model) -> Replayed:
    """The evaluation's largest batch: the chunk of one call (at most ``eval.batch_size`` rows)
    at which the memory estimate puts the evaluation's peak."""
    from matrixrl.gpu_memory.peak import _generate_phases
    from matrixrl.gpu_memory.workload import chunks, workflow_plan

    cfg = spec.eval
    problems = getattr(spec.task, "n_eval", None) or cfg.batch_size
    calls, _ = workflow_plan(spec, problems * cfg.samples, problems, cfg.max_new_tokens)
    chooser = "keyed" if cfg.temperature > 0 else "greedy"
    best = None
    for call in calls:  # as peak.evaluation_estimate chunks them
        chunk = chunks(call, cfg.batch_size)
        if call.distinct < call.rows:
            chunk = replace(chunk, distinct=max(1, math.ceil(chunk.rows * call.distinct / call.rows)))
        size = max(sum(v for k, v in parts.items()) for _, parts in _generate_phases(model, chunk, cfg.max_new_tokens, chooser))
        if best is None or size > best[0]:
            best = (size, chunk)
    chunk = best[1]
    role = role_of(chunk.kind)
    return Replayed(chunk.kind, role, chunk.rows, chunk.distinct, chunk.prompt, (f"{role}0",))


# --- the parts on paper ----------------------------------------------------------------------------


def flop_parameters(model) -> int:
    """The weights one token's matrix products use: the linear and output layers, and one adapter under LoRA."""
    return model.matmul_parameters + (0 if model.full else model.adapter_parameters)


def read_per_forward(model) -> int:
    """Weight bytes a forward pass reads: the base (or the inference copy) in the compute dtype and the adapter's copies."""
    return model.shape.parameters * model.compute + (0 if model.full else model.adapter_parameters * model.compute)


def lora_state(model) -> str:
    """How the engine decodes ``model``: "none" (a full model), "merged" or "unmerged" adapters."""
    return "none" if model.full else ("merged" if model.merged else "unmerged")


def decode_ops(model) -> float:
    """Kernels of one engine step of ``model`` (:func:`ops_per_step`), the adapters' share
    interpolated by the projections they target."""
    layers, qk = model.shape.layers, model.shape.qk_norm
    merged = ops_per_step(layers, qk_norm=qk, lora="merged")
    if lora_state(model) != "unmerged":
        return merged
    share = len(model.targets & set(PROJECTIONS)) / len(PROJECTIONS)
    return merged + share * (ops_per_step(layers, qk_norm=qk, lora="unmerged") - merged)


def eager_ops(table: dict, model) -> float:
    """``table``'s eager ops of ``model`` (per layer and outside), LoRA's share interpolated."""
    full, lora = table["full"], table["lora"]
    if model.full:
        per_layer, outside = full
    else:
        share = len(model.targets & set(PROJECTIONS)) / len(PROJECTIONS)
        per_layer, outside = (full[0] + (lora[0] - full[0]) * share, lora[1])
    return model.shape.layers * per_layer + outside


def merge_work(work: Work, hw: Hardware, model) -> None:
    """Merging a role's LoRA into the inference copy before its call (eager): per adapted
    projection B·A, scaled, added to the base into the copy."""
    if lora_state(model) != "merged":
        return
    targets = [(i, o) for name, (i, o) in model.shape.linears.items() if name in model.targets]
    layers = model.shape.layers
    flops = layers * sum(2 * model.rank * i * o for i, o in targets)
    moved = layers * sum(3 * i * o * model.compute for i, o in targets)
    work.add(hw, flops, moved, layers * len(targets) * MERGE_OPS, efficiency=MATMUL_EFFICIENCY)


def decode_work(work: Work, hw: Hardware, model, call: Replayed, reply: int, chooser: str) -> None:
    """One ``generate`` call: the prefill of its distinct prompts (eager, compute-bound), then
    ``reply`` decoding steps: graph replays reading the weights and the whole static cache
    bucket, after a warm-up step and the capture; or, eagerly, steps at the average context
    moving the cache ``KV_PASSES`` times."""
    n, layers, query = flop_parameters(model), model.shape.layers, model.widths[1]
    weights, kv = read_per_forward(model), model.kv_per_token()
    prefill = 2 * n * call.distinct * call.prompt + 2 * call.distinct * call.prompt**2 * layers * query
    ops = eager_ops(EAGER_DECODE_OPS, model)
    work.add(hw, prefill, weights + call.distinct * call.prompt * kv, ops, efficiency=MATMUL_EFFICIENCY)
    logits = call.rows * model.logits_per_row(chooser)
    if hw.graphs:
        merge_work(work, hw, model)
        length = bucket_length(call.prompt + reply)
        flops = 2 * n * call.rows + 4 * call.rows * length * layers * query
        work.add(hw, flops, weights + call.rows * length * kv + logits, 2 * ops)  # warm-up step and capture
        work.replay(hw, flops, weights + call.rows * length * kv + logits, decode_ops(model), times=reply)
        return
    context = call.prompt + reply / 2
    flops = 2 * n * call.rows + 4 * call.rows * context * layers * query
    work.add(hw, flops, weights + KV_PASSES * call.rows * context * kv + logits, ops, times=reply)


def update_rows(micro_batch_tokens: int | None, turns: int, length: int) -> int:
    """Rows of an agent's micro-batch: as many turns as ``micro_batch_tokens`` allows at ``length``."""
    return turns if micro_batch_tokens is None else min(turns, max(1, micro_batch_tokens // length))


def training_work(hw: Hardware, spec, model, micro_batch_tokens: int | None) -> Work:
    """The largest training step: its calls, its update's micro-batches of ``micro_batch_tokens``
    (forward and backward at ``MATMUL_EFFICIENCY``, the logits written and read), the optimizer."""
    from matrixrl.gpu_memory.peak import PROMPT_LOGITS_LEFT_OUT_FROM

    cfg, work = spec.train, Work()
    reply = cfg.max_new_tokens
    calls, agents = training_calls(spec)
    for call in calls:
        chunk = cfg.rollout_batch_size or call.rows
        for start in range(0, call.rows, chunk):
            rows = min(chunk, call.rows - start)
            decode_work(work, hw, model, replace(call, rows=rows, distinct=max(1, min(call.distinct, rows))), reply, "sampled")
    n, layers, query = flop_parameters(model), model.shape.layers, model.widths[1]
    weights, batches = read_per_forward(model), 0
    for agent in agents:
        length = agent.prompt + reply
        rows = update_rows(micro_batch_tokens, agent.turns, length)
        kept = reply + 1 if rows * (length - reply - 1) * model.shape.vocab >= PROMPT_LOGITS_LEFT_OUT_FROM else length
        flops = (6 if model.full else 4) * n * rows * length + 3 * 2 * rows * length**2 * layers * query
        moved = 3 * weights + 2 * model.activations(rows, length, kept) + 2 * model.logits(rows, length, reply, kept)
        times = math.ceil(agent.turns / rows)
        work.add(hw, flops, moved, eager_ops(UPDATE_OPS, model), times=times, efficiency=MATMUL_EFFICIENCY)
        batches += times
    work.add(hw, 0, model.sets * model.trained * 4 * 7, 0)  # AdamW: parameter, gradient, two moments, read and written
    work.what = (
        f"{len(calls)} calls of {' + '.join(str(c.rows) for c in calls)} rows to {reply:,} tokens, "
        f"{sum(a.turns for a in agents)} turns in {batches} micro-batches"
    )
    return work


def evaluation_work(hw: Hardware, spec, model) -> Work:
    """The evaluation's largest batch: one chunk of one call."""
    work = Work()
    chooser = "keyed" if spec.eval.temperature > 0 else "greedy"
    chunk = evaluation_chunk(spec, model)
    decode_work(work, hw, model, chunk, spec.eval.max_new_tokens, chooser)
    work.what = f"the {chunk.kind} call, {chunk.rows} rows × {chunk.prompt:,} + {spec.eval.max_new_tokens:,} tokens"
    return work
