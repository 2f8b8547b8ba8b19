"""The GPU memory of one training or evaluation job at its peak, estimated before it starts.

``plan`` shows, per hf scale, the largest training and evaluation job and the GPU they
will get; ``plan`` and ``run`` refuse a job whose estimate exceeds that GPU, with one
line naming the cell, the estimate, the GPU and the fixes (``refusals``). Nothing is
loaded and torch is not imported: the model's shapes come from its config.json
(``matrixrl.disk``: an hf scale's folder or the local Hugging Face cache; a tiny scale's
settings). Units: bytes in every breakdown; GiB (2^30 bytes, what nvidia-smi's MiB and
torch report) in every line printed.

What a job holds (the code of matrixrl.models.hf, .models.policies, .train.trainer,
.train.grpo, .train.rollout, .train.diagnostics and .jobs.evaluate, which this follows):

- **weights**: trained weights are float32 whatever the compute dtype: a full fine-tune
  holds one float32 model (shared) or one per role (isolated); LoRA holds one frozen base
  in the compute dtype (16-bit on a GPU) and one float32 adapter (shared) or one per role.
  An evaluation loads its checkpoint the same way.
- **reference** (training with the KL anchor): a frozen float32 copy under full
  fine-tuning; nothing under LoRA (the base with adapters off).
- **gradients**: float32, one per trained parameter of every set. They live from a set's
  first backward pass until its ``zero_grad`` a step later, so through the next step's
  rollouts and every other set's update too; a set's first micro-batch of a step runs
  without its own.
- **optimizer**: AdamW's two float32 moments per trained parameter of every set.
- **gradient snapshots**: the per-agent diagnostics copy ``.grad`` once per agent that
  learned but the first, float32: the k-th agent's passes run beside k copies, and the
  dot products afterwards beside K − 1 and float64 chunks of 2^20 elements per agent.
- **damper** (``train.damper``): a moving average per role, float32, always; during the
  update a snapshot per role but the first, then each role's flattened gradient (not
  measured here: no validation case switches it on).
- **autocast copies** (16-bit compute): autocast caches a 16-bit copy of every float32
  weight that requires grad and enters a matrix product, for a whole ``generate`` call
  and for one micro-batch's forward pass, whose backward pass keeps the copies alive:
  a full fine-tune's linear layers and output layer; LoRA's adapters.
- **activations** (the update's micro-batch of rows × padded length tokens): what
  autograd saves per token and decoder layer, counted tensor by tensor (``_layer_bytes``):
  the fp32 residual stream and normalised inputs where RMSNorm weights train, the inputs
  of linear layers whose weights train (one float32 tensor shared by q/k/v, or, in
  16-bit, one cast per layer), Qwen3's query/key norms, SDPA's query, grouped keys and
  values repeated to every head (a padding mask makes transformers repeat them), output
  and log-sum-exp, the padding mask SDPA converts to the compute dtype in every layer
  (rows × length² elements), the MLP's gate, activation and up projections and the down
  projection's input. Checked against autograd's saved tensors of Qwen3 and Llama layers
  in float32 and bfloat16, full and LoRA (docs/real-models.md, "Memory of one job").
  ``gradient_checkpointing``: each layer's input alone, and one layer recomputed.
- **logits** of a micro-batch: the completion positions (all positions when rows ×
  prompt × vocabulary stays under grpo's ``PROMPT_LOGITS_LEFT_OUT_FROM``) times the
  vocabulary, at 12 bytes per element at the backward pass's peak: the float32 logits
  divided by the temperature, saved for the log-softmax, and the float32 gradients of
  the gather and of the per-row log-sum-exp (measured: 12.1–12.2 bytes in float32 and
  bfloat16, full and LoRA).
- **layer gradients**: a decoder layer's gradients in the backward pass (two of the MLP's
  width and a few of the residual stream's per token): the peak instead of the logits'
  at a tiny vocabulary (an approximation, within 10% of the activations on tiny models).
- **KV cache** of the largest ``generate`` call: rows × (prompt + ``max_new_tokens``) ×
  layers × key/value width, keys and values in the compute dtype, but keys in float32
  under a 16-bit full fine-tune (its float32 norms and rotary tables promote them);
  plus one layer's keys while the cache grows (``torch.cat``).
- **prefill**: encoding a call's distinct prompts at once (no gradients): the MLP's three
  intermediate tensors and two residual-stream tensors per token, and the causal mask
  (boolean, then converted to the compute dtype in a layer) per distinct prompt.
- **sampling**: each decoding step's last-position logits, their float32 copy and the
  sampler's temporaries per row and vocabulary entry (training: temperature, softmax,
  noise for the whole batch, its rows and their ratio; evaluation: the keyed noise's
  int64 and float64 tensors; greedy: the logits alone).
- **optimizer step**: AdamW's temporaries: on a GPU (foreach) one float32 tensor the size
  of a set; on CPU (one tensor at a time) two of the largest trained tensor.
- **CUDA runtime** (GPU jobs only; assumed, not measured: no GPU was available): 1 GiB
  of context and library workspaces plus 10% of the tensors for the caching allocator's
  fragmentation.

A job's peak is the largest phase: a rollout or evaluation ``generate`` call (weights,
gradients and optimizer state of the last step, autocast copies, its KV cache and
prefill or sampling), an agent's micro-batch in its set's update (snapshots, autocast
copies, activations, and the logits' or a layer's gradients), the diagnostics' dot
products, the damper, or the optimizer step. bench/gpu_memory.py checks the estimate
against measured peaks on CPU (docs/real-models.md, "Memory of one job").

Assumptions (the worst case a job can meet, so that a refusal is never too late):

- every reply runs to ``max_new_tokens`` (``train.max_new_tokens`` in training,
  ``eval.max_new_tokens`` in evaluation), and a quoted reply is that long too, cut to
  ``prompts.quote_chars`` characters at ``CHARS_PER_TOKEN`` (an orchestrator's strategy
  to ``strategy_chars``);
- a prompt is its role's instructions and chat template (``CHAT_ROLE_TOKENS``, counted
  with SmolLM2's tokenizer, plus Qwen3's empty think block), the longest question of a
  batch (``QUESTION_TOKENS`` per task kind; arith and pyfunc from their settings) and
  what the role quotes: voting's aggregator and orch_workers' synthesizer every agent's
  reply, eval_opt's evaluator the draft, its refine the draft and the verdict, a worker
  its strategy. The compact style's prompts are characters (tokens of a tiny model);
- every agent learns (its turns have advantages), so the diagnostics copy every agent;
- a micro-batch holds as many turns as ``train.micro_batch_tokens`` allows at the
  agent's longest turn (all of them when it is null), every row padded to that length;
- a call's rows are its stage's rows, at most ``train.rollout_batch_size`` (training) or
  ``eval.batch_size`` (evaluation): voting's generators ``n_votes`` × episodes, a
  worker call ``n_workers`` × episodes, every other call one row per episode; an
  episode is one of ``problems_per_step`` × ``group_size`` rollouts in training and of
  the evaluation set's problems × ``eval.samples`` (the whole batch when ``n_eval`` is
  unknown) in evaluation; prompts that repeat (a group's, a problem's samples) are
  prefilled once.

Not counted: a memory's guidance blocks in training prompts and its labeller model
(``memory.train``), and memory jobs (collect, label, distill).
"""

from __future__ import annotations

import math
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from matrixrl.disk import ModelShape, decoder_shape, hf_config, tiny_config

GIB = 1 << 30
"""Every line printed gives GPU memory in GiB (2^30 bytes), as nvidia-smi (MiB) and torch do."""

CHARS_PER_TOKEN = 3
"""Characters per token of a quoted reply (math text: 2.9 with SmolLM2's tokenizer); fewer means longer prompts."""

CHAT_ROLE_TOKENS = {
    "generator": 45,
    "refine": 80,
    "evaluator": 90,
    "aggregator": 65,
    "orchestrator": 70,
    "worker": 60,
    "synthesizer": 70,
}
"""Tokens of a chat prompt without its question and quotes: the role's system message, the
user message's labels and the chat template. Counted with SmolLM2's tokenizer (generator 37,
refine 70, evaluator 80, aggregator of 3 replies 72, orchestrator 61, worker 50, synthesizer
of 3 replies 76), plus Qwen3's empty think block (4) and a margin."""

CANDIDATE_LABEL_TOKENS = 5  # "\n\nSolution i:\n" before each quoted reply
ELLIPSIS_TOKENS = 3  # "[...] " before a quote that was cut

QUESTION_TOKENS = {"gsm8k": 200, "math": 400, "math_generic": 400, "humaneval": 450, "code_generic": 450}
"""Tokens of the longest question in a batch, per task kind (GSM8K's longest are about 200
tokens, MATH's and HumanEval's several hundred); arith and pyfunc are computed from their settings."""

CODE_KINDS = ("pyfunc", "humaneval", "code_generic")  # the rest are math tasks (eval_opt's default rounds)

LOGIT_BYTES = 12
"""Bytes per completion position and vocabulary entry at the update's backward peak (see the docstring)."""

SAMPLING_BYTES = {"sampled": 24, "keyed": 40, "greedy": 0}
"""Bytes per row and vocabulary entry of a decoding step's chooser beyond the logits and their
float32 copy (rollout.SampledChooser, keyed_chooser, greedy_chooser)."""

PROMPT_LOGITS_LEFT_OUT_FROM = 1 << 22  # matrixrl.train.grpo's threshold (kept in step by a test)
DIAGNOSTIC_CHUNK = 1 << 20  # matrixrl.train.diagnostics.CHUNK
CUDA_CONTEXT = 1 * GIB
CUDA_FRAGMENTATION = 0.10

PARTS = (
    "weights", "reference", "gradients", "optimizer", "gradient snapshots", "damper", "autocast copies",
    "activations", "logits", "layer gradients", "KV cache", "prefill", "sampling", "optimizer step", "CUDA runtime",
)
"""The parts of a breakdown, in the order they are listed."""


# --- the model as a job holds it ---------------------------------------------------------


@dataclass(frozen=True)
class JobModel:
    """A cell's model as its jobs hold it: shapes, compute dtype, adapter, parameter sets, device."""

    shape: ModelShape
    compute: int  # bytes of the compute dtype: 2 (bfloat16) or 4 (float32)
    adapter: str  # "full" or "lora"
    rank: int
    targets: frozenset[str]
    sets: int  # parameter sets: 1 (shared) or one per role (isolated)
    device: str  # "cuda" or "cpu"
    checkpointing: bool = False

    @property
    def full(self) -> bool:
        return self.adapter == "full"

    @property
    def widths(self) -> tuple[int, int, int, int]:
        """(hidden, query, key/value, MLP) widths of a decoder layer."""
        linears = self.shape.linears
        return linears["q_proj"][0], linears["q_proj"][1], linears["k_proj"][1], linears["gate_proj"][1]

    @property
    def adapter_parameters(self) -> int:
        return self.shape.lora_parameters(self.rank, self.targets)

    @property
    def trained(self) -> int:
        """Trained parameters of one set."""
        return self.shape.parameters if self.full else self.adapter_parameters

    @property
    def matmul_parameters(self) -> int:
        """Parameters of the linear layers and the output layer: what autocast casts."""
        return self.shape.layers * sum(i * o for i, o in self.shape.linears.values()) + self.shape.vocab * self.shape.hidden

    def weights(self) -> int:
        if self.full:
            return self.sets * self.shape.parameters * 4
        return self.shape.parameters * self.compute + self.sets * self.adapter_parameters * 4

    def autocast_copies(self) -> int:
        """16-bit copies of one set's float32 weights that a forward pass or ``generate`` call caches."""
        if self.compute == 4:
            return 0
        return 2 * (self.matmul_parameters if self.full else self.adapter_parameters)

    def largest_trained_tensor(self) -> int:
        if self.full:
            return self.shape.vocab * self.shape.hidden
        return max(self.rank * max(i, o) for name, (i, o) in self.shape.linears.items() if name in self.targets)

    # --- generation -----------------------------------------------------------------------

    def kv_per_token(self) -> int:
        """KV cache bytes per token, all layers: keys in float32 under a 16-bit full fine-tune."""
        key = 4 if (self.compute == 4 or self.full) else self.compute
        return self.shape.layers * self.widths[2] * (key + self.compute)

    def prefill_per_token(self) -> int:
        """A no-grad forward pass's live tensors per token beside the cache: the MLP's
        activation, up projection and product, and two residual-stream tensors."""
        residual = 4 if (self.full or self.compute == 4) else self.compute
        return 3 * self.compute * self.widths[3] + 2 * residual * self.shape.hidden

    def logits_per_row(self, chooser: str) -> int:
        """A decoding step's bytes per row: last-position logits, their float32 copy, the chooser's temporaries."""
        copy = 4 if self.compute != 4 else 0
        return self.shape.vocab * (self.compute + copy + SAMPLING_BYTES[chooser])

    # --- the update ---------------------------------------------------------------------------

    def saves_input(self, module: str) -> bool:
        return self.full or module in self.targets

    def _group_input(self, width: int, modules: Iterable[str]) -> int:
        """Saved inputs of linear layers that read one tensor: in float32 the tensor itself,
        once; in 16-bit one autocast cast per layer that saves it (LoRA: its adapter's)."""
        saving = sum(self.saves_input(m) for m in modules)
        if not saving:
            return 0
        return 4 * width if self.compute == 4 else self.compute * width * saving

    def layer_bytes(self, length: int) -> int:
        """What autograd saves per token in one decoder layer, for rows padded to ``length``."""
        c, (h, qd, kvd, i) = self.compute, self.widths
        norm = 4 * h + (4 * h if self.full else 0)  # the float32 input (and the normalised input for its weight)
        saved = norm + self._group_input(h, ("q_proj", "k_proj", "v_proj"))
        if self.shape.qk_norm:
            saved += (4 + (c if self.full else 0)) * (qd + kvd)
        saved += 4 * c * qd + c * length + 4 * self.shape.heads  # SDPA: q, repeated k and v, out; mask; log-sum-exp
        if c != 4 and not self.full and "o_proj" in self.targets:
            saved += c * qd  # PEFT takes a 16-bit input to float32 for the adapter, which autocast casts back
        saved += norm + self._group_input(h, ("gate_proj", "up_proj"))
        saved += 3 * c * i + (c * i if self.saves_input("down_proj") else 0)
        if not self.full:
            saved += c * self.rank * len(self.targets & set(self.shape.linears))
        return saved

    def activations(self, rows: int, length: int, kept: int) -> int:
        """Saved activations of a micro-batch of ``rows`` × ``length`` tokens whose output layer
        sees ``kept`` positions per row."""
        tokens, h = rows * length, self.shape.hidden
        layers = self.shape.layers
        if self.checkpointing:  # each layer's input, and one layer recomputed in the backward pass
            residual = 4 if (self.full or self.compute == 4) else self.compute
            body = tokens * (layers * residual * h + self.layer_bytes(length))
        else:
            body = tokens * layers * self.layer_bytes(length)
        final = tokens * (4 * h + (4 * h if self.full else 0))  # the last norm
        if self.full:  # the output layer's input
            final += tokens * 4 * h if self.compute == 4 else rows * kept * self.compute * h
        return body + final

    def logits(self, rows: int, length: int, completion: int, kept: int) -> int:
        return rows * self.shape.vocab * (LOGIT_BYTES * completion + self.compute * (kept - completion))

    def layer_gradients(self, tokens: int) -> int:
        """A decoder layer's gradients in the backward pass beyond what it frees: two of the
        MLP's width and a few of the residual stream's (an approximation: within 10% of the
        saved activations on tiny models, where it matters; negligible at real vocabularies,
        where the logits' gradients are far larger)."""
        grad = 4 if self.compute == 4 else self.compute
        return tokens * (2 * grad * self.widths[3] + 12 * self.shape.hidden)


def job_device(scale) -> str:
    """Where a job of ``scale`` runs: tiny scales and ``device: cpu`` on CPU, other hf scales on a GPU."""
    return "cpu" if scale.kind == "tiny" or scale.device == "cpu" else "cuda"


def compute_bytes(scale, device: str) -> int:
    if scale.kind == "tiny":
        return 4
    dtype = scale.dtype if scale.dtype != "auto" else ("bfloat16" if device == "cuda" else "float32")
    return 4 if dtype == "float32" else 2


def model_config(scale) -> dict | None:
    """The config.json fields of ``scale``'s model, or None where this machine has none."""
    return tiny_config(scale) if scale.kind == "tiny" else hf_config(scale)


def job_model(spec, config: dict | None = None, device: str | None = None) -> JobModel | None:
    """``spec``'s model as its jobs hold it (None: no config.json for it here)."""
    from matrixrl.workflows import WORKFLOWS

    config = config if config is not None else model_config(spec.scale)
    shape = decoder_shape(config) if config is not None else None
    if shape is None:
        return None
    device = device or job_device(spec.scale)
    roles = WORKFLOWS[spec.cell.workflow].roles
    return JobModel(
        shape=shape,
        compute=compute_bytes(spec.scale, device),
        adapter=spec.policies.adapter,
        rank=spec.policies.lora.rank,
        targets=frozenset(spec.policies.lora.target_modules),
        sets=1 if spec.cell.policy == "shared" else len(roles),
        device=device,
        checkpointing=bool(getattr(spec.scale, "gradient_checkpointing", False)),
    )


# --- what a workflow asks of the model -----------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One ``generate`` call: the rows one chunk of it decodes, its distinct prompts, the longest prompt."""

    kind: str  # the prompt's kind: a role, or "refine"
    rows: int
    distinct: int
    prompt: int


@dataclass(frozen=True)
class Agent:
    """One agent's turns in a step's update: how many, the longest prompt and the reply."""

    role: str
    agent: str
    turns: int
    prompt: int


def question_tokens(task) -> int:
    """Tokens (characters for arith and pyfunc) of the longest question of a batch."""
    if task.kind == "arith":
        return task.terms * task.digits + task.terms - 1
    if task.kind == "pyfunc":
        return task.examples * 7 - 1  # "9>90," per example
    return QUESTION_TOKENS.get(task.kind, 400)


def prompt_tokens(spec, kind: str, reply: int, n: int, question: int | None = None) -> int:
    """Tokens of the longest prompt of ``kind`` (a role, or "refine") when replies are
    ``reply`` tokens and ``n`` agents are quoted (voting's aggregator, the synthesizer)."""
    q = question_tokens(spec.task) if question is None else question
    if spec.scale.prompt_style == "compact":  # matrixrl.workflows.styles.compact: characters
        answer, feedback = 8, 3
        return q + {
            "generator": 1, "orchestrator": 1, "worker": 3, "evaluator": answer + 2, "refine": answer + feedback + 2,
            "aggregator": n * (answer + 1) + 1, "synthesizer": n * (answer + 1) + 1,
        }[kind]  # fmt: skip
    prompts = spec.prompts
    quote = min(reply, math.ceil(prompts.quote_chars / CHARS_PER_TOKEN) + ELLIPSIS_TOKENS)
    extra = {
        "generator": 0, "orchestrator": 0, "evaluator": quote, "refine": 2 * quote,
        "worker": min(reply, math.ceil(prompts.strategy_chars / CHARS_PER_TOKEN)),
        "aggregator": n * (quote + CANDIDATE_LABEL_TOKENS), "synthesizer": n * (quote + CANDIDATE_LABEL_TOKENS),
    }[kind]  # fmt: skip
    return CHAT_ROLE_TOKENS[kind] + q + extra


def eval_opt_rounds(spec) -> int:
    rounds = spec.workflow.get("max_iterations")
    return rounds or (2 if spec.task.kind in CODE_KINDS else 3)


def workflow_plan(spec, episodes: int, problems: int, reply: int, prompt=None) -> tuple[list[Call], list[Agent]]:
    """The ``generate`` calls (whole stages, before chunking) and the agents of a batch of
    ``episodes`` rollouts of ``problems`` distinct problems, replies of ``reply`` tokens.

    ``prompt``: kind → tokens of its longest prompt, where known (measured); else computed.
    """
    workflow = spec.cell.workflow
    n = spec.workflow.get("n_votes") or spec.workflow.get("n_workers") or 3

    def p(kind: str) -> int:
        if prompt is not None and kind in prompt:
            return prompt[kind]
        return prompt_tokens(spec, kind, reply, n)

    b, d = episodes, min(problems, episodes)
    if workflow == "single":
        return [Call("generator", b, d, p("generator"))], [Agent("generator", "generator0", b, p("generator"))]
    if workflow == "voting":
        calls = [Call("generator", n * b, d, p("generator")), Call("aggregator", b, b, p("aggregator"))]
        agents = [Agent("generator", f"generator{a}", b, p("generator")) for a in range(n)]
        return calls, [*agents, Agent("aggregator", "aggregator0", b, p("aggregator"))]
    if workflow == "orch_workers":
        calls = [
            Call("orchestrator", b, d, p("orchestrator")), Call("worker", n * b, n * b, p("worker")),
            Call("synthesizer", b, b, p("synthesizer")),
        ]  # fmt: skip
        agents = [Agent("worker", f"worker{a}", b, p("worker")) for a in range(n)]
        return calls, [
            Agent("orchestrator", "orchestrator0", b, p("orchestrator")), *agents,
            Agent("synthesizer", "synthesizer0", b, p("synthesizer")),
        ]  # fmt: skip
    if workflow == "eval_opt":
        rounds = eval_opt_rounds(spec)
        calls = [Call("generator", b, d, p("generator"))]
        if rounds > 1:
            calls += [Call("evaluator", b, b, p("evaluator")), Call("refine", b, b, p("refine"))]
        longest = max(p("generator"), p("refine")) if rounds > 1 else p("generator")
        agents = [Agent("generator", "generator0", rounds * b, longest)]
        if rounds > 1:
            agents.append(Agent("evaluator", "evaluator0", (rounds - 1) * b, p("evaluator")))
        return calls, agents
    raise ValueError(f"no memory plan for workflow {workflow!r}")


def chunks(call: Call, cap: int | None) -> Call:
    """The largest chunk of ``call`` that one ``decode`` runs (at most ``cap`` rows)."""
    rows = min(call.rows, cap) if cap else call.rows
    return replace(call, rows=rows, distinct=max(1, min(call.distinct, rows)))


# --- the estimate ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    """A job's memory at its peak: named parts in bytes, and where the peak is."""

    cell: str
    job: str  # "training" or "evaluation"
    parts: dict[str, int]
    at: str  # the phase of the peak
    device: str

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


def _with_runtime(parts: dict[str, int], device: str) -> dict[str, int]:
    if device != "cuda":
        return parts
    return {**parts, "CUDA runtime": CUDA_CONTEXT + int(CUDA_FRAGMENTATION * sum(parts.values()))}


def _ordered(parts: dict[str, int]) -> dict[str, int]:
    return {name: parts.get(name, 0) for name in PARTS if parts.get(name, 0)}


def _generate_phases(model: JobModel, call: Call, reply: int, chooser: str) -> list[tuple[str, dict[str, int]]]:
    """A call chunk's two candidate peaks: prefill (the cache of the prompts, their encoding)
    and the last decoding step (the whole cache, a layer's growth, the sampler)."""
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
    where = f"{call.kind} call: {call.rows} rows × {call.prompt:,} + {reply:,} tokens"
    return [(f"prefill of the {where}", prefill), (f"decoding of the {where}", decoding)]


def training_estimate(spec, model: JobModel, prompt: Mapping[str, int] | None = None) -> Estimate:
    """The peak of ``spec``'s training job (a step after the first: every set's gradients
    and optimizer state exist)."""
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
            phases.append((f"rollout, {where}", _phase(static, autocast_copies=copies, **_keys(parts))))
    sets = {"shared": roles} if model.sets == 1 else {role: (role,) for role in roles}
    copy = trained * 4  # one float32 copy of a set's gradient
    for set_roles in sets.values():
        members = [a for a in agents if a.role in set_roles]
        acting = list(dict.fromkeys(a.role for a in members))
        for k, agent in enumerate(members):
            length = agent.prompt + reply
            rows = agent.turns if cfg.micro_batch_tokens is None else min(agent.turns, max(1, cfg.micro_batch_tokens // length))
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
    at, parts = max(phases, key=lambda phase: sum(phase[1].values()))
    return Estimate(spec.cell.id, "training", _ordered(_with_runtime(parts, model.device)), at, model.device)


def evaluation_estimate(spec, model: JobModel, prompt: Mapping[str, int] | None = None) -> Estimate:
    """The peak of one evaluation of ``spec``'s checkpoints."""
    cfg = spec.eval
    reply = cfg.max_new_tokens
    n_eval = getattr(spec.task, "n_eval", None)
    problems = n_eval if n_eval else cfg.batch_size
    episodes = problems * cfg.samples
    calls, _ = workflow_plan(spec, episodes, problems, reply, prompt)
    chooser = "keyed" if cfg.temperature > 0 else "greedy"
    static = {"weights": model.weights(), "autocast copies": model.autocast_copies()}
    phases = []
    for call in calls:
        chunk = chunks(call, cfg.batch_size)
        if call.distinct < call.rows:  # a problem's samples side by side: distinct prompts per chunk
            chunk = replace(chunk, distinct=max(1, math.ceil(chunk.rows * call.distinct / call.rows)))
        for where, parts in _generate_phases(model, chunk, reply, chooser):
            phases.append((where, _phase(static, **_keys(parts))))
    at, parts = max(phases, key=lambda phase: sum(phase[1].values()))
    return Estimate(spec.cell.id, "evaluation", _ordered(_with_runtime(parts, model.device)), at, model.device)


def _keys(parts: dict[str, int]) -> dict[str, int]:
    """``parts`` as keyword names for :func:`_phase` (spaces as underscores)."""
    return {name.replace(" ", "_"): value for name, value in parts.items()}


def estimate(
    spec, job: str = "training", *, config: dict | None = None, device: str | None = None,
    prompt: Mapping[str, int] | None = None,
) -> Estimate | None:
    """The peak memory of ``spec``'s ``job`` ("training" or "evaluation"); None when the
    model's config.json is not on this machine.

    ``config``: the model's config.json fields (default: read from the scale); ``device``:
    "cuda" or "cpu" (default: where the job runs, ``job_device``); ``prompt``: the longest
    prompt of each kind in tokens, where known (default: computed, see the module docstring).
    """
    model = job_model(spec, config, device)
    if model is None:
        return None
    if job == "training":
        return training_estimate(spec, model, prompt)
    if job == "evaluation":
        return evaluation_estimate(spec, model, prompt)
    raise ValueError(f"job is training or evaluation, not {job!r}")


# --- the GPU a job gets, and what does not fit it -------------------------------------------------

PROFILE_RESOURCE = "gpu_memory_gib"
"""The resource a Snakemake profile declares, per rule, for the memory of the GPUs its jobs get
(``set-resources: {train: {gpu_memory_gib: 80}, evaluate: {...}}``); matrixrl reads it, SLURM ignores it."""

BUDGET_RULES = {"training": ("train",), "evaluation": ("evaluate", "evaluate_base")}


@dataclass(frozen=True)
class GpuBudget:
    """The memory (bytes) of the GPU a training and an evaluation job will get; None where unknown."""

    training: int | None
    evaluation: int | None
    source: str  # where the numbers come from, or why they are unknown

    def of(self, job: str) -> int | None:
        return self.training if job == "training" else self.evaluation

    @property
    def known(self) -> bool:
        return self.training is not None or self.evaluation is not None


def local_gpu_memory() -> tuple[int | None, str]:
    """The memory of the smallest GPU jobs started here can use (bytes), from ``nvidia-smi``
    (CUDA is not started), and where that comes from; None without a GPU or a driver."""
    from matrixrl.models.devices import visible_gpus

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None, "no nvidia-smi on this machine"
    visible = visible_gpus()
    if not visible:
        return None, "no GPU visible (CUDA_VISIBLE_DEVICES or nvidia-smi)"
    try:
        proc = subprocess.run(
            [smi, "--query-gpu=index,uuid,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None, "nvidia-smi did not answer"
    sizes = {}
    for line in proc.stdout.splitlines() if proc.returncode == 0 else []:
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 3 and fields[2].isdigit():
            sizes[fields[0]] = sizes[fields[1]] = int(fields[2]) * 2**20  # MiB
    found = [sizes[gpu] for gpu in visible if gpu in sizes]
    if len(found) != len(visible):
        return None, f"nvidia-smi does not list the memory of every visible GPU ({', '.join(visible)})"
    what = "the GPU" if len(found) == 1 else f"the smallest of {len(found)} visible GPUs"
    return min(found), f"nvidia-smi: {what}"


def profile_gpu_memory(profile: Path) -> GpuBudget:
    """The GPU memory a profile declares for the training and evaluation rules (``PROFILE_RESOURCE``, GiB)."""
    from matrixrl.errors import ProfileError
    from matrixrl.snake.profiles import rule_resources

    rules = [rule for names in BUDGET_RULES.values() for rule in names]
    table = rule_resources(profile, rules)
    found: dict[str, int | None] = {}
    for job, names in BUDGET_RULES.items():
        declared = []
        for rule in names:
            value = table[rule].get(PROFILE_RESOURCE)
            if value is None:
                continue
            try:
                declared.append(float(value))
            except (TypeError, ValueError):
                raise ProfileError(
                    f"{profile / 'config.yaml'}: set-resources.{rule}.{PROFILE_RESOURCE} is {value!r}; "
                    "give the GPU's memory in GiB, e.g. 80"
                ) from None
        found[job] = int(min(declared) * GIB) if declared else None
    if not any(v is not None for v in found.values()):
        return GpuBudget(None, None, f"profile {profile} declares no {PROFILE_RESOURCE} for train or evaluate")
    return GpuBudget(found["training"], found["evaluation"], f"profile {profile}: {PROFILE_RESOURCE}")


def gpu_budget(profile: Path | None = None) -> GpuBudget:
    """The memory of the GPU each job will get: under a Snakemake ``profile`` what it declares
    (``PROFILE_RESOURCE`` per rule), locally the smallest visible GPU; None where unknown."""
    if profile is not None:
        return profile_gpu_memory(Path(profile))
    memory, source = local_gpu_memory()
    return GpuBudget(memory, memory, source)


_CACHE: dict = {}


def _estimate_cached(spec, job: str) -> Estimate | None:
    """``estimate`` of a cell, shared by cells that differ in their seed alone (the same memory)."""
    cell = spec.cell
    key = (cell.workflow, cell.task, cell.scale, cell.policy, job, spec.model_dump_json(exclude={"cell"}))
    if key not in _CACHE:
        if len(_CACHE) > 4096:
            _CACHE.clear()
        _CACHE[key] = estimate(spec, job)
    found = _CACHE[key]
    return None if found is None else replace(found, cell=cell.id)


def _variants(spec, job: str, found: Estimate) -> Iterable[tuple[str, object]]:
    """(setting as a user writes it, the spec with it) for each change that can lower ``found``."""
    if spec.policies.adapter == "full":
        policies = spec.policies.model_copy(update={"adapter": "lora"})
        yield "policies.adapter: lora", spec.model_copy(update={"policies": policies})
    if spec.cell.policy != "shared":
        yield "policy: shared", spec.model_copy(update={"cell": replace(spec.cell, policy="shared")})
    if job == "training":
        cfg = spec.train
        tokens = cfg.micro_batch_tokens or 1 << 20
        for value in _halvings(tokens, 128):
            yield f"train.micro_batch_tokens: {value}", spec.model_copy(
                update={"train": cfg.model_copy(update={"micro_batch_tokens": value})}
            )
        rows = cfg.rollout_batch_size or cfg.problems_per_step * cfg.group_size * 8
        for value in _halvings(rows, 1):
            yield f"train.rollout_batch_size: {value}", spec.model_copy(
                update={"train": cfg.model_copy(update={"rollout_batch_size": value})}
            )
        if spec.scale.kind == "hf" and not spec.scale.gradient_checkpointing:
            scale = spec.scale.model_copy(update={"gradient_checkpointing": True})
            yield f"scales.{spec.cell.scale}.gradient_checkpointing: true", spec.model_copy(update={"scale": scale})
    else:
        for value in _halvings(spec.eval.batch_size, 1):
            yield f"eval.batch_size: {value}", spec.model_copy(
                update={"eval": spec.eval.model_copy(update={"batch_size": value})}
            )


def _halvings(value: int, floor: int) -> list[int]:
    """``value`` halved again and again, down to ``floor``."""
    found = []
    while value // 2 >= floor:
        value //= 2
        found.append(value)
    return found


def fixes(spec, job: str, found: Estimate, budget: int, *, config: dict | None = None) -> list[str]:
    """The settings that lower ``spec``'s ``job`` estimate, most saving first, each with its
    estimate: ``policies.adapter: lora (about 41.0 GiB)``. A batch setting is given at the
    largest value that fits ``budget`` (else at its smallest)."""
    best: dict[str, tuple[int, str]] = {}
    for setting, changed in _variants(spec, job, found):
        after = estimate(changed, job, config=config, device=found.device)
        if after is None or after.total >= found.total:
            continue
        name = setting.split(":")[0]
        held = best.get(name)
        fits, held_fits = after.total <= budget, held is not None and held[0] <= budget
        # A batch setting: its largest value that fits (the first one, halving), else its smallest estimate.
        if held is None or (fits and not held_fits) or (not fits and not held_fits and after.total < held[0]):
            best[name] = (after.total, setting)
    return [f"{setting} (about {gib(total)} GiB)" for total, setting in sorted(best.values())]


def refusal(spec, job: str, found: Estimate, budget: int) -> str:
    """The line that refuses ``spec``'s ``job``: the cell, the estimate, the GPU, the fixes."""
    return "; ".join(refusal_parts(spec, job, found, budget))


def refusal_parts(spec, job: str, found: Estimate, budget: int) -> tuple[str, str]:
    """:func:`refusal` as (what does not fit, the fix): ``matrixrl doctor`` prints them apart."""
    problem = f"{spec.cell.id}: {job} needs about {gib(found.total)} GiB, more than the {gib(budget)} GiB GPU"
    found_fixes = fixes(spec, job, found, budget)
    if not found_fixes:
        return problem, "no setting lowers it: use a GPU with more memory"
    return problem, f"use {', or '.join(found_fixes)}"


def _gpu_jobs(config, jobs: Iterable[dict] | None) -> Iterable[tuple[object, str]]:
    """(spec, job) of every training and evaluation of a GPU scale; ``jobs``: only those
    pending among these rows (``matrixrl.status.job_statuses``)."""
    from matrixrl import grid as G
    from matrixrl.models.hf import needs_gpu

    wanted = None
    if jobs is not None:
        kinds = {"train": "training", "evaluate": "evaluation"}
        wanted = {(j["cell"], kinds[j["rule"]]) for j in jobs if j["status"] == "pending" and j["rule"] in kinds}
    for cell in G.runs(config):
        if not needs_gpu(config.scales[cell.scale]):
            continue
        spec = None
        for job in ("training", "evaluation"):
            if wanted is not None and (cell.id, job) not in wanted:
                continue
            spec = spec or G.cell_spec(config, cell)
            yield spec, job


def refusals(config, budget: GpuBudget | int | None, jobs: Iterable[dict] | None = None) -> list[str]:
    """One line per training or evaluation job of a GPU scale whose estimate exceeds the GPU it
    will get (``budget``: a ``GpuBudget``, or bytes for every job; None: nothing is refused).
    ``jobs``: the rows of ``matrixrl.status.job_statuses``, to refuse only pending jobs."""
    return ["; ".join(parts) for parts in refused_jobs(config, budget, jobs)]


def refused_jobs(config, budget: GpuBudget | int | None, jobs: Iterable[dict] | None = None) -> list[tuple[str, str]]:
    """:func:`refusals` as (what does not fit, the fix) pairs (:func:`refusal_parts`)."""
    if budget is None:
        return []
    if isinstance(budget, int):
        budget = GpuBudget(budget, budget, "given")
    found_pairs = []
    for spec, job in _gpu_jobs(config, jobs):
        limit = budget.of(job)
        if limit is None:
            continue
        found = _estimate_cached(spec, job)
        if found is not None and found.total > limit:
            found_pairs.append(refusal_parts(spec, job, found, limit))
    return found_pairs


def check_fits(config, budget: GpuBudget | int | None, jobs: Iterable[dict] | None = None) -> None:
    """Raise ``GpuMemoryError`` (one line per job, ``refusals``) when a job would not fit its GPU:
    what ``run`` calls before it starts anything."""
    from matrixrl.errors import GpuMemoryError

    lines = refusals(config, budget, jobs)
    if lines:
        raise GpuMemoryError("\n".join(lines))


def largest_jobs(config) -> tuple[dict[str, dict[str, Estimate]], dict[str, str]]:
    """Per GPU scale of the grid, the estimate of its largest training and evaluation job
    (scale → job → Estimate); and the GPU scales whose config.json is not on this machine
    (scale → its path), which have no estimate."""
    largest: dict[str, dict[str, Estimate]] = {}
    unknown: dict[str, str] = {}
    for spec, job in _gpu_jobs(config, None):
        found = _estimate_cached(spec, job)
        scale = spec.cell.scale
        if found is None:
            unknown[scale] = spec.scale.path
            continue
        held = largest.setdefault(scale, {})
        if job not in held or found.total > held[job].total:
            held[job] = found
    return largest, unknown


def memory_lines(
    config, budget: GpuBudget | int | None, jobs: Iterable[dict] | None = None, with_refusals: bool = True
) -> list[str]:
    """What ``plan`` prints about GPU memory: per GPU scale of the grid its largest training and
    evaluation job and the GPU, then (``with_refusals``) the refusals (``refusals``). Nothing for
    a grid of CPU scales."""
    from matrixrl.models.hf import needs_gpu

    if isinstance(budget, int):
        budget = GpuBudget(budget, budget, "given")
    largest, unknown = largest_jobs(config)
    lines = []
    for scale in config.grid.scale:
        if not needs_gpu(config.scales[scale]):
            continue
        if scale in unknown and scale not in largest:
            lines.append(
                f"GPU memory of {scale}: unknown: no config.json of {unknown[scale]} on this machine "
                f"(`hf download {unknown[scale]} config.json` fetches it)"
            )
            continue
        shown = [
            f"{job} up to about {gib(found.total)} GiB ({found.cell}: {found.at})"
            for job, found in sorted(largest.get(scale, {}).items(), key=lambda item: item[0] != "training")
        ]
        lines.append(f"GPU memory of {scale}: {'; '.join(shown)}")
    if not lines:
        return []
    if budget is None or not budget.known:
        why = budget.source if budget is not None else "not asked"
        lines.append(f"GPU memory available: unknown ({why}); no job is refused")
        return lines
    sizes = {job: budget.of(job) for job in ("training", "evaluation")}
    if sizes["training"] == sizes["evaluation"]:
        lines.append(f"GPU memory available: {gib(sizes['training'])} GiB per job ({budget.source})")
    else:
        shown = ", ".join(f"{job} {gib(size) + ' GiB' if size is not None else 'unknown'}" for job, size in sizes.items())
        lines.append(f"GPU memory available: {shown} ({budget.source})")
    return lines + (refusals(config, budget, jobs) if with_refusals else [])
