"""The paper's shapes on one GPU: each shape's largest training step and evaluation batch, run once and checked.

    python bench/gpu_smoke.py --shape all [--budget-s N] [--json PATH]   # Qwen3-0.6B, -1.7B, -4B
    python bench/gpu_smoke.py --shape all --dry [--decoder eager]         # on paper, in seconds

For each shape (``SHAPES``: the published config.json, random weights, a stand-in tokenizer of
the real vocabulary, nothing downloaded), examples/paper.yaml's plan names the largest training
and evaluation job as ``matrixrl plan`` does; the training step replays that cell's ``generate``
calls as the memory estimate plans them, then its update, every turn learning; the evaluation
batch decodes the chunk at the estimate's peak. Checked: every trained tensor moved (under LoRA
every ``lora_B``, no base weight), the log-prob gap per role under ``GAP_LIMIT``, every row to
``max_new_tokens``, on CUDA the memory peaks against the estimate. ``--dry`` prints the estimates
and the time on paper (bench/gpu_timing.py) without importing torch; ``--budget-s`` skips
a part that would not fit what is left. The workflow × policy × adapter cases are pytest tests
(``pytest -m gpu tests/test_gpu_smoke.py``). docs/performance.md, "GPU smoke test".
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).parent))  # bench/gpu.py, bench/gpu_memory.py, bench/gpu_timing.py
sys.path.append(str(REPO / "tests"))  # chat_models.py, gpu_checks.py

from gpu import generate_flops, mfu, peak_tflops, synchronize, update_flops  # noqa: E402
from gpu_checks import DeviceMemory, gap_failures, memory_check, parameter_snapshot, parameters_moved  # noqa: E402
from gpu_memory import HiddenEos  # noqa: E402

from gpu_timing import (  # noqa: E402
    HOST_OP_S, Hardware, Replayed, Work, evaluation_chunk, evaluation_work, flop_parameters, training_calls, training_work,
)


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

DISK_BYTES_S = 1e9
"""Bytes per second of writing a random model's safetensors and of loading them again."""
HOST_COPY_BYTES_S = 5e9
"""Bytes per second of copying the parameters to the host and comparing them there."""
TOKENIZER_S = 2.0
"""Building, saving and loading the stand-in tokenizer of 151,936 tokens (measured on CPU: about 1.5 s)."""
CPU_TFLOPS, CPU_BYTES_S = 0.05, 10e9
"""Nominal figures of a CPU (a few cores), for ``--budget-s`` where no GPU runs."""


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


def largest_jobs(config, scale: str, fields: dict, device: str, gpu: int | None) -> dict:
    """The largest training and evaluation job of ``scale`` as ``matrixrl plan`` picks them
    (matrixrl.gpu_memory.fits.largest_jobs: the largest estimate over the grid's cells, the
    first of equals), with the model's ``fields``, on a GPU of ``gpu`` bytes: job → (spec, Estimate)."""
    from matrixrl import grid as G
    from matrixrl.gpu_memory import estimate

    found: dict = {}
    for cell in G.runs(config):
        if cell.scale != scale:
            continue
        spec = G.cell_spec(config, cell)
        for job in ("training", "evaluation"):
            held = estimate(spec, job, config=fields, device=device, gpu=gpu)
            if job not in found or held.total > found[job][1].total:
                found[job] = (spec, held)
    return found


# --- what runs and its time on paper ----------------------------------------------------------------


def call_prompts(call: Replayed, rng) -> list[str]:
    """``call.rows`` prompts of ``call.prompt`` tokens, ``call.distinct`` of them distinct, each
    repeated over consecutive rows (a group's); the first is one token shorter, so that the call
    runs with a padding mask, as prompts of different lengths do."""
    texts = []
    for i in range(call.distinct):
        length = call.prompt - 1 if i == 0 and call.distinct > 1 else call.prompt
        texts.append("".join(rng.choices(PROMPT_CHARACTERS, k=length)))
    return [texts[j * call.distinct // call.rows] for j in range(call.rows)]


def hardware(name: str, cuda: bool, peak: float | None = None, host_op_s: float = HOST_OP_S, graphs: bool = True) -> Hardware:
    """The figures the time on paper counts with: bench/gpu.py's tables for a GPU (nominal where
    unknown); nominal figures on CPU, which decodes eagerly."""
    from gpu import peak_bandwidth

    if not cuda:
        return Hardware("cpu", (peak or CPU_TFLOPS) * 1e12, CPU_BYTES_S, host_op_s, overlap=False, nominal=True, graphs=False)
    tflops, bandwidth = peak or peak_tflops(name), peak_bandwidth(name)
    unknown = tflops is None or bandwidth is None
    return Hardware(name, (tflops or 100.0) * 1e12, bandwidth or 1e12, host_op_s, nominal=unknown, graphs=graphs)


def model_work(fields: dict) -> Work:
    """Building the random model and its tokenizer, saving them (bfloat16) and loading them once."""
    from matrixrl.disk import decoder_shape

    work = Work(moved=decoder_shape(fields).parameters * 2)
    work.seconds = TOKENIZER_S + 2 * work.moved / DISK_BYTES_S
    work.what = f"random weights, {work.moved / 1e9:.3g} GB in bfloat16 written and read, and the tokenizer"
    return work


def shape_plan(config, name: str, fields: dict, hw: Hardware, device: str, gpu: int | None) -> dict:
    """Shape ``name``'s largest jobs, their estimates and the time on paper of its three parts."""
    from matrixrl.gpu_memory import job_model

    jobs = largest_jobs(config, name, fields, device, gpu)
    (train_spec, train_found), (eval_spec, eval_found) = jobs["training"], jobs["evaluation"]
    model = job_model(train_spec, fields, device, merged=train_found.merged)
    training = training_work(hw, train_spec, model, train_found.micro_batch_tokens)
    frozen = 0 if model.full else model.shape.parameters * model.compute  # the check's copies, compared on the host
    training.seconds += 2 * (model.sets * model.trained * 4 + frozen) / HOST_COPY_BYTES_S
    evaluation = evaluation_work(hw, eval_spec, job_model(eval_spec, fields, device, merged=eval_found.merged))
    return {"jobs": jobs, "paper": {"model": model_work(fields), "training step": training, "evaluation batch": evaluation}}


def estimate_dict(found) -> dict:
    parts = found.parts
    return {
        "cell": found.cell, "total_bytes": found.total, "tensors_bytes": found.tensors, "parts_bytes": dict(parts),
        "dominant": max(parts, key=parts.__getitem__), "peak_at": found.at,
    }  # fmt: skip


def estimate_line(job: str, found) -> str:
    """``training: CELL: 42.7 GiB (tensors 37.9 GiB), mostly the KV cache (34.1 GiB), at PHASE``."""
    from matrixrl.gpu_memory import gib
    from matrixrl.gpu_memory.fits import unmerged_note

    dominant = max(found.parts, key=found.parts.__getitem__)
    return (
        f"{job}: {found.cell}: {gib(found.total)} GiB (tensors {gib(found.tensors)} GiB), mostly {dominant} "
        f"({gib(found.parts[dominant])} GiB), at {found.at}{unmerged_note(found)}"
    )


def dry_run(args, names: list[str]) -> dict:
    """Each shape's estimates and time on paper, nothing built or run (torch is not imported)."""
    hw = hardware(args.gpu, True, args.peak_tflops, args.host_us_per_op * 1e-6, graphs=args.decoder == "engine")
    config = paper_config(args.config, args.set)
    print(f"{_shown_path(args.config)} on paper for one {hw.line()}: each shape's largest training and evaluation "
          "job as `matrixrl plan` picks them; nothing is built or run")  # fmt: skip
    out = {"dry": True, "hardware": hw.__dict__, "config": str(args.config), "shapes": {}}
    total = {}
    for name in names:
        fields = shape_fields(name, args.scale_down)
        label = shape_label(name, args.scale_down)
        plan = shape_plan(config, name, fields, hw, "cuda", int(args.gpu_memory_gib * (1 << 30)))
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
    print(f"on paper in all: {sum(total.values()):,.0f} s ({each})")
    if args.budget_s is not None:
        papers = {label: {part: work["seconds"] for part, work in shape["paper"].items()} for label, shape in out["shapes"].items()}
        out["budget"] = budget_on_paper(args.budget_s, papers)
    return out


def budget_on_paper(seconds: float, papers: dict[str, dict[str, float]]) -> dict:
    """What ``--budget-s`` would run and skip if every part took its time on paper: the run's
    order and admissions (``run_shape``) on a clock that advances by those times."""
    now = [0.0]
    budget = Budget(seconds, clock=lambda: now[0])

    def ran(kind: str, paper: float) -> None:
        now[0] += paper
        budget.record(kind, paper, paper)

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


def _shown_path(path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


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


def run_training(spec, policy, tokenizer, memory: DeviceMemory, found) -> dict:
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
            micro_batch_tokens=found.micro_batch_tokens,  # the estimate's, ``auto`` resolved for this GPU
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
    from matrixrl.models.hf import resolve_dtype

    fields, label = shape_fields(name, args.scale_down), shape_label(name, args.scale_down)
    folder = tmp / name
    folder.mkdir()  # the config's path must be a folder; the model is saved there once the budget admits it
    device = "cuda" if cuda else "cpu"
    config = paper_config(args.config, args.set, {name: folder})
    gpu = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory if cuda else None
    plan = shape_plan(config, name, fields, hw, device, gpu)
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
    parser.add_argument("--device", choices=("auto", "cpu"), default="auto", help="auto: the GPU when one is visible")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the GPU's peak (default: bench/gpu.py's table)")
    parser.add_argument("--shape", type=shape_names, default=None, help=f"the paper's shapes to run: all, or some of {', '.join(SHAPES)} (comma-separated)")
    parser.add_argument("--dry", action="store_true", help="print each shape's estimates and time on paper; build and run nothing")
    parser.add_argument("--budget-s", type=float, default=None, help="skip, with a line, each part whose expected time exceeds what is left")
    parser.add_argument("--json", type=Path, default=None, help="write every figure to this JSON file")
    parser.add_argument("--config", type=Path, default=PAPER, help="the config whose plan names each shape's largest jobs")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a setting of --config (as matrixrl's --set)")
    parser.add_argument("--scale-down", type=int, default=1, help="divide the shapes' widths, layers and vocabulary (CPU tests)")
    parser.add_argument("--gpu", default="H200", help="--dry: the GPU of bench/gpu.py's tables to count with")
    parser.add_argument("--gpu-memory-gib", type=float, default=140.4, help="--dry: its memory (an H200: 143,771 MiB by nvidia-smi)")
    parser.add_argument("--decoder", choices=("engine", "eager"), default="engine", help="price decoding as the engine's graph replays or the eager decoder's launches (the model before the engine)")
    parser.add_argument("--host-us-per-op", type=float, default=HOST_OP_S * 1e6, help="host µs per ATen op, on paper")
    args = parser.parse_args(argv)
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
    engine = importlib.util.find_spec("matrixrl.train.engine") is not None  # the decoder this checkout has
    hw = hardware(name, cuda, args.peak_tflops, args.host_us_per_op * 1e-6, graphs=args.decoder == "engine" and engine)
    budget = Budget(args.budget_s)
    print(f"device: {name}; torch {torch.__version__}; peak {f'{peak:.0f} TFLOP/s' if peak else 'unknown'}")
    expandable = expandable_segments(torch) if cuda else None
    if cuda:  # the caching allocator's settings decide the reserved peaks (docs/performance.md)
        print(f"allocator: {allocator}; segments {'expandable' if expandable else 'fixed'} (as a GPU job's)")
    if args.budget_s is not None:
        print(f"budget: {args.budget_s:g} s; expected times on paper for {hw.line()}, then as measured so far")
    payload: dict = {
        "device": name, "torch": torch.__version__, "peak_tflops": peak, "budget_s": args.budget_s, "hardware": hw.__dict__,
        "alloc_conf": allocator, "expandable_segments": expandable,
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
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
    if failed_shapes:
        raise SystemExit(1)


def expandable_segments(torch) -> bool:
    """Whether the caching allocator's segments grow in place (what its settings made of
    ``expandable_segments``): read from a segment it reserves now."""
    probe = torch.empty(1, device="cuda")
    found = any(segment.get("is_expandable", False) for segment in torch.cuda.memory._snapshot()["segments"])
    del probe
    return found


if __name__ == "__main__":
    main()
