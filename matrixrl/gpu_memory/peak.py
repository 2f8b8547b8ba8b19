"""The peak memory of a training or evaluation job: each phase's parts in bytes, and the largest.

What each of ``PARTS`` holds and what is not counted: docs/real-models.md, "The parts of an estimate".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from matrixrl.gpu_memory.model import JobModel, job_model, memory_job_model
from matrixrl.train.engine_plan import bucket_length, bucket_rows
from matrixrl.gpu_memory.workload import Call, chunks, memory_calls, workflow_plan

GIB = 1 << 30
"""Every line printed gives GPU memory in GiB (2^30 bytes), as nvidia-smi (MiB) and torch do."""

PROMPT_LOGITS_LEFT_OUT_FROM = 1 << 22  # matrixrl.train.grpo's threshold (kept in step by a test)
DIAGNOSTIC_CHUNK = 1 << 20  # matrixrl.train.diagnostics.CHUNK
CUDA_CONTEXT = 1 * GIB
CUDA_FRAGMENTATION = 0.10
ALLOCATOR_ROUNDING = 2 << 20  # the caching allocator's kRoundLarge: a request of 10 MiB or more gets a segment rounded up to it
SLACK = "allocator slack"  # a phase's decode_slack while it is worked out (part of the CUDA runtime's share, never a part)

PARTS = (
    "weights", "reference", "gradients", "optimizer", "gradient snapshots", "damper", "autocast copies", "inference copy",
    "activations", "logits", "layer gradients", "KV cache", "prefill", "sampling", "optimizer step", "CUDA runtime",
)
"""The parts of a breakdown, in the order they are listed."""


@dataclass(frozen=True)
class Estimate:
    """A job's memory at its peak: named parts in bytes, and where the peak is."""

    cell: str  # the cell; a memory job's title (its model or bank, and its task)
    job: str  # "training" or "evaluation"; a memory job's rule (collect, label, distill)
    parts: dict[str, int]
    at: str  # the phase of the peak
    device: str
    merged: bool | None = None  # LoRA on CUDA: merged into the engine's inference copy (False: the merged copy does not fit)
    micro_batch_tokens: int | None = None  # the update's micro-batches (``train.micro_batch_tokens``, ``auto`` resolved)

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    @property
    def tensors(self) -> int:
        """The tensors alone (what torch.cuda.max_memory_allocated would report)."""
        return self.total - self.parts.get("CUDA runtime", 0)

    def breakdown(self) -> str:
        """The parts, largest first: ``weights 2.2, activations 1.1, ... GiB``."""
        shown = sorted(((v, k) for k, v in self.parts.items() if v), reverse=True)
        return ", ".join(f"{k} {gib(v)}" for v, k in shown) + " GiB"


def gib(n: float) -> str:
    """``n`` bytes in GiB with one decimal (two below 1 GiB)."""
    value = n / GIB
    return f"{value:.1f}" if value >= 1 else f"{value:.2f}"


def _phase(static: dict[str, int], **more: int) -> dict[str, int]:
    parts = dict(static)
    for name, value in more.items():
        key = name.replace("_", " ")
        parts[key] = parts.get(key, 0) + value
    return parts


def _runtime(parts: dict[str, int], device: str) -> int:
    """The CUDA runtime's share of a phase: the context, and what the caching allocator reserves
    beyond the tensors: 10% of them, or the phase's :func:`decode_slack` where that is more."""
    if device != "cuda":
        return 0
    tensors = sum(v for k, v in parts.items() if k != SLACK)
    return CUDA_CONTEXT + max(int(CUDA_FRAGMENTATION * tensors), parts.get(SLACK, 0))


def _peak(phases: list[tuple[str, dict[str, int]]], device: str) -> tuple[str, dict[str, int]]:
    """The phase whose tensors and CUDA runtime are the largest, and its parts with the runtime's share."""
    def total(phase):
        return sum(v for k, v in phase[1].items() if k != SLACK) + _runtime(phase[1], device)

    at, parts = max(phases, key=total)
    runtime = _runtime(parts, device)
    parts = {k: v for k, v in parts.items() if k != SLACK}
    return at, _ordered({**parts, "CUDA runtime": runtime} if runtime else parts)


def decode_slack(model: JobModel, call: Call, reply: int, chooser: str) -> int:
    """What PyTorch's caching allocator (default settings) must reserve beyond the tensors for the
    eager decoder's growing cache in one call: each cache block's 2 MiB rounding, one block at the
    call's full length, and what cache blocks pin of the step's largest temporary. The derivation:
    docs/performance.md, "Reserved memory while the KV cache grows"."""
    layers = model.shape.layers
    kv_width, compute = model.widths[2], model.compute
    key = 4 if (compute == 4 or model.full) else compute
    longest = call.rows * (call.prompt + reply) * kv_width * max(key, compute)
    shortest = call.rows * call.prompt * kv_width * min(key, compute)
    temporary = call.rows * model.shape.vocab * (8 if chooser == "keyed" else 4)
    return 2 * layers * ALLOCATOR_ROUNDING + longest + 2 * layers * max(0, temporary - shortest)


def _ordered(parts: dict[str, int]) -> dict[str, int]:
    return {name: parts.get(name, 0) for name in PARTS if parts.get(name, 0)}


def _generate_phases(model: JobModel, call: Call, reply: int, chooser: str) -> list[tuple[str, dict[str, int]]]:
    """A call chunk's two candidate peaks: prefill (the cache of the prompts, their encoding)
    and the last decoding step (the whole cache and the sampler). On CUDA the decode engine
    holds its static cache of the call's bucket (``bucket_rows`` × ``bucket_length``) from the start and its
    inference copy of the weights; on CPU the cache grows by concatenation (a layer's growth)."""
    kv = model.kv_per_token()
    length = call.prompt + reply
    prefill = {
        "KV cache": call.rows * call.prompt * kv,
        "prefill": call.distinct * call.prompt * model.prefill_per_token()
        + call.distinct * call.prompt**2 * (1 + model.compute),
    }
    decoding = {
        "KV cache": call.rows * length * kv + call.rows * length * kv // (2 * model.shape.layers),
        "sampling": call.rows * model.logits_per_row(chooser),
    }
    if model.device == "cuda":  # the engine: a static cache, written in place
        static = {"KV cache": bucket_rows(call.rows) * bucket_length(length) * kv, "inference copy": model.inference_copy()}
        prefill.update(static)
        decoding.update(static)
    where = f"{call.kind} call: {call.rows} rows × {call.prompt:,} + {reply:,} tokens"
    return [(f"prefill of the {where}", prefill), (f"decoding of the {where}", decoding)]


AUTO_STEP = 256
"""``train.micro_batch_tokens: auto`` resolves to a multiple of this."""
AUTO_SHARE = 0.85
"""The share of the GPU's memory that ``auto`` fills at most: the rest is the estimate's margin
(the smoke test accepts measured peaks within ±15% of it)."""


def micro_batch_tokens(spec, model: JobModel, gpu: int | None = None, prompt: Mapping[str, int] | None = None) -> int | None:
    """``train.micro_batch_tokens`` as the update uses it: an explicit value (or null) as given;
    ``auto`` on CUDA with the GPU's memory known (``gpu`` bytes), the largest multiple of
    ``AUTO_STEP`` whose training estimate fits ``AUTO_SHARE`` of it (the smallest where none does; null where all
    of every agent's turns fit at once); elsewhere ``AUTO_MICRO_BATCH_TOKENS``, the fixed size."""
    from matrixrl.config.schema import AUTO_MICRO_BATCH_TOKENS

    value = spec.train.micro_batch_tokens
    if value != "auto":
        return value
    if model.device != "cuda" or gpu is None:
        return AUTO_MICRO_BATCH_TOKENS
    gpu = int(AUTO_SHARE * gpu)
    cfg = spec.train
    _, agents = workflow_plan(spec, cfg.problems_per_step * cfg.group_size, cfg.problems_per_step, cfg.max_new_tokens, prompt)
    whole = max((a.turns * (a.prompt + cfg.max_new_tokens) for a in agents), default=AUTO_STEP)
    if _training_estimate(spec, model, prompt, None).total <= gpu:
        return None
    low, high = 1, -(-whole // AUTO_STEP)  # low fits (else the smallest is the answer), high does not
    if _training_estimate(spec, model, prompt, AUTO_STEP).total > gpu:
        return AUTO_STEP
    while high - low > 1:
        middle = (low + high) // 2
        if _training_estimate(spec, model, prompt, middle * AUTO_STEP).total <= gpu:
            low = middle
        else:
            high = middle
    return low * AUTO_STEP


def update_tokens(spec, gpu: int | None) -> int | None:
    """``train.micro_batch_tokens`` for ``spec``'s training job on a GPU of ``gpu`` bytes (None:
    unknown, or a CPU job): ``auto`` resolved by the job's estimate (:func:`micro_batch_tokens`;
    ``AUTO_MICRO_BATCH_TOKENS`` where the model's config.json is not here); else as given."""
    from matrixrl.config.schema import AUTO_MICRO_BATCH_TOKENS

    if spec.train.micro_batch_tokens != "auto":
        return spec.train.micro_batch_tokens
    found = estimate(spec, "training", gpu=gpu)
    return AUTO_MICRO_BATCH_TOKENS if found is None else found.micro_batch_tokens


def training_estimate(spec, model: JobModel, prompt: Mapping[str, int] | None = None, gpu: int | None = None) -> Estimate:
    """The peak of ``spec``'s training job (a step after the first: every set's gradients
    and optimizer state exist), its micro-batches as :func:`micro_batch_tokens` resolves them for ``gpu``."""
    return _training_estimate(spec, model, prompt, micro_batch_tokens(spec, model, gpu, prompt))


def _training_estimate(spec, model: JobModel, prompt: Mapping[str, int] | None, tokens: int | None) -> Estimate:
    from matrixrl.workflows import WORKFLOWS

    cfg = spec.train
    reply = cfg.max_new_tokens
    episodes = cfg.problems_per_step * cfg.group_size
    calls, agents = workflow_plan(spec, episodes, cfg.problems_per_step, reply, prompt)
    trained = model.trained
    roles = WORKFLOWS[spec.cell.workflow].roles
    static = {
        "weights": model.weights(),
        "reference": model.shape.parameters * 4 if model.full and (cfg.kl_beta > 0 or any(cfg.kl_beta_roles.values())) else 0,
        "gradients": model.sets * trained * 4,
        "optimizer": model.sets * 2 * trained * 4,
    }
    damped = cfg.damper > 0 or any(cfg.damper_roles.values())
    if damped:
        static["damper"] = len(roles) * trained * 4  # each role's moving average
    phases: list[tuple[str, dict[str, int]]] = []
    copies = model.autocast_copies()
    for call in calls:
        for where, parts in _generate_phases(model, chunks(call, cfg.rollout_batch_size), reply, "sampled"):
            phases.append((f"rollout, {where}", _phase(static, autocast_copies=model.decode_autocast_copies(), **_keys(parts))))
    sets = {"shared": roles} if model.sets == 1 else {role: (role,) for role in roles}
    copy = trained * 4  # one float32 copy of a set's gradient
    for set_roles in sets.values():
        members = [a for a in agents if a.role in set_roles]
        acting = list(dict.fromkeys(a.role for a in members))
        for k, agent in enumerate(members):
            length = agent.prompt + reply
            rows = agent.turns if tokens is None else min(agent.turns, max(1, tokens // length))
            prompt_logits = rows * (length - reply - 1) * model.shape.vocab
            kept = reply + 1 if prompt_logits >= PROMPT_LOGITS_LEFT_OUT_FROM else length
            # The set's zero_grad frees its gradients: its first micro-batch runs without them,
            # and with none of the diagnostics' copies (the k-th agent runs beside k of them).
            first = k == 0 and rows >= agent.turns
            held = _phase(
                static, gradients=-copy if first else 0, gradient_snapshots=k * copy,
                damper=acting.index(agent.role) * copy if damped else 0, autocast_copies=copies,
                activations=model.activations(rows, length, kept),
            )  # fmt: skip
            where = f"update of {agent.agent}: micro-batches of {rows} rows × {length:,} tokens"
            phases.append((f"{where}, the logits' backward", _phase(held, logits=model.logits(rows, length, reply, kept))))
            phases.append((f"{where}, a layer's backward", _phase(held, layer_gradients=model.layer_gradients(rows * length))))
        if members:  # the diagnostics' dot products: float64 chunks of every agent's gradient
            chunk = min(DIAGNOSTIC_CHUNK, model.largest_trained_tensor()) * 8 * 3
            snapshots = (len(members) - 1) * copy + len(members) * chunk
            phases.append(("the gradient diagnostics", _phase(static, gradient_snapshots=snapshots)))
        if members and damped:  # each role's gradient flattened, beside the snapshots taken before it
            phases.append(("the damper", _phase(static, damper=(2 * len(acting) - 1) * copy)))
    temp = trained * 4 if model.device == "cuda" else 2 * model.largest_trained_tensor() * 4
    phases.append(("optimizer step", _phase(static, optimizer_step=temp)))
    at, parts = _peak(phases, model.device)
    return Estimate(spec.cell.id, "training", parts, at, model.device, _merged(model), tokens)


def evaluation_estimate(spec, model: JobModel, prompt: Mapping[str, int] | None = None) -> Estimate:
    """The peak of one evaluation of ``spec``'s checkpoints."""
    cfg = spec.eval
    reply = cfg.max_new_tokens
    n_eval = getattr(spec.task, "n_eval", None)
    problems = n_eval if n_eval else cfg.batch_size
    episodes = problems * cfg.samples
    calls, _ = workflow_plan(spec, episodes, problems, reply, prompt)
    chooser = "keyed" if cfg.temperature > 0 else "greedy"
    static = {"weights": model.weights(), "autocast copies": model.decode_autocast_copies()}
    phases = []
    for call in calls:
        chunk = chunks(call, cfg.batch_size)
        if call.distinct < call.rows:  # a problem's samples side by side: distinct prompts per chunk
            chunk = replace(chunk, distinct=max(1, math.ceil(chunk.rows * call.distinct / call.rows)))
        for where, parts in _generate_phases(model, chunk, reply, chooser):
            phases.append((where, _phase(static, **_keys(parts))))
    at, parts = _peak(phases, model.device)
    return Estimate(spec.cell.id, "evaluation", parts, at, model.device, _merged(model))


MEMORY_JOBS = ("collect", "label", "distill")


def memory_job_title(spec, job: str) -> str:
    """What a memory job is called in a line: its model or bank, and its task."""
    if job == "collect":
        return f"{spec.model.name} on {spec.task_name}"
    if job == "distill":
        return f"{spec.bank} on {spec.task_name}"
    return f"{spec.task_name} labelled by {spec.model.name}"


def memory_estimate(spec, job: str, *, config: dict | None = None, device: str | None = None) -> Estimate | None:
    """The peak of a memory job (``job``: collect, label or distill; ``spec``: its
    matrixrl.memory.specs spec); None when its model's config.json is not on this machine.
    ``config``, ``device``: as :func:`estimate`'s."""
    if job not in MEMORY_JOBS:
        raise ValueError(f"memory jobs are {', '.join(MEMORY_JOBS)}, not {job!r}")
    model = memory_job_model(spec.model.scale, config, device)
    if model is None:
        return None
    calls, reply, chooser = memory_calls(spec, job)
    static = {"weights": model.weights(), "autocast copies": model.autocast_copies()}
    phases = []
    for call in calls:
        for where, parts in _generate_phases(model, call, reply, chooser):
            phases.append((where, _phase(static, **_keys(parts))))
    at, parts = _peak(phases, model.device)
    return Estimate(memory_job_title(spec, job), job, parts, at, model.device)


def _merged(model: JobModel) -> bool | None:
    return model.merged if model.adapter == "lora" and model.device == "cuda" else None


def _keys(parts: dict[str, int]) -> dict[str, int]:
    """``parts`` as keyword names for :func:`_phase` (spaces as underscores)."""
    return {name.replace(" ", "_"): value for name, value in parts.items()}


def estimate(
    spec, job: str = "training", *, config: dict | None = None, device: str | None = None,
    prompt: Mapping[str, int] | None = None, gpu: int | None = None,
) -> Estimate | None:
    """The peak memory of ``spec``'s ``job`` ("training" or "evaluation"); None when the
    model's config.json is not on this machine.

    ``config``: the model's config.json fields (default: read from the scale); ``device``:
    "cuda" or "cpu" (default: where the job runs, ``job_device``); ``prompt``: the longest
    prompt of each kind in tokens, where known (default: computed by ``workload``);
    ``gpu``: the bytes of the GPU the job gets, where known: ``micro_batch_tokens: auto`` is
    resolved for it, and LoRA adapters stay unmerged at decode (``Estimate.merged`` False)
    where the engine's merged copy would not fit it and the unmerged estimate is smaller.
    """
    if job not in ("training", "evaluation"):
        raise ValueError(f"job is training or evaluation, not {job!r}")
    model = job_model(spec, config, device)
    if model is None:
        return None

    def of(model: JobModel) -> Estimate:
        if job == "training":
            return training_estimate(spec, model, prompt, gpu)
        return evaluation_estimate(spec, model, prompt)

    found = of(model)
    if gpu is not None and found.total > gpu and found.merged:
        unmerged = of(replace(model, merged=False))
        if unmerged.total < found.total:
            return unmerged
    return found
