"""GPU smoke test: each workflow, policy and adapter trains a few steps and is evaluated.

One command for the first minutes on a GPU (and, with a tiny model, on CPU):

    python bench/gpu_smoke.py [--model PATH_OR_HUB_ID] [--steps 2] [--dtype bfloat16]
    python bench/gpu_smoke.py --shape all [--cases] [--budget-s N] [--json PATH]   # the paper's shapes
    python bench/gpu_smoke.py --shape all --dry                                      # on paper, in seconds

The cases (below) run without ``--shape``, or with ``--cases``; the shapes (further below)
with ``--shape``.

For every workflow of the registry (``matrixrl.workflows.WORKFLOWS``), both policy modes
(shared, isolated) and both adapters (full, lora), a one-cell config is built in memory:
an ``hf`` scale with the model, computing in ``--dtype``, ``device: auto`` (the GPU when
one is visible; ``--device cpu`` keeps to the CPU); arith (two one-digit terms) in chat prompts, 2 problems × group 2 per
step, short replies. The cell trains ``--steps`` steps through ``train_cell`` (checkpoints
included), and its last checkpoint is evaluated by the evaluation job's ``_evaluate``
(``evaluate`` itself claims a GPU per job, which one process cannot do twice). Checked:

- **parameters**: every parameter set of the policy moved (a CPU copy of its trainable
  tensors taken when the optimizers are made, compared after the last step); under LoRA
  only the adapters train, and every base weight is bit-for-bit what it was;
- **log-prob gap**: the update's per-role ``logp_gap`` (|Δ log p| between the rollout's sampled
  log-probabilities and the update's) is reported for every role, finite, and its mean
  under ``GAP_LIMIT``, 0.05 nats per token, in every step (bfloat16's rounding gave means of
  3e-3 to 7e-3 in tests/test_precision.py; a rollout that decoded without its KV cache gave the
  tiny model 0.104: far more than rounding means the rollout and the update compute different
  policies);
- **memory** (CUDA only): the training and the evaluation's peak, ``torch.cuda.max_memory_allocated``
  after ``reset_peak_memory_stats`` less what was allocated before, against
  ``matrixrl.gpu_memory.estimate`` for the device: over the estimate's total (tensors and
  CUDA runtime) fails, as a refusal would then have come too late; the ratio to the
  estimate's tensors (what ``max_memory_allocated`` counts) is printed (with the random tiny
  model, cuBLAS's workspaces, part of the estimate's CUDA runtime, dominate it). On CPU the peak is
  skipped (not measured with the profiler: bench/gpu_memory.py does that, case by case) and
  the estimate alone is printed;
- **evaluation**: a result with every evaluation problem and an accuracy in [0, 1];
- **throughput**: rollout tokens/s (completion tokens over the steps' time outside the
  update) and update tokens/s (prompt and completion tokens of the turns that learn); MFU
  from bench/gpu.py's FLOP counts (2·N per token a rollout processes, 6·N or 4·N under LoRA
  per token of the update) and its table of peaks, where the GPU's peak is known.

Every turn learns: rewards alternate within each group (bench/gpu_memory.py's
``alternating_rewards`` in the trainer's place), so every agent gets a non-zero advantage
whatever the model scores, and the parameters must move. The trainer's ``make_optimizers``
and ``update_policy`` are wrapped to see the policy and time the update.

Default model: ``--model`` when given (a folder, or a hub id in the local cache: nothing is
downloaded); else, on a GPU, SmolLM2-135M-Instruct if it was converted
(``matrixrl models convert-smollm2``), and otherwise a random tiny chat model built in a
temporary folder (tests/chat_models.py), which is what runs on CPU. On CPU what needs CUDA
(memory peaks, MFU) is skipped, said once. One row per case, then ``all N cases passed`` or
the failures; the exit status is 1 on any failure.

**The paper's shapes** (``--shape qwen3-0.6b,qwen3-1.7b,qwen3-4b`` or ``all``): Qwen3-0.6B,
-1.7B and -4B built from their published figures (``SHAPES``) with random weights, saved in
bfloat16 in a temporary folder beside a stand-in tokenizer of the real vocabulary (151,936
tokens, every character one token, a chat template: tests/chat_models.py), so nothing is
downloaded, and loaded as a job loads an ``hf`` scale (``model_source``, ``CellParts.new_policy``).
For each, examples/paper.yaml's plan (``--config``, ``--set`` as matrixrl's) names the largest
training job and the largest evaluation job, as ``matrixrl plan`` picks them (the largest
memory estimate over the scale's cells); each runs once:

- **the training step**: that cell's ``generate`` calls as the memory estimate plans them
  (``matrixrl.gpu_memory.workload.workflow_plan``: its rows, distinct prompts, prompt lengths
  in tokens as the estimator counts them, ``max_new_tokens``; random prompts of exactly
  that length, the first of each call one token shorter so that the call runs with a padding
  mask), through the rollout's ``make_generate`` with the cell's adapters and policy mode,
  then the update (``update_policy``: its micro-batches, the gradient diagnostics), every turn
  learning (advantages ±1 within each group). The workflow's own code is not run: with the
  stand-in tokenizer its prompts would have other lengths. Its optimizers are primed first
  (gradients and AdamW moments exist, as in every step after the first, which the estimate
  describes: one optimizer step on zero gradients, which moves nothing).
- **the evaluation batch**: the chunk of one call (at most ``eval.batch_size`` rows) where the
  estimate puts the evaluation's peak, decoded as an evaluation decodes (keyed sampling).

A random model does not stop early (and its EOS is hidden from the decoder, as in
bench/gpu_memory.py): every row runs to ``max_new_tokens``, which the check verifies.
Reported per shape, in one table and (``--json``) one JSON file: the parameters moved (every
parameter of a full fine-tune; under LoRA every ``lora_B``, while ``lora_A`` gets no gradient
in a first step, B being zero, and every base weight bit-for-bit the same), the log-prob gap
per role (its mean under ``GAP_LIMIT``), on CUDA the peaks of allocated and reserved memory
against the estimate (allocated within ±15% of the estimate's tensors, reserved never above
its total), rollout, update and evaluation tokens/s and MFU. ``--scale-down F`` divides the
widths, layers and vocabulary (heads kept): the same code on CPU, for tests.

``--profile-decode N`` then decodes the evaluation batch's call under the training's sampler and
the evaluation's, N and 2N steps, and prints per step the time, the ATen ops and the ops that
take the host longest (``profile_decoding``).

``--dry`` prints each shape's estimates (memory per job, what dominates, where the peak is)
and the time on paper of its parts, without building or running anything (torch is not
imported), for ``--gpu`` (default H200) of bench/gpu.py's tables.

**Time on paper**: each phase takes the longer of the device's time (its FLOPs at the peak,
at ``MATMUL_EFFICIENCY`` where compute-bound, or its bytes at the memory bandwidth) and the
host's: ``DECODE_OPS``/``UPDATE_OPS`` ATen ops (counted by ``count_ops``) at ``HOST_OP_S``
each. A decoding step launches about 3,500 ops at 28 layers (LoRA), so at these batch sizes
decoding is host-bound (measured: about 100 ms a step on an H200 node). **``--budget-s N``**: before each part (a case, a shape's model, its
training step, its evaluation batch), its expected time (on paper, times the ratio of
measured to paper of the parts run so far) is compared with what is left of N seconds; a part
that would not fit is skipped with one line naming it and why.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import math
import os
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).parent))  # bench/gpu.py, bench/gpu_memory.py
sys.path.append(str(REPO / "tests"))  # chat_models.py

from gpu import generate_flops, matmul_parameters, mfu, peak_tflops, synchronize, update_flops  # noqa: E402
from gpu_memory import HiddenEos, alternating_rewards  # noqa: E402

POLICIES = ("shared", "isolated")
ADAPTERS = ("full", "lora")
GAP_LIMIT = 0.05
"""The mean |Δ log p| per role and step (nats per token) from which a case fails: 7 times the
largest mean bfloat16's rounding gave (7e-3, tests/test_precision.py), and half of what a
rollout without its KV cache gave the random tiny chat model (a mean of 0.104, a largest of
about 0.5, as with transformers 5.17, which ignores ``cache=``: tests/test_gpu_smoke.py makes
that case fail). A real model's distribution depends far more on the context, so a rollout
computing another policy moves its log-probs by far more."""
MIB = 1 << 20


@dataclass
class Probe:
    """What the wrapped trainer saw of one case's training."""

    policy: object = None
    n: int = 0  # matmul parameters of one model
    before: dict = field(default_factory=dict)  # parameter set → CPU copies of its tensors
    frozen: list = field(default_factory=list)  # (parameter, CPU copy) of what does not train
    update_seconds: float = 0.0
    update_tokens: int = 0
    rollout_tokens: int = 0  # prompt and completion tokens of every turn (what the rollouts processed)

    def watch(self, policy) -> None:
        sets = policy.parameter_sets()
        trained = {id(p) for _, params in sets.values() for p in params}
        self.policy = policy
        self.n = matmul_parameters(policy.model_for(policy.roles[0]))
        self.before = {name: [_copy(p) for p in params] for name, (_, params) in sets.items()}
        self.frozen = [(p, _copy(p)) for m in policy._models() for p in m.parameters() if id(p) not in trained]

    def changes(self) -> tuple[dict[str, tuple[int, int]], int]:
        """Per parameter set (tensors changed, tensors), and how many of the frozen tensors changed."""
        import torch

        moved = {}
        for name, (_, params) in self.policy.parameter_sets().items():
            before = self.before[name]
            moved[name] = (sum(not torch.equal(b, p.detach().cpu()) for b, p in zip(before, params)), len(params))
        frozen = sum(not torch.equal(b, p.detach().cpu()) for p, b in self.frozen)
        return moved, frozen


def _copy(p):
    return p.detach().to("cpu", copy=True)


@contextlib.contextmanager
def probing(probe: Probe):
    """The trainer with alternating rewards, its optimizers' policy watched, its updates timed."""
    import matrixrl.train.trainer as trainer

    names = ("assign_rewards", "make_optimizers", "update_policy")
    original = {name: getattr(trainer, name) for name in names}

    def make_optimizers(policy, cfg):
        probe.watch(policy)
        return original["make_optimizers"](policy, cfg)

    def update_policy(policy, optimizers, episodes, *args, **kwargs):
        turns = [t for e in episodes for t in e.turns]
        probe.rollout_tokens += sum(len(t.completion.prompt_ids) + len(t.completion.completion_ids) for t in turns)
        probe.update_tokens += sum(
            len(t.completion.prompt_ids) + len(t.completion.completion_ids) for t in turns if t.advantage != 0.0
        )
        synchronize(policy.device)
        began = time.perf_counter()
        out = original["update_policy"](policy, optimizers, episodes, *args, **kwargs)
        synchronize(policy.device)
        probe.update_seconds += time.perf_counter() - began
        return out

    trainer.assign_rewards, trainer.make_optimizers, trainer.update_policy = alternating_rewards, make_optimizers, update_policy
    try:
        yield probe
    finally:
        for name, value in original.items():
            setattr(trainer, name, value)


@contextlib.contextmanager
def peak_memory(cuda: bool, found: dict, key: str):
    """``found[key]``: the block's peak of allocated CUDA memory beyond what was allocated before (bytes); None on CPU."""
    import torch

    if not cuda:
        found[key] = None
        yield
        return
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    yield
    torch.cuda.synchronize()
    found[key] = torch.cuda.max_memory_allocated() - before


def case_spec(model: str, workflow: str, policy: str, adapter: str, args, folder: Path):
    """The one-cell spec of a case."""
    from matrixrl import grid as G
    from matrixrl.config.schema import Config

    replies = {"max_new_tokens": args.new}
    config = Config.model_validate({
        "results_dir": str(folder / "results"),
        "grid": {"workflow": [workflow], "task": ["arith"], "scale": ["smoke"], "policy": [policy], "seed": [0]},
        "scales": {"smoke": {"kind": "hf", "path": model, "dtype": args.dtype, "device": args.device, "prompt_style": "chat"}},
        "tasks": {"arith": {"kind": "arith", "digits": 1, "terms": 2, "n_eval": args.problems, "seed": 0}},
        "policies": {"adapter": adapter},
        "train": {"steps": args.steps, "eval_every": args.steps, "problems_per_step": 2, "group_size": 2, **replies},
        "eval": {"samples": 2, **replies},
    })  # fmt: skip
    return G.cell_spec(config, G.runs(config)[0])


def run_case(name: str, spec, folder: Path, cuda: bool, peak: float | None) -> dict:
    """Train and evaluate one case; its row's figures and its failures (an empty list: passed)."""
    from matrixrl.gpu_memory import estimate
    from matrixrl.jobs.evaluate import _evaluate
    from matrixrl.layout import checkpoint_dir
    from matrixrl.train.trainer import train_cell
    from matrixrl.workflows import WORKFLOWS

    quiet = lambda message: None  # noqa: E731
    device = "cuda" if cuda else "cpu"
    failures: list[str] = []
    row: dict = {"case": name}
    memory: dict = {}
    probe = Probe()
    cell_dir = folder / "cell"
    began = time.perf_counter()
    with probing(probe), peak_memory(cuda, memory, "training"):
        trained = train_cell(spec, folder, cell_dir, log=quiet)
    row["train s"] = time.perf_counter() - began
    steps = trained["metrics"]
    seconds = sum(r["seconds"] for r in steps)
    rollout_s = max(seconds - probe.update_seconds, 1e-9)
    completions = sum(r["completion_tokens"] for r in steps)
    row["rollout tok/s"] = completions / rollout_s
    row["update tok/s"] = probe.update_tokens / max(probe.update_seconds, 1e-9)
    adapter = spec.policies.adapter
    row["MFU"] = [mfu(generate_flops(probe.n, probe.rollout_tokens), rollout_s, peak),
                  mfu(update_flops(probe.n, probe.update_tokens, adapter), probe.update_seconds, peak)]  # fmt: skip

    moved, frozen = probe.changes()
    base = len(probe.frozen)
    probe.policy = probe.before = probe.frozen = None  # before the evaluation's peak: nothing of training held
    row["changed"] = f"{sum(c for c, _ in moved.values())}/{sum(n for _, n in moved.values())} tensors"
    still = [set_name for set_name, (c, _) in moved.items() if c == 0]
    if still:
        failures.append(f"parameter sets {', '.join(still)} did not change")
    if adapter == "lora":
        row["changed"] += ", base same" if base and not frozen else f", base {frozen}/{base}"
        if frozen or not base:
            failures.append(f"{frozen} of the {base} base tensors changed under LoRA (none should, and some must be there)")

    gaps: dict[str, list[tuple[float, float]]] = {}
    by_key = {(r["step"], r["role"], r["metric"]): r["value"] for r in trained["roles"]}
    for (step, role, metric), value in by_key.items():
        if metric == "logp_gap_mean":
            gaps.setdefault(role, []).append((value, by_key[(step, role, "logp_gap_max")]))
    roles = WORKFLOWS[spec.cell.workflow].roles
    row["logp gap"] = max((largest for pairs in gaps.values() for _, largest in pairs), default=math.nan)
    if set(gaps) != set(roles):
        failures.append(f"log-prob gap reported for {sorted(gaps)}, not every role of {sorted(roles)}")
    failures += gap_failures(gaps)

    began, last = time.perf_counter(), spec.train.steps
    with peak_memory(cuda, memory, "evaluation"):
        result = _evaluate(spec, last, checkpoint_dir(cell_dir, last), folder, folder / "eval.json", quiet, device=None)
    row["eval s"] = time.perf_counter() - began
    row["eval acc"] = result.accuracy
    if result.n != spec.task.n_eval or not 0.0 <= result.accuracy <= 1.0:
        failures.append(f"evaluation of {result.n} problems (not {spec.task.n_eval}), accuracy {result.accuracy}")

    for job in ("training", "evaluation"):
        found = estimate(spec, job, device=device)
        measured = memory[job]
        shown = "n/a" if found is None else f"{found.tensors / MIB:.1f}"
        if measured is None:
            row[job] = f"skipped/{shown}"
            continue
        row[job] = f"{measured / MIB:.1f}/{shown}" + (f" ({measured / found.tensors:.2f})" if found else "")
        if found is not None and measured > found.total:
            failures.append(f"{job} peak {measured / MIB:.1f} MiB over the estimate's {found.total / MIB:.1f} MiB")
    row["failures"] = failures
    return row


COLUMNS = (
    ("case", 26), ("train s", 7), ("eval s", 6), ("rollout tok/s", 13), ("update tok/s", 12), ("MFU rollout/update", 18),
    ("params changed", 24), ("logp gap max", 12), ("train MiB peak/est", 18), ("eval MiB peak/est", 18),
    ("eval acc", 8), ("result", 6),
)  # fmt: skip


def gap_failures(gaps: dict[str, list[tuple[float, float]]]) -> list[str]:
    """One failure per role whose log-prob gap, ``(mean, max)`` per step, is not finite or whose
    mean reaches ``GAP_LIMIT`` in some step."""
    failures = []
    for role, pairs in sorted(gaps.items()):
        if not all(math.isfinite(m) and math.isfinite(x) for m, x in pairs):
            failures.append(f"log-prob gap of {role} not finite: {pairs}")
        elif max(m for m, _ in pairs) >= GAP_LIMIT:
            failures.append(
                f"log-prob gap of {role}: mean {max(m for m, _ in pairs):.3f} nats per token, not under {GAP_LIMIT}: "
                "the rollout and the update compute different policies"
            )
    return failures


def formatted(row: dict, cuda: bool) -> str:
    if "failures" not in row:  # the case stopped with an exception
        return f"{row['case']:26s} FAILED: {row['error']}"
    mfus = row["MFU"]
    unknown = "n/a (peak unknown)" if cuda else "n/a (CPU)"
    shown = {
        "case": row["case"], "train s": f"{row['train s']:.1f}", "eval s": f"{row['eval s']:.1f}",
        "rollout tok/s": f"{row['rollout tok/s']:,.0f}",
        "update tok/s": f"{row['update tok/s']:,.0f}",
        "MFU rollout/update": "/".join(f"{m:.1%}" for m in mfus) if None not in mfus else unknown,
        "params changed": row["changed"], "logp gap max": f"{row['logp gap']:.2e}",
        "train MiB peak/est": row["training"], "eval MiB peak/est": row["evaluation"], "eval acc": f"{row['eval acc']:.2f}",
        "result": "FAILED" if row["failures"] else "ok",
    }  # fmt: skip
    return "  ".join(f"{shown[name]:>{width}s}" if i else f"{shown[name]:{width}s}" for i, (name, width) in enumerate(COLUMNS))


def default_model(folder: Path, cuda: bool) -> tuple[str, str]:
    """(the model, what it is): on a GPU converted SmolLM2 if present, else a random tiny chat model."""
    from matrixrl.models.hf import default_smollm2_dir, is_converted

    if cuda and is_converted(default_smollm2_dir()):
        return str(default_smollm2_dir()), "SmolLM2-135M-Instruct (converted)"
    from chat_models import random_chat_model

    random_chat_model(folder, seed=0, hidden_size=64, layers=2)
    return str(folder), "a random tiny chat model (Qwen3, hidden 64, 2 layers, character tokenizer)"


# --- the paper's shapes: a random Qwen3 of each size, its largest training step and evaluation batch ---

PAPER = REPO / "examples" / "paper.yaml"
SHAPES = {
    "qwen3-0.6b": {
        "hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
        "intermediate_size": 3072, "vocab_size": 151_936, "tie_word_embeddings": True,
    },
    "qwen3-1.7b": {
        "hidden_size": 2048, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
        "intermediate_size": 6144, "vocab_size": 151_936, "tie_word_embeddings": True,
    },
    "qwen3-4b": {
        "hidden_size": 2560, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "intermediate_size": 9728, "vocab_size": 151_936, "tie_word_embeddings": True,
    },
}  # fmt: skip
"""Qwen3-0.6B, -1.7B and -4B as their published config.json gives them (tests/fixtures/qwen3_configs.json)."""

PROMPT_CHARACTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
"""What the random prompts are written in: each character one token of the stand-in tokenizer."""

# The time on paper (docs/performance.md, "GPU smoke test"). Each phase takes the longer of
# the device's time (FLOPs at a share of the peak, or bytes at the memory bandwidth) and the
# host's (PyTorch launches every ATen op from Python, one after the other).
HOST_OP_S = 29e-6
"""Seconds of host time per ATen op launched: eager PyTorch's dispatch and launch, and the
Python around each op (transformers' and PEFT's modules). Measured on the H200 node of the
second GPU window (docs/performance.md): a training rollout's decoding step at 28 layers
(3,472 ops under LoRA) took 99-110 ms at Qwen3-0.6B and -1.7B alike, with 64 rows or 192,
so 29 µs an op; at 36 layers (4B) 104-141 ms. The first guess, 8 µs (eager PyTorch's
dispatch alone), was 3.6 times too few."""
MATMUL_EFFICIENCY = 0.5
"""The share of the peak that prefill and the update's matrix products reach (an assumption)."""
KV_PASSES = 3
"""Times a decoding step moves the KV cache: attention reads it; the cache grows by ``torch.cat``,
which reads it and writes it again."""
DISK_BYTES_S = 1e9
"""Bytes per second of writing a random model's safetensors and of loading them again."""
HOST_COPY_BYTES_S = 5e9
"""Bytes per second of copying the parameters to the host and comparing them there."""
TOKENIZER_S = 2.0
"""Building, saving and loading the stand-in tokenizer of 151,936 tokens (measured on CPU: about 1.5 s)."""
CASE_S = 3.0
"""A case of the tiny model on paper: host-bound; on this project's CPU a case took 0.5-3.1 s."""
CPU_TFLOPS, CPU_BYTES_S = 0.05, 10e9
"""Nominal figures of a CPU (a few cores), for ``--budget-s`` where no GPU runs."""
DECODE_OPS = {"full": (69, 52), "lora": (122, 56)}
"""ATen ops (views aside) of a decoding step: per decoder layer, and outside the layers (embedding,
rotary tables, final norm, output layer, the sampler and the loop), a padded batch under bfloat16
autocast; LoRA on all seven projections (``count_ops`` counts them; tests keep these in step)."""
UPDATE_OPS = {"full": (194, 64), "lora": (295, 31)}
"""ATen ops of an update's micro-batch (``completion_logps``, forward and backward): per layer, and outside."""
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def shape_fields(name: str, scale_down: int = 1) -> dict:
    """The config.json fields of shape ``name``; ``scale_down`` > 1 divides its widths, layers
    and vocabulary (heads, KV heads and tied embeddings kept: the same structure, for CPU tests)."""
    fields = {"model_type": "qwen3", **SHAPES[name]}
    if scale_down == 1:
        return fields
    f = scale_down
    return {
        **fields,
        "hidden_size": max(8, fields["hidden_size"] // f),
        "intermediate_size": max(8, fields["intermediate_size"] // f),
        "num_hidden_layers": max(1, round(fields["num_hidden_layers"] / f)),
        "head_dim": max(2, fields["head_dim"] // f // 2 * 2),
        "vocab_size": max(256, fields["vocab_size"] // f),
    }


def shape_label(name: str, scale_down: int) -> str:
    return name if scale_down == 1 else f"{name}/{scale_down}"


def described(fields: dict) -> str:
    from matrixrl.disk import decoder_shape

    return (
        f"{decoder_shape(fields).parameters:,} parameters: hidden {fields['hidden_size']}, {fields['num_hidden_layers']} layers, "
        f"{fields['num_attention_heads']} heads, {fields['num_key_value_heads']} KV heads, head_dim {fields['head_dim']}, "
        f"MLP {fields['intermediate_size']}, vocabulary {fields['vocab_size']:,}"
        + (", tied embeddings" if fields["tie_word_embeddings"] else "")
    )


def paper_config(path: Path, sets: list[str], paths: dict[str, Path] | None = None):
    """The config of ``path`` (examples/paper.yaml) with ``--set`` overrides, and the scales of
    ``paths`` pointing at model folders."""
    from matrixrl.config import load_config

    moved = [f"scales.{scale}.path={folder}" for scale, folder in (paths or {}).items()]
    return load_config(path, sets=[*sets, *moved])


def largest_jobs(config, scale: str, fields: dict, device: str) -> dict:
    """The largest training and evaluation job of ``scale`` as ``matrixrl plan`` picks them
    (matrixrl.gpu_memory.fits.largest_jobs: the largest estimate over the grid's cells, the
    first of equals), with the model's ``fields``: job → (spec, Estimate)."""
    from matrixrl import grid as G
    from matrixrl.gpu_memory import estimate

    found: dict = {}
    for cell in G.runs(config):
        if cell.scale != scale:
            continue
        spec = G.cell_spec(config, cell)
        for job in ("training", "evaluation"):
            held = estimate(spec, job, config=fields, device=device)
            if job not in found or held.total > found[job][1].total:
                found[job] = (spec, held)
    return found


# --- what runs: the estimator's calls and turns, replayed ------------------------------------------


@dataclass(frozen=True)
class Replayed:
    """One ``generate`` call of the replay: its prompts' kind and role, rows, distinct prompts,
    prompt tokens, and the agent of each block of rows (rows split evenly, in order)."""

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
    estimate plans them (matrixrl.gpu_memory.workload.workflow_plan: rows, distinct prompts, the
    longest prompt of each kind), and the plan's agents. eval_opt's later rounds repeat its
    evaluator and refine calls."""
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
    """The evaluation's largest batch: the chunk of one ``generate`` call (at most
    ``eval.batch_size`` rows) at which the memory estimate puts the evaluation's peak."""
    from matrixrl.gpu_memory.peak import _generate_phases
    from matrixrl.gpu_memory.workload import chunks, workflow_plan

    cfg = spec.eval
    problems = getattr(spec.task, "n_eval", None) or cfg.batch_size
    calls, agents = workflow_plan(spec, problems * cfg.samples, problems, cfg.max_new_tokens)
    chooser = "keyed" if cfg.temperature > 0 else "greedy"
    best = None
    for call in calls:  # as peak.evaluation_estimate chunks them
        chunk = chunks(call, cfg.batch_size)
        if call.distinct < call.rows:
            chunk = replace(chunk, distinct=max(1, math.ceil(chunk.rows * call.distinct / call.rows)))
        size = max(sum(parts.values()) for _, parts in _generate_phases(model, chunk, cfg.max_new_tokens, chooser))
        if best is None or size > best[0]:
            best = (size, chunk)
    chunk = best[1]
    role = role_of(chunk.kind)
    return Replayed(chunk.kind, role, chunk.rows, chunk.distinct, chunk.prompt, (f"{role}0",))


def call_prompts(call: Replayed, rng) -> list[str]:
    """``call.rows`` prompts of ``call.prompt`` tokens, ``call.distinct`` of them distinct, each
    repeated over consecutive rows (a group's); the first is one token shorter, so that the call
    runs with a padding mask, as prompts of different lengths do."""
    texts = []
    for i in range(call.distinct):
        length = call.prompt - 1 if i == 0 and call.distinct > 1 else call.prompt
        texts.append("".join(rng.choices(PROMPT_CHARACTERS, k=length)))
    return [texts[j * call.distinct // call.rows] for j in range(call.rows)]


# --- on paper ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hardware:
    """What the time on paper counts with: dense bfloat16 FLOP/s, memory bytes/s, host seconds
    per ATen op, and whether host and device overlap (a GPU: yes; a CPU computes as it launches)."""

    name: str
    flops: float
    bandwidth: float
    host_op_s: float = HOST_OP_S
    overlap: bool = True
    nominal: bool = False  # figures not from the table: an unknown device or a CPU

    @classmethod
    def of(cls, name: str, cuda: bool, peak: float | None = None, host_op_s: float = HOST_OP_S) -> Hardware:
        from gpu import peak_bandwidth, peak_tflops

        if not cuda:
            return cls("cpu", (peak or CPU_TFLOPS) * 1e12, CPU_BYTES_S, host_op_s, overlap=False, nominal=True)
        tflops, bandwidth = peak or peak_tflops(name), peak_bandwidth(name)
        unknown = tflops is None or bandwidth is None
        return cls(name, (tflops or 100.0) * 1e12, bandwidth or 1e12, host_op_s, nominal=unknown)

    def line(self) -> str:
        what = f"{self.flops / 1e12:,.0f} TFLOP/s, {self.bandwidth / 1e12:.3g} TB/s, host {self.host_op_s * 1e6:g} µs per op"
        return f"{self.name} ({what}{', nominal figures' if self.nominal else ''})"


@dataclass
class Work:
    """A part's work on paper: FLOPs, bytes through device memory, ATen ops, and seconds."""

    flops: float = 0.0
    moved: float = 0.0
    ops: float = 0.0
    seconds: float = 0.0
    what: str = ""  # what the part does, in words

    def add(self, hw: Hardware, flops: float, moved: float, ops: float, times: float = 1, efficiency: float = 1.0) -> None:
        device = max(flops / (hw.flops * efficiency), moved / hw.bandwidth)
        host = ops * hw.host_op_s
        self.seconds += times * (max(device, host) if hw.overlap else device + host)
        self.flops += times * flops
        self.moved += times * moved
        self.ops += times * ops

    def summary(self) -> str:
        if not self.flops:  # the model: bytes through the disk
            return f"{self.what}: {self.seconds:,.1f} s"
        return (
            f"{self.what}: {self.flops / 1e15:.3g} PFLOP, {self.moved / 1e12:.3g} TB through memory, "
            f"{self.ops / 1e6:.3g} M ops launched: {self.seconds:,.1f} s"
        )

    def as_dict(self) -> dict:
        return {"what": self.what, "flops": self.flops, "bytes_moved": self.moved, "ops": self.ops, "seconds": self.seconds}


def _ops(table: dict, model, layers: int) -> float:
    """``table``'s ops of ``model`` (per layer and outside), LoRA's share of the seven projections interpolated."""
    full, lora = table["full"], table["lora"]
    if model.full:
        per_layer, outside = full
    else:
        share = len(model.targets & set(PROJECTIONS)) / len(PROJECTIONS)
        per_layer, outside = (full[0] + (lora[0] - full[0]) * share, lora[1])
    return layers * per_layer + outside


def flop_parameters(model) -> int:
    """The weights one token's matrix products use: the model's linear layers and output layer,
    and one adapter under LoRA (bench/gpu.py's N, without the other roles' idle adapters)."""
    return model.matmul_parameters + (0 if model.full else model.adapter_parameters)


def _read_per_forward(model) -> int:
    """Weight bytes a forward pass reads: the base in the compute dtype (16-bit copies under a full
    fine-tune's autocast) and the adapter's copies."""
    return model.shape.parameters * model.compute + (0 if model.full else model.adapter_parameters * model.compute)


def decode_work(work: Work, hw: Hardware, model, call: Replayed, reply: int, chooser: str) -> None:
    """One ``generate`` call on paper: the prefill of its distinct prompts (compute-bound) and
    ``reply`` decoding steps at the average context (weights, the KV cache ``KV_PASSES`` times)."""
    n, layers, query = flop_parameters(model), model.shape.layers, model.widths[1]
    weights, kv = _read_per_forward(model), model.kv_per_token()
    prefill = 2 * n * call.distinct * call.prompt + 2 * call.distinct * call.prompt**2 * layers * query
    work.add(hw, prefill, weights + call.distinct * call.prompt * kv, _ops(DECODE_OPS, model, layers), efficiency=MATMUL_EFFICIENCY)
    context = call.prompt + reply / 2
    flops = 2 * n * call.rows + 4 * call.rows * context * layers * query
    moved = weights + KV_PASSES * call.rows * context * kv + call.rows * model.logits_per_row(chooser)
    work.add(hw, flops, moved, _ops(DECODE_OPS, model, layers), times=reply)


def training_work(hw: Hardware, spec, model) -> Work:
    """The largest training step on paper: its calls, its update's micro-batches (forward and
    backward at ``MATMUL_EFFICIENCY``, the logits written and read), the optimizer, and the
    parameters' copies the check compares."""
    from matrixrl.gpu_memory.peak import PROMPT_LOGITS_LEFT_OUT_FROM

    cfg, work = spec.train, Work()
    reply = cfg.max_new_tokens
    calls, agents = training_calls(spec)
    batches = 0
    for call in calls:
        chunk = cfg.rollout_batch_size or call.rows
        for start in range(0, call.rows, chunk):
            rows = min(chunk, call.rows - start)
            part = replace(call, rows=rows, distinct=max(1, min(call.distinct, rows)))
            decode_work(work, hw, model, part, reply, "sampled")
    n, layers, query = flop_parameters(model), model.shape.layers, model.widths[1]
    weights = _read_per_forward(model)
    for agent in agents:
        length = agent.prompt + reply
        rows = agent.turns if cfg.micro_batch_tokens is None else min(agent.turns, max(1, cfg.micro_batch_tokens // length))
        kept = reply + 1 if rows * (length - reply - 1) * model.shape.vocab >= PROMPT_LOGITS_LEFT_OUT_FROM else length
        flops = (6 if model.full else 4) * n * rows * length + 3 * 2 * rows * length**2 * layers * query
        moved = 3 * weights + 2 * model.activations(rows, length, kept) + 2 * model.logits(rows, length, reply, kept)
        work.add(hw, flops, moved, _ops(UPDATE_OPS, model, layers), times=math.ceil(agent.turns / rows), efficiency=MATMUL_EFFICIENCY)
        batches += math.ceil(agent.turns / rows)
    work.add(hw, 0, model.sets * model.trained * 4 * 7, 0)  # AdamW: parameter, gradient, two moments, read and written
    frozen = 0 if model.full else model.shape.parameters * model.compute
    work.seconds += 2 * (model.sets * model.trained * 4 + frozen) / HOST_COPY_BYTES_S
    work.what = (
        f"{len(calls)} calls of {' + '.join(str(c.rows) for c in calls)} rows to {reply:,} tokens, "
        f"{sum(a.turns for a in agents)} turns in {batches} micro-batches"
    )
    return work


def evaluation_work(hw: Hardware, spec, model) -> Work:
    """The evaluation's largest batch on paper: one chunk of one call."""
    work = Work()
    chooser = "keyed" if spec.eval.temperature > 0 else "greedy"
    chunk = evaluation_chunk(spec, model)
    decode_work(work, hw, model, chunk, spec.eval.max_new_tokens, chooser)
    work.what = f"the {chunk.kind} call, {chunk.rows} rows × {chunk.prompt:,} + {spec.eval.max_new_tokens:,} tokens"
    return work


def model_work(fields: dict) -> Work:
    """Building the random model and its tokenizer, saving them (bfloat16) and loading them once."""
    from matrixrl.disk import decoder_shape

    work = Work(moved=decoder_shape(fields).parameters * 2)
    work.seconds = TOKENIZER_S + 2 * work.moved / DISK_BYTES_S
    work.what = f"random weights, {work.moved / 1e9:.3g} GB in bfloat16 written and read, and the tokenizer"
    return work


def shape_plan(config, name: str, fields: dict, hw: Hardware, device: str) -> dict:
    """Shape ``name``'s largest jobs, their estimates and the time on paper of its three parts."""
    from matrixrl.gpu_memory import job_model

    jobs = largest_jobs(config, name, fields, device)
    train_spec, eval_spec = jobs["training"][0], jobs["evaluation"][0]
    return {
        "jobs": jobs,
        "paper": {
            "model": model_work(fields),
            "training step": training_work(hw, train_spec, job_model(train_spec, fields, device)),
            "evaluation batch": evaluation_work(hw, eval_spec, job_model(eval_spec, fields, device)),
        },
    }


def estimate_dict(found) -> dict:
    parts = found.parts
    return {
        "cell": found.cell, "total_bytes": found.total, "tensors_bytes": found.tensors, "parts_bytes": dict(parts),
        "dominant": max(parts, key=parts.__getitem__), "peak_at": found.at,
    }  # fmt: skip


def estimate_line(job: str, found) -> str:
    """``training: CELL: 42.7 GiB (tensors 37.9 GiB), mostly the KV cache (34.1 GiB), at PHASE``."""
    from matrixrl.gpu_memory import gib

    dominant = max(found.parts, key=found.parts.__getitem__)
    return (
        f"{job}: {found.cell}: {gib(found.total)} GiB (tensors {gib(found.tensors)} GiB), mostly {dominant} "
        f"({gib(found.parts[dominant])} GiB), at {found.at}"
    )


def dry_run(args, names: list[str]) -> dict:
    """Each shape's estimates and time on paper, nothing built or run (torch is not imported)."""
    hw = Hardware.of(args.gpu, cuda=True, peak=args.peak_tflops, host_op_s=args.host_us_per_op * 1e-6)
    config = paper_config(args.config, args.set)
    print(f"{_shown_path(args.config)} on paper for one {hw.line()}: each shape's largest training and evaluation "
          "job as `matrixrl plan` picks them; nothing is built or run")  # fmt: skip
    out = {"dry": True, "hardware": hw.__dict__, "config": str(args.config), "shapes": {}}
    total = {}
    for name in names:
        fields = shape_fields(name, args.scale_down)
        label = shape_label(name, args.scale_down)
        plan = shape_plan(config, name, fields, hw, "cuda")
        print(f"{label}: {described(fields)}")
        for job, (_, found) in plan["jobs"].items():
            print(f"  {estimate_line(job, found)}")
        for part, work in plan["paper"].items():
            print(f"  {part}: {work.summary()}")
        total[label] = sum(w.seconds for w in plan["paper"].values())
        out["shapes"][label] = {
            "fields": fields,
            "estimates": {job: estimate_dict(found) for job, (_, found) in plan["jobs"].items()},
            "paper": {part: work.as_dict() for part, work in plan["paper"].items()},
        }
    each = ", ".join(f"{label} {seconds:,.0f} s" for label, seconds in total.items())
    cases = case_names(args.only) if args.cases else []
    if cases:
        print(f"the cases on paper: {len(cases)} × {CASE_S:g} s = {len(cases) * CASE_S:,.0f} s")
    print(f"on paper in all: {sum(total.values()) + len(cases) * CASE_S:,.0f} s ({each})")
    if args.budget_s is not None:
        papers = {label: {part: work["seconds"] for part, work in shape["paper"].items()} for label, shape in out["shapes"].items()}
        out["budget"] = budget_on_paper(args.budget_s, cases, papers)
    return out


def budget_on_paper(seconds: float, cases: list[str], papers: dict[str, dict[str, float]]) -> dict:
    """What ``--budget-s`` would run and skip if every part took its time on paper: the run's
    order and admissions (``run_cases``, ``run_shape``) on a clock that advances by those times."""
    now = [0.0]
    budget = Budget(seconds, clock=lambda: now[0])

    def ran(kind: str, paper: float) -> None:
        now[0] += paper
        budget.record(kind, paper, paper)

    for case in cases:
        if budget.admit(f"case {case}", "case", CASE_S):
            ran("case", CASE_S)
    for label, paper in papers.items():
        parts = ("model", "training step", "evaluation batch")
        if not budget.admit(f"{label} ({', '.join(parts)})", "model", paper["model"] + min(paper[p] for p in parts[1:])):
            continue
        ran("model", paper["model"])
        for part in parts[1:]:
            if budget.admit(f"{label} {part}", part, paper[part]):
                ran(part, paper[part])
    skipped = len(budget.skipped)
    print(f"on paper within --budget-s {seconds:g}: {now[0]:,.0f} s run, {skipped} part{'' if skipped == 1 else 's'} skipped")
    return {"seconds": seconds, "run_s": now[0], "skipped": budget.skipped}


def case_names(only: str | None) -> list[str]:
    """The cases, ``workflow policy adapter``, whose name contains ``only``."""
    from matrixrl.workflows import WORKFLOWS

    cases = [f"{w} {p} {a}" for w in WORKFLOWS for p in POLICIES for a in ADAPTERS]
    return [c for c in cases if only is None or only in c]


def _shown_path(path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def ops_launched(run) -> int:
    """The ATen ops (views aside) that ``run()`` launches, counted as they are dispatched."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counted(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += not func.is_view
            return func(*args, **(kwargs or {}))

    mode = Counted()
    with mode:
        run()
    return mode.n


def count_ops(adapter: str) -> dict[str, tuple[int, int]]:
    """The ATen ops (views aside) a decoding step and an update's micro-batch launch, per decoder
    layer and outside the layers: counted on CPU in a one- and a two-layer Qwen3 computing in
    bfloat16 (autocast), through the policy (LoRA on all seven projections), ``decode`` with the
    training sampler on a padded batch, and ``completion_logps`` forward and backward.
    What ``DECODE_OPS`` and ``UPDATE_OPS`` hold (tests/test_gpu_smoke.py keeps them in step)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from matrixrl.config import Policies
    from matrixrl.models.hf import compute_context, with_compute_dtype
    from matrixrl.models.policies import build_policy
    from matrixrl.train.grpo import TurnBatch, completion_logps
    from matrixrl.train.rollout import decode
    from matrixrl.train.samplers import SampledChooser
    from matrixrl.workflows.base import Completion, Turn

    found = {}
    for layers in (1, 2):
        config = Qwen3Config(
            vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
        )  # fmt: skip
        torch.manual_seed(0)
        base = Qwen3ForCausalLM(config)
        if adapter == "lora":
            base.to(torch.bfloat16).requires_grad_(False)
        with_compute_dtype(base, "bfloat16")
        lora = {"rank": 4, "target_modules": list(PROJECTIONS)}
        model = build_policy("shared", base, ("generator",), Policies(adapter=adapter, lora=lora)).model_for("generator")
        ids = torch.randint(5, 300, (4, 12))
        mask = torch.ones_like(ids)
        mask[0, 0] = 0

        def decoding(steps: int) -> int:
            def run():
                with compute_context(model):
                    choose = SampledChooser(1.0, 4, steps, "cpu")
                    decode(model, ids, mask, None, max_new_tokens=steps, eos=-1, pad=0, choose=choose)

            return ops_launched(run)

        completion = Completion("", list(range(5, 17)), list(range(20, 28)), sampled_logps=[0.0] * 8)
        batch = TurnBatch.from_turns([Turn("generator", "generator0", 0, "", completion, advantage=1.0)] * 2, 0)
        update = ops_launched(lambda: completion_logps(model, batch, 1.0).sum().backward())
        found[layers] = (decoding(2) - decoding(1), update)
    return {
        kind: (found[2][k] - found[1][k], 2 * found[1][k] - found[2][k]) for k, kind in enumerate(("decode", "update"))
    }


# --- the budget ---------------------------------------------------------------------------------------


class Budget:
    """``--budget-s``: before each part, its expected time against what is left, else a line
    saying why it is skipped. Expected: the time on paper, times the ratio of measured to paper
    seconds of the parts of its kind run so far (of every shape part, for a kind not run yet)."""

    def __init__(self, seconds: float | None, clock=time.perf_counter):
        self.seconds = seconds
        self.clock = clock
        self.began = clock()
        self.done: dict[str, list[float]] = {}  # kind → [paper seconds, measured seconds]
        self.skipped: list[dict] = []

    def left(self) -> float | None:
        return None if self.seconds is None else self.seconds - (self.clock() - self.began)

    def expected(self, kind: str, paper: float) -> tuple[float, str]:
        held = self.done.get(kind)
        if held is None and kind != "case":
            shapes = [v for k, v in self.done.items() if k != "case"]
            if shapes:
                held = [sum(v[0] for v in shapes), sum(v[1] for v in shapes)]
        if held is None or held[0] <= 0:
            return paper, "on paper"
        ratio = held[1] / held[0]
        return paper * ratio, f"{_s(paper)} on paper × {ratio:.2f}, measured over paper so far"

    def admit(self, part: str, kind: str, paper: float) -> bool:
        left = self.left()
        if left is None:
            return True
        expected, how = self.expected(kind, paper)
        if expected <= left:
            return True
        line = f"skipped {part}: expected {_s(expected)} ({how}), {_s(max(left, 0.0))} of --budget-s {self.seconds:g} left"
        print(line, flush=True)
        self.skipped.append({"part": part, "expected_s": expected, "left_s": left, "line": line})
        return False

    def record(self, kind: str, paper: float, measured: float) -> None:
        held = self.done.setdefault(kind, [0.0, 0.0])
        held[0] += paper
        held[1] += measured


def _s(seconds: float) -> str:
    return f"{seconds:,.0f} s" if seconds >= 10 else f"{seconds:.2g} s"


# --- running a shape -----------------------------------------------------------------------------------


class DeviceMemory:
    """Peaks of allocated and reserved CUDA memory over a block, beyond the baseline (what was
    allocated and reserved before the policy loaded); None on CPU."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.base = (0, 0)
        self.last: tuple[int, int] | None = None  # the last block's peaks, also when it raised

    def release(self) -> None:
        """What is no longer held goes back: Python's garbage and CUDA's cached blocks."""
        gc.collect()
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    def baseline(self) -> None:
        """Taken with no policy loaded: the peaks count everything the policy then holds."""
        self.release()
        if self.cuda:
            import torch

            self.base = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved())

    @contextlib.contextmanager
    def peak(self, found: dict, key: str, estimate=None):
        """``found[key]``: the block's peaks (allocated, reserved) beyond the baseline. With an
        ``estimate``, the caching allocator is capped for the block at what the estimate gives it
        (its total less the CUDA context, which lives outside the allocator): uncapped, blocks a
        growing KV cache outgrew stay reserved until the GPU is full (docs/performance.md,
        "Reserved memory while the KV cache grows"), so only a capped run tests the estimate's
        reserved share. Over the cap, the allocator frees its cached blocks, then raises
        OutOfMemoryError: the part fails."""
        if not self.cuda:
            found[key] = None
            yield
            return
        import torch

        from matrixrl.gpu_memory.peak import CUDA_CONTEXT

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        if estimate is not None:
            device_bytes = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, (self.base[1] + estimate.total - CUDA_CONTEXT) / device_bytes))
        try:
            yield
            torch.cuda.synchronize()
        finally:
            if estimate is not None:
                torch.cuda.set_per_process_memory_fraction(1.0)
            # Kept also when the block raised: how far a part that ran out of memory had got.
            self.last = (torch.cuda.max_memory_allocated() - self.base[0], torch.cuda.max_memory_reserved() - self.base[1])
        found[key] = self.last


def memory_check(job: str, measured: tuple[int, int] | None, found) -> tuple[dict, list[str]]:
    """A job's peaks against its estimate: allocated within ±15% of the estimate's tensors,
    reserved never above its total (tensors and the CUDA runtime's share)."""
    from matrixrl.gpu_memory import gib

    row = {"estimate_tensors_bytes": found.tensors, "estimate_total_bytes": found.total, "allocated_bytes": None, "reserved_bytes": None}
    if measured is None:
        return row, []
    allocated, reserved = measured
    row.update(allocated_bytes=allocated, reserved_bytes=reserved, allocated_ratio=allocated / found.tensors)
    failures = []
    if not 0.85 <= allocated / found.tensors <= 1.15:
        failures.append(
            f"{job}: allocated peak {gib(allocated)} GiB is {allocated / found.tensors:.2f} times the estimate's tensors "
            f"({gib(found.tensors)} GiB), not within ±15%"
        )
    if reserved > found.total:
        failures.append(f"{job}: reserved peak {gib(reserved)} GiB over the estimate's total {gib(found.total)} GiB")
    return row, failures


def parameter_snapshot(policy) -> dict:
    """CPU copies of every parameter set's tensors (by name) and of every frozen tensor."""
    names = {id(p): n for m in policy._models() for n, p in m.named_parameters()}
    sets = {name: [(names.get(id(p), "?"), p, _copy(p)) for p in params] for name, (_, params) in policy.parameter_sets().items()}
    trained = {id(p) for held in sets.values() for _, p, _ in held}
    frozen = [(p, _copy(p)) for m in policy._models() for p in m.parameters() if id(p) not in trained]
    return {"sets": sets, "frozen": frozen}


def parameters_moved(snapshot: dict, adapter: str) -> tuple[dict, str, list[str]]:
    """What one step moved: per set its changed tensors; under LoRA every ``lora_B`` must have moved
    (``lora_A`` gets no gradient in the first step, while B is still zero) and no base tensor."""
    import torch

    found, failures = {}, []
    for set_name, held in snapshot["sets"].items():
        changed = [(name, not torch.equal(before, p.detach().cpu())) for name, p, before in held]
        entry = {"tensors": len(changed), "changed": sum(c for _, c in changed)}
        if adapter == "lora":
            b = [c for name, c in changed if "lora_B" in name]
            entry["lora_B"], entry["lora_B_changed"] = len(b), sum(b)
            if not b or not all(b):
                failures.append(f"parameter set {set_name}: {len(b) - sum(b)} of its {len(b)} lora_B tensors did not change")
        elif entry["changed"] < entry["tensors"]:
            still = entry["tensors"] - entry["changed"]
            failures.append(f"parameter set {set_name}: {still} of its {entry['tensors']} tensors did not change")
        found[set_name] = entry
    sets = list(found.values())
    base = len(snapshot["frozen"])
    frozen = sum(not torch.equal(b, p.detach().cpu()) for p, b in snapshot["frozen"])
    found["frozen"] = {"tensors": base, "changed": frozen}
    shown = f"{sum(e['changed'] for e in sets)}/{sum(e['tensors'] for e in sets)} tensors"
    if adapter == "lora":
        shown += f" (lora_B {sum(e['lora_B_changed'] for e in sets)}/{sum(e['lora_B'] for e in sets)})"
        shown += ", base same" if base and not frozen else f", base {frozen}/{base}"
        if frozen or not base:
            failures.append(f"{frozen} of the {base} base tensors changed under LoRA (none should, and some must be there)")
    return found, shown, failures


def load_shape_policy(spec, scale: str, device: str):
    """The policy of ``spec`` on its scale's model folder, loaded as a job loads it
    (``model_source``, ``CellParts.new_policy``), and the tokenizer."""
    from types import SimpleNamespace

    from matrixrl.models.hf import model_source
    from matrixrl.train.cell import CellParts
    from matrixrl.train.interventions import needs_reference
    from matrixrl.workflows import WORKFLOWS

    source = model_source(scale, spec.scale, Path(spec.scale.path), device=device)
    tokenizer = source.load_tokenizer()
    roles = WORKFLOWS[spec.cell.workflow].roles
    parts = CellParts(spec=spec, source=source, tokenizer=tokenizer, task=None, style=None, workflow=SimpleNamespace(roles=roles))
    policy = parts.new_policy(reference=needs_reference(spec.train))
    if getattr(spec.scale, "gradient_checkpointing", False):
        policy.enable_gradient_checkpointing()
    return policy, tokenizer


def run_training(spec, policy, tokenizer, memory: DeviceMemory, found=None) -> dict:
    """The largest training step, once: its optimizers primed (every set's gradients and AdamW
    moments exist, as in every step after the first: one optimizer step on zero gradients,
    which moves nothing), the rollout's calls replayed with the plan's rows and prompt lengths
    (every row to ``max_new_tokens``), every turn learning (advantages ±1 within each group),
    the update as the trainer makes it."""
    import random

    import torch

    from matrixrl.train.interventions import Damper
    from matrixrl.train.rollout import make_generate
    from matrixrl.train.trainer import make_optimizers
    from matrixrl.train.update import update_policy
    from matrixrl.workflows.base import Episode, Turn

    cfg = spec.train
    torch.set_num_threads(cfg.threads)  # as train_cell
    reply, count = cfg.max_new_tokens, cfg.problems_per_step * cfg.group_size
    calls, agents = training_calls(spec)
    device = policy.device
    optimizers = make_optimizers(policy, cfg)
    for name, (_, params) in policy.parameter_sets().items():
        for p in params:
            p.grad = torch.zeros_like(p)
        optimizers[name].step()
    snapshot = parameter_snapshot(policy)
    batch = {"batch_size": cfg.rollout_batch_size} if cfg.rollout_batch_size else {}
    generate = make_generate(policy, HiddenEos(tokenizer), max_new_tokens=reply, temperature=cfg.temperature, sample=True, **batch)
    rng = random.Random(0)
    torch.manual_seed(0)
    episodes = [Episode(problem=None, group=e // cfg.group_size) for e in range(count)]
    out: dict = {"processed_tokens": 0}
    with memory.peak(out, "memory", found):
        policy.train(False)
        synchronize(device)
        began = time.perf_counter()
        for number, call in enumerate(calls, 1):
            started = time.perf_counter()
            for j, completion in enumerate(generate(call.role, call_prompts(call, rng))):
                episode, agent = episodes[j % count], call.agents[j // count]
                index = sum(t.agent == agent for t in episode.turns)
                advantage = 1.0 if (j % count) % 2 == 0 else -1.0
                episode.turns.append(Turn(call.role, agent, index, "", completion, advantage=advantage))
            out["processed_tokens"] += call.distinct * call.prompt + call.rows * reply
            synchronize(device)
            took = time.perf_counter() - started
            # As it goes: a window that closes mid-step still learns how fast decoding was.
            print(f"    rollout call {number} of {len(calls)} ({call.role}): {call.rows} rows × {call.prompt} + {reply} "
                  f"tokens in {took:.1f} s ({took / reply * 1e3:.1f} ms per decoding step)", flush=True)  # fmt: skip
        synchronize(device)
        out["rollout_s"] = time.perf_counter() - began
        policy.train(True)
        began = time.perf_counter()
        update = update_policy(
            policy, optimizers, episodes, tokenizer.pad_token_id, cfg, damper=Damper.from_train(cfg),
            micro_batch_tokens=cfg.micro_batch_tokens,
        )  # fmt: skip
        synchronize(device)
        out["update_s"] = time.perf_counter() - began
        print(f"    update: {sum(len(e.turns) for e in episodes)} turns in {out['update_s']:.1f} s", flush=True)
    turns = [t for e in episodes for t in e.turns]
    out["completion_tokens"] = sum(len(t.completion.completion_ids) for t in turns)
    out["update_tokens"] = sum(len(t.completion.prompt_ids) + len(t.completion.completion_ids) for t in turns)
    failures = []
    for agent in agents:  # the replay is the estimate's plan
        mine = [t for t in turns if t.agent == agent.agent]
        longest = max((len(t.completion.prompt_ids) for t in mine), default=0)
        if (len(mine), longest) != (agent.turns, agent.prompt):
            failures.append(
                f"{agent.agent}: {len(mine)} turns, prompts up to {longest} tokens; the plan has {agent.turns}, {agent.prompt}"
            )
    short = sum(len(t.completion.completion_ids) != reply for t in turns)
    if short:
        failures.append(f"{short} of {len(turns)} rollout rows stopped before max_new_tokens ({reply})")
    measured = {role: (u.gap[0] / u.gap[2], u.gap[1]) for role, u in update.roles.items() if u.gap and u.gap[2]}
    gaps = {role: [pair] for role, pair in measured.items()}
    out["logp_gap"] = {role: {"mean": mean, "max": largest} for role, (mean, largest) in measured.items()}
    roles = {t.role for t in turns}
    if set(gaps) != roles:
        failures.append(f"log-prob gap reported for {sorted(gaps)}, not every role of {sorted(roles)}")
    failures += gap_failures(gaps)
    out["parameters"], out["changed"], moved_failures = parameters_moved(snapshot, spec.policies.adapter)
    failures += moved_failures
    for name, (_, params) in policy.parameter_sets().items():  # the evaluation holds no gradient
        for p in params:
            p.grad = None
    out["failures"] = failures
    return out


def run_evaluation(spec, policy, tokenizer, chunk: Replayed, memory: DeviceMemory, found=None) -> dict:
    """The evaluation's largest batch, once: ``chunk``'s rows decoded as an evaluation decodes
    (keyed sampling at ``eval.temperature``, ``eval.batch_size``), every row to ``max_new_tokens``."""
    import random

    import torch

    from matrixrl.jobs.evaluate import eval_seed
    from matrixrl.train.rollout import make_generate

    cfg = spec.eval
    torch.set_num_threads(cfg.threads)  # as the evaluation job
    reply, sampled = cfg.max_new_tokens, cfg.temperature > 0
    generate = make_generate(
        policy, HiddenEos(tokenizer), max_new_tokens=reply, temperature=cfg.temperature if sampled else 1.0,
        sample=sampled, batch_size=cfg.batch_size, seed=eval_seed(spec.cell.seed, spec.train.steps) if sampled else None,
    )  # fmt: skip
    policy.train(False)
    prompts = call_prompts(chunk, random.Random(1))
    out: dict = {}
    with memory.peak(out, "memory", found):
        synchronize(policy.device)
        began = time.perf_counter()
        completions = generate(chunk.role, prompts)
        synchronize(policy.device)
        out["seconds"] = time.perf_counter() - began
    out["completion_tokens"] = sum(len(c.completion_ids) for c in completions)
    out["processed_tokens"] = chunk.distinct * chunk.prompt + chunk.rows * reply
    short = sum(len(c.completion_ids) != reply for c in completions)
    out["failures"] = [f"{short} of {len(completions)} evaluation rows stopped before max_new_tokens ({reply})"] if short else []
    return out


def run_shape(name: str, args, cuda: bool, hw: Hardware, peak: float | None, budget: Budget, tmp: Path, save=lambda row: None) -> dict:
    """Shape ``name``: a random model of it, then its largest training step and evaluation batch
    (each once, if the budget leaves time), checked; its row's figures, also given to ``save``
    after each part (a window that closes mid-shape keeps what ran). A part that raises (an
    out-of-memory error, say) is a failure of its own: the next part still runs."""
    import shutil

    import torch

    from chat_models import random_shaped_model
    from matrixrl.gpu_memory import job_model
    from matrixrl.models.hf import resolve_dtype

    fields, label = shape_fields(name, args.scale_down), shape_label(name, args.scale_down)
    folder = tmp / name
    folder.mkdir()  # the config's path must be a folder; the model is saved there once the budget admits it
    device = "cuda" if cuda else "cpu"
    config = paper_config(args.config, args.set, {name: folder})
    plan = shape_plan(config, name, fields, hw, device)
    (train_spec, train_found), (eval_spec, eval_found) = plan["jobs"]["training"], plan["jobs"]["evaluation"]
    paper = {part: work.seconds for part, work in plan["paper"].items()}
    row: dict = {
        "shape": label, "fields": fields,
        "estimates": {job: estimate_dict(found) for job, (_, found) in plan["jobs"].items()},
        "paper": {part: work.as_dict() for part, work in plan["paper"].items()},
        "measured": {}, "skipped": [], "failures": [],
    }  # fmt: skip
    print(f"{label}: {described(fields)}; computing in {resolve_dtype(train_spec.scale.dtype, device)} on {device}")
    for job, (_, found) in plan["jobs"].items():
        print(f"  {estimate_line(job, found)}")
    parts = ("model", "training step", "evaluation batch")
    first = paper["model"] + min(paper["training step"], paper["evaluation batch"])  # a model is built for a part
    if not budget.admit(f"{label} ({', '.join(parts)})", "model", first):
        row["skipped"] = list(parts)
        return row

    def failed(part: str, exc: Exception) -> None:
        traceback.print_exc(file=sys.stderr)
        row["failures"].append(f"{part}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        print(f"  {part}: FAILED ({row['failures'][-1]})", flush=True)

    def run_part(part: str, measure, shown=lambda out: "") -> None:
        """One part, if the budget admits it: its figures into ``row``, a failure named, not raised."""
        if not budget.admit(f"{label} {part}", part, paper[part]):
            row["skipped"].append(part)
            return
        began, memory.last = time.perf_counter(), None
        try:
            row["measured"][part] = out = measure()
            budget.record(part, paper[part], out["seconds"])
            row["failures"] += out["failures"]
            print(f"  {part}{shown(out)}: {out['seconds']:.1f} s ({paper[part]:.1f} s on paper){_memory_shown(out)}", flush=True)
        except Exception as exc:
            # How long it ran before failing: a lower bound the budget does not learn from
            # (an out-of-memory error may come at any point of the part).
            row.setdefault("failed_after_s", {})[part] = time.perf_counter() - began
            failed(part, exc)
            reached = ""
            if memory.last is not None:  # the peaks it reached before failing (CUDA only)
                from matrixrl.gpu_memory import gib

                row.setdefault("failed_peaks_bytes", {})[part] = {"allocated": memory.last[0], "reserved": memory.last[1]}
                reached = f"; peaks reached: allocated {gib(memory.last[0])} GiB, reserved {gib(memory.last[1])} GiB"
            print(f"  {part}: failed after {row['failed_after_s'][part]:.1f} s ({paper[part]:.1f} s on paper){reached}", flush=True)
        save(row)

    memory = DeviceMemory(cuda)
    policy = tokenizer = None
    try:
        began = time.perf_counter()
        random_shaped_model(folder, fields, seed=0, dtype="bfloat16", device=device)
        memory.baseline()
        policy, tokenizer = load_shape_policy(train_spec, name, device)
        measured = time.perf_counter() - began
        row["measured"]["model"] = {"seconds": measured}
        budget.record("model", paper["model"], measured)
        print(f"  model: built, saved and loaded in {measured:.1f} s ({paper['model']:.1f} s on paper)", flush=True)

        run_part("training step", lambda: training_part(train_spec, train_found, fields, device, policy, tokenizer, memory, peak))

        same = (eval_spec.cell.workflow, eval_spec.cell.policy) == (train_spec.cell.workflow, train_spec.cell.policy)
        if not same:  # the evaluation's own policy (other roles or sets)
            policy = None
            memory.baseline()
            policy, tokenizer = load_shape_policy(eval_spec, name, device)
        memory.release()  # the training's optimizer state and gradients
        run_part(
            "evaluation batch", lambda: evaluation_part(eval_spec, eval_found, fields, device, policy, tokenizer, memory, peak),
            shown=lambda out: f" ({out['chunk']})",
        )  # fmt: skip
        if args.profile_decode:  # not budgeted: a few seconds, asked for
            memory.release()
            try:
                chunk = evaluation_chunk(eval_spec, job_model(eval_spec, fields, device))
                row["profile"] = profile_decoding(train_spec, eval_spec, policy, tokenizer, chunk, args.profile_decode)
                print("\n".join(profile_lines(row["profile"])), flush=True)
            except Exception as exc:
                failed("decoding profile", exc)
            save(row)
    finally:
        policy = tokenizer = None
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        shutil.rmtree(folder, ignore_errors=True)
    return row


def _memory_shown(out: dict) -> str:
    """A part's measured peaks against its estimate, for its progress line ('' on CPU)."""
    check = out.get("memory_check") or {}
    if check.get("allocated_bytes") is None:
        return ""
    from matrixrl.gpu_memory import gib

    return (f"; allocated {gib(check['allocated_bytes'])} of the estimate's tensors {gib(check['estimate_tensors_bytes'])} GiB, "
            f"reserved {gib(check['reserved_bytes'])} of its total {gib(check['estimate_total_bytes'])} GiB")  # fmt: skip


def training_part(spec, found, fields: dict, device: str, policy, tokenizer, memory: DeviceMemory, peak) -> dict:
    """The training step run and checked: throughput, MFU, memory against ``found``."""
    from matrixrl.gpu_memory import job_model

    n = flop_parameters(job_model(spec, fields, device))
    began = time.perf_counter()
    out = run_training(spec, policy, tokenizer, memory, found)
    out["seconds"] = time.perf_counter() - began
    out["rollout_tok_s"] = out["completion_tokens"] / out["rollout_s"]
    out["update_tok_s"] = out["update_tokens"] / out["update_s"]
    out["mfu"] = {
        "rollout": mfu(generate_flops(n, out["processed_tokens"]), out["rollout_s"], peak),
        "update": mfu(update_flops(n, out["update_tokens"], spec.policies.adapter), out["update_s"], peak),
    }
    out["memory_check"], failures = memory_check("training", out.pop("memory"), found)
    out["failures"] += failures
    return out


def evaluation_part(spec, found, fields: dict, device: str, policy, tokenizer, memory: DeviceMemory, peak) -> dict:
    """The evaluation batch run and checked: throughput, MFU, memory against ``found``."""
    from matrixrl.gpu_memory import job_model

    model = job_model(spec, fields, device)
    chunk = evaluation_chunk(spec, model)
    out = run_evaluation(spec, policy, tokenizer, chunk, memory, found)
    out["chunk"] = f"the {chunk.kind} call: {chunk.rows} rows × {chunk.prompt:,} + {spec.eval.max_new_tokens:,} tokens"
    if out["chunk"].removeprefix("the ") not in found.at:  # the batch run is the one at the estimate's peak
        out["failures"].append(f"the evaluation batch run ({out['chunk']}) is not where the estimate's peak is ({found.at})")
    out["tok_s"] = out["completion_tokens"] / out["seconds"]
    out["mfu"] = mfu(generate_flops(flop_parameters(model), out["processed_tokens"]), out["seconds"], peak)
    out["memory_check"], failures = memory_check("evaluation", out.pop("memory"), found)
    out["failures"] += failures
    return out


def profile_decoding(train_spec, eval_spec, policy, tokenizer, chunk: Replayed, steps: int) -> dict:
    """Where a decoding step's time goes (``--profile-decode N``): the evaluation batch's call
    (``chunk``) decoded with each sampler, the training's (entropies and log-probabilities
    recorded) and the evaluation's (keyed), on the same policy, rows and prompts, uncapped. Per
    step, from calls of N and 2N steps (their difference leaves the prefill out; each timed
    twice, the faster kept): the wall time, the ATen ops launched (``ops_launched``, as ``count_ops`` counts them) and so the host's
    time per op; and the ops taking the most time on the host, from the profiler.
    The second GPU window found a training rollout's step twice an evaluation's on the same
    call; this says whether the sampler or the conditions of the training part make it."""
    import random

    import torch

    from matrixrl.jobs.evaluate import eval_seed
    from matrixrl.train.rollout import make_generate

    prompts = call_prompts(chunk, random.Random(2))
    samplers = {
        "training sampler": dict(temperature=train_spec.train.temperature, sample=True),
        "evaluation sampler": dict(  # as run_evaluation: keyed sampling, or greedy at temperature 0
            temperature=eval_spec.eval.temperature or 1.0, sample=eval_spec.eval.temperature > 0,
            seed=eval_seed(eval_spec.cell.seed, eval_spec.train.steps) if eval_spec.eval.temperature > 0 else None,
        ),
    }  # fmt: skip
    policy.train(False)
    out = {"call": f"the {chunk.kind} call: {chunk.rows} rows × {chunk.prompt:,} tokens", "steps": steps}
    for name, how in samplers.items():

        def run(n: int):
            torch.manual_seed(0)
            return make_generate(policy, HiddenEos(tokenizer), max_new_tokens=n, batch_size=chunk.rows, **how)(chunk.role, prompts)

        run(2)  # warm: cuBLAS handles, Triton's compilation, the allocator's segments
        seconds, ops = {}, {}
        for n in (steps, 2 * steps):
            seconds[n] = math.inf
            for _ in range(2):  # the faster of two: the difference of two noisy times is noisier
                synchronize(policy.device)
                began = time.perf_counter()
                run(n)
                synchronize(policy.device)
                seconds[n] = min(seconds[n], time.perf_counter() - began)
            ops[n] = ops_launched(lambda: run(n))
        activities = [torch.profiler.ProfilerActivity.CPU]
        if policy.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            run(2 * steps)
        step_s = (seconds[2 * steps] - seconds[steps]) / steps
        step_ops = (ops[2 * steps] - ops[steps]) / steps
        top = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:8]
        out[name] = {
            "step_ms": step_s * 1e3, "ops_per_step": step_ops, "us_per_op": step_s / step_ops * 1e6 if step_ops else None,
            "top_self_cpu": [
                {"op": e.key, "calls": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3} for e in top
            ],
        }  # fmt: skip
    return out


def profile_lines(found: dict) -> list[str]:
    """``profile_decoding``'s figures, a line per sampler and its top ops."""
    lines = [f"  decoding profile ({found['call']}, {found['steps']} and {2 * found['steps']} steps):"]
    for name in ("training sampler", "evaluation sampler"):
        f = found[name]
        per_op = f"{f['us_per_op']:.1f} µs an op" if f["us_per_op"] else "no ops counted"
        lines.append(f"    {name}: {f['step_ms']:.1f} ms a step, {f['ops_per_step']:,.0f} ops a step ({per_op}); on the host, most: "
                     + ", ".join(f"{t['op']} {t['self_cpu_ms']:.0f} ms/{t['calls']}" for t in f["top_self_cpu"][:5]))  # fmt: skip
    return lines


SHAPE_COLUMNS = (
    ("shape", 14), ("model s", 7), ("train s", 7), ("eval s", 6), ("rollout tok/s", 13), ("update tok/s", 12),
    ("eval tok/s", 10), ("MFU roll/upd/eval", 17), ("params changed", 40), ("train GiB alloc/est", 19),
    ("train GiB resv/total", 20), ("eval GiB alloc/est", 18), ("eval GiB resv/total", 19), ("result", 7),
    ("logp gap mean by role", 0),
)  # fmt: skip


def _memory_cells(check: dict | None) -> tuple[str, str]:
    """(allocated/estimated tensors (ratio), reserved/estimated total) in GiB; n/a where not measured (CPU)."""
    from matrixrl.gpu_memory import gib

    if check is None:
        return "skipped", "skipped"
    tensors, total = check["estimate_tensors_bytes"], check["estimate_total_bytes"]
    if check["allocated_bytes"] is None:
        return f"n/a/{gib(tensors)}", f"n/a/{gib(total)}"
    allocated, reserved = check["allocated_bytes"], check["reserved_bytes"]
    return f"{gib(allocated)}/{gib(tensors)} ({allocated / tensors:.2f})", f"{gib(reserved)}/{gib(total)}"


def shape_formatted(row: dict, cuda: bool) -> str:
    measured = row["measured"]
    train, evaluation = measured.get("training step"), measured.get("evaluation batch")
    unknown = "n/a" if cuda else "n/a (CPU)"

    def fraction(value):
        return f"{value:.1%}" if value is not None else "-"

    mfus = [*(train["mfu"].values() if train else [None, None]), evaluation["mfu"] if evaluation else None]
    train_memory = _memory_cells(train["memory_check"] if train else None)
    eval_memory = _memory_cells(evaluation["memory_check"] if evaluation else None)
    shown = {
        "shape": row["shape"],
        "model s": f"{measured['model']['seconds']:.1f}" if "model" in measured else "skipped",
        "train s": f"{train['seconds']:.1f}" if train else "skipped",
        "eval s": f"{evaluation['seconds']:.1f}" if evaluation else "skipped",
        "rollout tok/s": f"{train['rollout_tok_s']:,.0f}" if train else "-",
        "update tok/s": f"{train['update_tok_s']:,.0f}" if train else "-",
        "eval tok/s": f"{evaluation['tok_s']:,.0f}" if evaluation else "-",
        "MFU roll/upd/eval": "/".join(map(fraction, mfus)) if any(m is not None for m in mfus) else unknown,
        "params changed": train["changed"] if train else "-",
        "train GiB alloc/est": train_memory[0], "train GiB resv/total": train_memory[1],
        "eval GiB alloc/est": eval_memory[0], "eval GiB resv/total": eval_memory[1],
        "result": "FAILED" if row["failures"] else ("skipped" if len(row["skipped"]) == 3 else "ok"),
        "logp gap mean by role": ", ".join(f"{role} {g['mean']:.2e}" for role, g in train["logp_gap"].items()) if train else "-",
    }  # fmt: skip
    return _table_line(shown, SHAPE_COLUMNS)


def _table_line(shown: dict, columns) -> str:
    cells = []
    for i, (name, width) in enumerate(columns):
        cells.append(f"{shown[name]:{width}s}" if i == 0 else f"{shown[name]:>{width}s}")
    return "  ".join(cells).rstrip()


def write_json(path: Path | None, payload: dict) -> None:
    if path is None:
        return
    import json

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1, default=str) + "\n")


def shape_names(value: str) -> list[str]:
    names = list(SHAPES) if value == "all" else [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n not in SHAPES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{value!r}: give all, or shapes among {', '.join(SHAPES)} (comma-separated)")
    return names


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="the cases' model: a model folder or a cached hub id (default: on a GPU converted SmolLM2 if present, else a random tiny chat model)")
    parser.add_argument("--steps", type=int, default=2, help="training steps per case")
    parser.add_argument("--dtype", choices=("bfloat16", "float32", "auto"), default="bfloat16", help="the cases' compute dtype")
    parser.add_argument("--new", type=int, default=8, help="max_new_tokens of the cases' training and evaluation")
    parser.add_argument("--problems", type=int, default=4, help="evaluation problems of a case (2 samples each)")
    parser.add_argument("--device", choices=("auto", "cpu"), default="auto", help="auto: the GPU when one is visible")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the GPU's peak (default: bench/gpu.py's table)")
    parser.add_argument("--only", default=None, help="run the cases whose name contains this (e.g. 'voting shared')")
    parser.add_argument("--shape", type=shape_names, default=None, help=f"the paper's shapes to run: all, or some of {', '.join(SHAPES)} (comma-separated)")
    parser.add_argument("--cases", action="store_true", help="with --shape: run the cases too (first)")
    parser.add_argument("--dry", action="store_true", help="print each shape's estimates and time on paper; build and run nothing")
    parser.add_argument("--budget-s", type=float, default=None, help="skip, with a line, each part whose expected time exceeds what is left")
    parser.add_argument("--json", type=Path, default=None, help="write every figure to this JSON file")
    parser.add_argument("--profile-decode", type=int, default=0, metavar="N", help="with --shape: after each shape's parts, profile N decoding steps under each sampler (profile_decoding)")
    parser.add_argument("--config", type=Path, default=PAPER, help="the config whose plan names each shape's largest jobs")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a setting of --config (as matrixrl's --set)")
    parser.add_argument("--scale-down", type=int, default=1, help="divide the shapes' widths, layers and vocabulary (CPU tests)")
    parser.add_argument("--gpu", default="H200", help="--dry: the GPU of bench/gpu.py's tables to count with")
    parser.add_argument("--host-us-per-op", type=float, default=HOST_OP_S * 1e6, help="host µs per ATen op, on paper")
    args = parser.parse_args(argv)
    if args.dry:
        args.shape = args.shape or list(SHAPES)
    return args


def main() -> None:
    args = parse_args()
    warnings.filterwarnings("ignore")
    if args.dry:
        write_json(args.json, dry_run(args, args.shape))
        return

    from matrixrl.models.devices import allocator_defaults

    allocator = allocator_defaults()  # as a GPU job sets it, before CUDA starts (it reads them then)
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    cuda = args.device == "auto" and torch.cuda.is_available()
    threads = torch.get_num_threads()
    name = torch.cuda.get_device_name() if cuda else "cpu"
    peak = args.peak_tflops or (peak_tflops(name) if cuda else None)
    hw = Hardware.of(name, cuda, peak=args.peak_tflops, host_op_s=args.host_us_per_op * 1e-6)
    budget = Budget(args.budget_s)
    cases = args.shape is None or args.cases
    print(f"device: {name}; {f'compute dtype {args.dtype}; ' if cases else ''}torch {torch.__version__}; "
          f"peak {f'{peak:.0f} TFLOP/s' if peak else 'unknown'}")  # fmt: skip
    expandable = expandable_segments(torch) if cuda else None
    if cuda:  # the caching allocator's settings decide the reserved peaks (docs/performance.md)
        print(f"allocator: {allocator}; segments {'expandable' if expandable else 'fixed'} (as a GPU job's)")
    if args.budget_s is not None:
        print(f"budget: {args.budget_s:g} s; expected times on paper for {hw.line()}, then as measured so far")
    payload: dict = {
        "device": name, "torch": torch.__version__, "peak_tflops": peak, "budget_s": args.budget_s, "hardware": hw.__dict__,
        "alloc_conf": allocator, "expandable_segments": expandable,
    }  # fmt: skip
    failed_cases = failed_shapes = 0
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if cases:
            rows = run_cases(args, tmp, cuda, peak, budget)
            payload["cases"] = rows
            failed_cases = sum(bool(r.get("failures", True)) for r in rows if not r.get("skipped"))
            write_json(args.json, {**payload, "skipped": budget.skipped})
        if args.shape:
            print(f"shapes: {_shown_path(args.config)}'s largest training step and evaluation batch per shape, each once, "
                  "on a random model: it does not stop early (its EOS is hidden from the decoder, as in bench/gpu_memory.py), "
                  "so every row runs to max_new_tokens", flush=True)  # fmt: skip
            if not cuda:
                print("no CUDA here: skipped for every shape: the memory peaks (allocated and reserved) and MFU")
            shapes = []

            def save(partial: dict) -> None:  # the shapes done and the current one's row so far
                write_json(args.json, {**payload, "shapes": [*shapes, partial], "skipped": budget.skipped})

            for shape in args.shape:
                try:
                    row = run_shape(shape, args, cuda, hw, peak, budget, tmp, save)
                except Exception as exc:  # one shape's failure is a row; the others still run
                    traceback.print_exc(file=sys.stderr)
                    error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                    row = {"shape": shape_label(shape, args.scale_down), "error": error, "measured": {}, "skipped": [],
                           "failures": [f"stopped: {error}"]}  # fmt: skip
                finally:
                    torch.set_num_threads(threads)
                shapes.append(row)
                payload["shapes"] = shapes
                write_json(args.json, {**payload, "skipped": budget.skipped})
            print("  ".join(f"{n:>{w}s}" if i else f"{n:{w}s}" for i, (n, w) in enumerate(SHAPE_COLUMNS)))
            for row in shapes:
                print(shape_formatted(row, cuda) if "error" not in row else f"{row['shape']:14s}  FAILED: {row['error']}")
            failed_shapes = sum(bool(r["failures"]) for r in shapes)
            ran = [r for r in shapes if not r["failures"] and len(r["skipped"]) < 3]
            print(f"shapes: {len(ran)} passed, {failed_shapes} failed, {len(shapes) - len(ran) - failed_shapes} skipped"
                  + (f"; parts skipped: {len(budget.skipped)}" if budget.skipped else ""))  # fmt: skip
            for row in shapes:
                for failure in row["failures"]:
                    print(f"  {row['shape']}: {failure}")
    write_json(args.json, {**payload, "skipped": budget.skipped})
    if failed_cases or failed_shapes:
        raise SystemExit(1)


def expandable_segments(torch) -> bool:
    """Whether the caching allocator's segments grow in place (what its settings made of
    ``expandable_segments``): read from a segment it reserves now."""
    probe = torch.empty(1, device="cuda")
    found = any(segment.get("is_expandable", False) for segment in torch.cuda.memory._snapshot()["segments"])
    del probe
    return found


@contextlib.contextmanager
def torch_log_softmax():
    """TRL's log-probabilities and entropies on its torch path, not its Triton kernel (which
    it takes on CUDA: docs/performance.md, "TRL's Triton log-softmax")."""
    from trl.trainer import utils

    kept = utils._supports_trl_loss_kernel
    utils._supports_trl_loss_kernel = lambda *args, **kwargs: False
    try:
        yield
    finally:
        utils._supports_trl_loss_kernel = kept


@contextlib.contextmanager
def math_attention():
    """Attention through SDPA's reference (math) kernel, not the fused flash or memory-efficient ones."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):
        yield


DIVERGENCE_VARIANTS = {
    "torch log-softmax": ((torch_log_softmax,), None),
    "math attention": ((math_attention,), None),
    "both": ((torch_log_softmax, math_attention), None),
    "float32": ((), "float32"),
}
"""A case whose training diverges on CUDA is trained again under each of these (contexts, and
a compute dtype in place of ``--dtype``): the table then names the GPU-only path that makes
the NaN, so one GPU window finds it."""


def divergence_variants(case: str, model: str, args, folder: Path) -> dict[str, str]:
    """Each of ``DIVERGENCE_VARIANTS``: does the case's training still diverge under it?"""
    import copy

    from matrixrl.errors import DivergedError
    from matrixrl.train.trainer import train_cell

    workflow, policy, adapter = case.split()
    outcomes = {}
    for k, (name, (contexts, dtype)) in enumerate(DIVERGENCE_VARIANTS.items()):
        varied = copy.copy(args)
        varied.dtype = dtype or args.dtype
        where = folder / str(k)
        where.mkdir(parents=True)
        try:
            with contextlib.ExitStack() as stack:
                for context in contexts:
                    stack.enter_context(context())
                train_cell(case_spec(model, workflow, policy, adapter, varied, where), where, where / "cell", log=lambda m: None)
            outcomes[name] = "trains"
        except DivergedError:
            outcomes[name] = "diverges"
        except Exception as exc:
            outcomes[name] = type(exc).__name__
    return outcomes


def run_cases(args, tmp: Path, cuda: bool, peak: float | None, budget: Budget) -> list[dict]:
    """Every workflow × policy × adapter case (``--only``), one row each, printed as it ends."""
    import torch

    threads = torch.get_num_threads()
    if args.model:
        model = str(Path(args.model).resolve()) if Path(args.model).is_dir() else args.model
        what = args.model
    else:
        model, what = default_model(tmp / "model", cuda)
    print(f"model: {what}; {args.steps} steps per case (2 problems x group 2, replies up to {args.new} tokens); "
          f"evaluation of {args.problems} problems x 2 samples")  # fmt: skip
    if not cuda:
        print("no CUDA here: skipped in every case: the memory peaks (torch.cuda.max_memory_allocated) and MFU")
    print("  ".join(f"{n:>{w}s}" if i else f"{n:{w}s}" for i, (n, w) in enumerate(COLUMNS)), flush=True)
    rows = []
    for i, case in enumerate(case_names(args.only)):
        workflow, policy, adapter = case.split()
        if not budget.admit(f"case {case}", "case", CASE_S):
            rows.append({"case": case, "skipped": True})
            continue
        folder = tmp / f"case{i}"
        folder.mkdir()
        began = time.perf_counter()
        try:
            row = run_case(case, case_spec(model, workflow, policy, adapter, args, folder), folder, cuda, peak)
        except Exception as exc:  # one case's failure is a row; the others still run
            traceback.print_exc(file=sys.stderr)
            row = {"case": case, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
            if cuda and type(exc).__name__ == "DivergedError":
                row["variants"] = divergence_variants(case, model, args, tmp / f"case{i}-variants")
                row["error"] += "; " + ", ".join(f"{v}: {outcome}" for v, outcome in row["variants"].items())
        finally:
            torch.set_num_threads(threads)  # each job sets its own
        budget.record("case", CASE_S, time.perf_counter() - began)
        rows.append(row)
        print(formatted(row, cuda), flush=True)
    ran = [r for r in rows if not r.get("skipped")]
    failed = [r for r in ran if r.get("failures", True)]
    skipped = len(rows) - len(ran)
    if not failed:
        print(f"all {len(ran)} cases passed" + (f" ({skipped} skipped)" if skipped else "") if ran else f"no case ran ({skipped} skipped)")
        return rows
    print(f"{len(failed)} of {len(ran)} cases failed:")
    for r in failed:
        for failure in r.get("failures") or [r["error"]]:
            print(f"  {r['case']}: {failure}")
    return rows


if __name__ == "__main__":
    main()
