"""The GPU memory estimate (matrixrl.gpu_memory) against measured peaks, and on paper for Qwen3.

Validation (default): real training steps (``grpo_step``, two of them: the second holds
the first's gradients and optimizer state, as every later step does) and real
evaluations (``make_generate`` at the evaluation's batch, ``workflow.run`` over the
evaluation set) of a tiny scale (random init, compact prompts, float32) and of
SmolLM2-135M-Instruct (chat prompts, bfloat16 autocast on CPU unless the case says
float32), on CPU, one thread. The measured peak is that of live tensor memory: the
bytes of the policy's weights (and reference) when the job starts, plus the highest
running sum of every allocation and free torch's profiler records (``profile_memory``)
over the job (on CPU, 16-bit output layers read a contiguous input, as on a GPU:
``matrixrl.models.hf._contiguous_input``). Each case is measured where the estimate's
worst case holds: every reply runs to ``max_new_tokens`` (the tokenizer's EOS is hidden
from the decoder) and every turn learns (rewards alternate within each group, so every
advantage is non-zero).

The table gives, in MiB (2^20 bytes), the estimate of the tensors (no CUDA runtime:
this is CPU), the measured peak, their ratio, the estimate with the prompt lengths the
run measured (the memory model alone, without the prompt-length assumptions) and its
ratio, and where the estimate puts the peak.

    python bench/gpu_memory.py                 # tiny and SmolLM2 cases (SmolLM2: a few minutes)
    python bench/gpu_memory.py --cases tiny    # tiny cases only (seconds)
    python bench/gpu_memory.py --paper         # the Qwen3 table of docs/real-models.md, on paper
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import tempfile
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent
QWEN3_CONFIGS = REPO / "tests" / "fixtures" / "qwen3_configs.json"
PAPER = REPO / "examples" / "paper.yaml"
GPUS = {"80 GB": 81_559 * 2**20, "141 GB": 143_771 * 2**20}
"""What nvidia-smi reports as memory.total (MiB) of an H100 80GB and of an H200 141GB."""


# --- measuring ------------------------------------------------------------------------------


class LiveTensors:
    """Live tensor bytes over a region: torch's profiler records every allocation and free
    with ``profile_memory``; their running sum, plus what was live before, is the live
    memory. Only the blocks allocated in the region count: the CPU allocator also reports
    the free of a block allocated under an earlier profiler (one an earlier measurement left
    in a reference cycle that the garbage collector frees here), which would take its bytes
    off this region's sum. Allocations made before the region and freed in it go
    unrecorded too, so the region starts before anything the job allocates (only the loaded
    weights precede it)."""

    def __enter__(self):
        from torch.profiler import ProfilerActivity, profile

        self.profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self.profiler.__enter__()
        return self

    def __exit__(self, *exc):
        self.profiler.__exit__(*exc)
        self.peak = peak_of(allocations(self.profiler.profiler.kineto_results.experimental_event_tree()))


def allocations(roots) -> list[tuple[int, int, int]]:
    """(time, bytes, address) of every allocation (bytes > 0) and free (< 0) in a profiler's event tree."""
    from torch._C._profiler import _EventType

    found, stack = [], list(roots)
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation:
            found.append((node.start_time_ns, node.extra_fields.alloc_size, node.extra_fields.ptr))
    return found


def peak_of(events) -> int:
    """The highest running sum of ``events``' bytes in time order, counting a free only where the
    region allocated its block (a free first where both fall on the same nanosecond)."""
    live: dict[int, int] = {}
    total = peak = 0
    for _, nbytes, address in sorted(events):
        if nbytes > 0:
            live[address] = nbytes
            total += nbytes
            peak = max(peak, total)
        else:
            total -= live.pop(address, 0)
    return peak


def tensor_bytes(modules) -> int:
    """Bytes of the distinct storages of ``modules``' parameters and buffers."""
    seen = {}
    for module in modules:
        for tensor in itertools.chain(module.parameters(), module.buffers()):
            storage = tensor.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


class HiddenEos:
    """A tokenizer whose EOS the decoder never meets: every reply runs to ``max_new_tokens``."""

    eos_token_id = -1

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer

    def __call__(self, *args, **kwargs):
        return self._tokenizer(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


def alternating_rewards(episodes, task, mode, scores=None) -> None:
    """Rewards 1, 0, 1, ... within each group: every turn's advantage is non-zero, so every agent learns."""
    seen: dict[int, int] = {}
    for episode in episodes:
        k = seen[episode.group] = seen.get(episode.group, -1) + 1
        episode.reward = float(k % 2)
        for turn in episode.turns:
            turn.reward = episode.reward


@contextlib.contextmanager
def recording_prompts(workflow, longest: dict):
    """Record the longest prompt (tokens) of each kind ``workflow.run`` sends to ``generate``."""
    original = workflow.run

    def run(problems, groups, generate):
        calls: dict[str, int] = {}

        def recorded(role, prompts):
            completions = generate(role, prompts)
            calls[role] = calls.get(role, 0) + 1  # eval_opt's later generator calls are refines
            kind = "refine" if workflow.name == "eval_opt" and role == "generator" and calls[role] > 1 else role
            longest[kind] = max(longest.get(kind, 0), max(len(c.prompt_ids) for c in completions))
            return completions

        return original(problems, groups, recorded)

    workflow.run = run
    try:
        yield longest
    finally:
        workflow.run = original


@dataclass(frozen=True)
class Case:
    name: str
    model: str  # "tiny" or "smollm2"
    workflow: str
    policy: str
    adapter: str
    job: str  # "training" or "evaluation"
    dtype: str = "bfloat16"  # SmolLM2's compute dtype
    train: dict = field(default_factory=dict)
    eval: dict = field(default_factory=dict)
    lora: dict = field(default_factory=dict)


TINY_TRAIN = {"problems_per_step": 8, "group_size": 8, "max_new_tokens": 32, "steps": 2, "eval_every": 1}
TINY_EVAL = {"max_new_tokens": 32, "samples": 2}
# SmolLM2 computes in bfloat16, which CPUs without native bfloat16 (AVX2 only) run 4-8 times
# slower than float32: its cases are as small as still shows each peak (one problem a step; 8
# evaluation problems), so that CI can afford them.
SMOL_TRAIN = {"problems_per_step": 1, "group_size": 4, "max_new_tokens": 24, "steps": 2, "eval_every": 1}
SMOL_EVAL = {"max_new_tokens": 24, "samples": 2}
ALL_PROJECTIONS = {"rank": 8, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}

CASES = (
    Case("tiny single shared full", "tiny", "single", "shared", "full", "training", train=TINY_TRAIN),
    Case("tiny voting shared full", "tiny", "voting", "shared", "full", "training", train=TINY_TRAIN),
    Case("tiny voting isolated full", "tiny", "voting", "isolated", "full", "training", train=TINY_TRAIN),
    Case("tiny eval_opt isolated lora", "tiny", "eval_opt", "isolated", "lora", "training", train=TINY_TRAIN),
    Case(
        "tiny orch_workers shared lora mb512", "tiny", "orch_workers", "shared", "lora", "training",
        train={**TINY_TRAIN, "micro_batch_tokens": 512}, lora=ALL_PROJECTIONS,
    ),
    Case(
        "tiny voting shared lora rollout", "tiny", "voting", "shared", "lora", "training",
        train={**TINY_TRAIN, "max_new_tokens": 96, "micro_batch_tokens": 1024},
    ),
    Case("tiny voting isolated full eval", "tiny", "voting", "isolated", "full", "evaluation", eval=TINY_EVAL),
    Case("tiny eval_opt shared lora eval", "tiny", "eval_opt", "shared", "lora", "evaluation", eval=TINY_EVAL),
    Case("smollm2 single shared lora", "smollm2", "single", "shared", "lora", "training", train=SMOL_TRAIN, lora=ALL_PROJECTIONS),
    Case("smollm2 single shared full", "smollm2", "single", "shared", "full", "training", train=SMOL_TRAIN),
    Case("smollm2 single shared full fp32", "smollm2", "single", "shared", "full", "training", dtype="float32", train=SMOL_TRAIN),
    Case("smollm2 voting isolated lora", "smollm2", "voting", "isolated", "lora", "training", train={**SMOL_TRAIN, "group_size": 2}),
    Case("smollm2 voting shared full eval", "smollm2", "voting", "shared", "full", "evaluation", eval=SMOL_EVAL),
    Case("smollm2 single shared lora eval", "smollm2", "single", "shared", "lora", "evaluation", eval=SMOL_EVAL, lora=ALL_PROJECTIONS),
)

TINY_SCALE = {
    "kind": "tiny", "hidden_size": 192, "num_layers": 3, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 384,
    "max_length": 128,
}
ARITH = {"kind": "arith", "digits": 1, "terms": 3, "n_eval": 32, "seed": 0}
SMOL_ARITH = {**ARITH, "n_eval": 8}
THREADS = 2
"""Torch's threads while measuring: the peaks are those of one thread (547,942,544 bytes either
way for smollm2 single shared lora eval), 1.7 times sooner on 2 cores."""


def case_config(case: Case, smollm2: Path | None, folder: Path, threads: int = THREADS):
    """The one-cell config of ``case``, its jobs at ``threads`` torch threads."""
    from matrixrl.config.schema import Config

    if case.model == "tiny":
        scale = TINY_SCALE
    else:
        scale = {"kind": "hf", "path": str(smollm2), "dtype": case.dtype, "device": "cpu", "prompt_style": "chat"}
    return Config.model_validate({
        "results_dir": str(folder / "results"),
        "grid": {"workflow": [case.workflow], "task": ["arith"], "scale": ["m"], "policy": [case.policy], "seed": [0]},
        "scales": {"m": scale},
        "tasks": {"arith": ARITH if case.model == "tiny" else SMOL_ARITH},
        "policies": {"adapter": case.adapter, "lora": case.lora or {}},
        "train": {"threads": threads, **case.train},
        "eval": {"threads": threads, **case.eval},
    })  # fmt: skip


def tiny_base(folder: Path) -> Path:
    """A random-init tiny model and the character tokenizer (what a prepared base folder holds)."""
    from matrixrl.config import TinyScale
    from matrixrl.models.tiny import build_char_tokenizer, build_tiny_model

    tokenizer = build_char_tokenizer()
    build_tiny_model(TinyScale(**TINY_SCALE), tokenizer, seed=0).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def measure(case: Case, spec, base: Path) -> tuple[int, dict]:
    """The measured peak of ``case``'s job (bytes) and the longest prompt of each kind (tokens)."""
    import torch

    import matrixrl.train.trainer as trainer
    from matrixrl.train.cell import build_cell
    from matrixrl.train.interventions import needs_reference

    torch.set_num_threads(spec.train.threads if case.job == "training" else spec.eval.threads)
    cell = build_cell(spec, base)
    cell = replace(cell, tokenizer=HiddenEos(cell.tokenizer))
    longest: dict[str, int] = {}
    torch.manual_seed(0)
    if case.job == "training":
        policy = cell.new_policy(reference=needs_reference(spec.train))
        held = [*policy._models(), *filter(None, [getattr(policy, "reference_model", None)])]
        before = tensor_bytes(held)
        cfg = spec.train
        original = trainer.assign_rewards
        trainer.assign_rewards = alternating_rewards
        try:
            with recording_prompts(cell.workflow, longest), LiveTensors() as live:
                run = trainer.GrpoRun(
                    seed=0, policy=policy, optimizers=trainer.make_optimizers(policy, cfg), workflow=cell.workflow,
                    task=cell.task, pad_token_id=cell.tokenizer.pad_token_id, cfg=cfg,
                    generate=cell.make_generate(
                        policy, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, sample=True,
                        **({"batch_size": cfg.rollout_batch_size} if cfg.rollout_batch_size else {}),
                    ),
                )  # fmt: skip
                for step in range(cfg.steps):
                    trainer.grpo_step(run, step)
        finally:
            trainer.assign_rewards = original
    else:
        from matrixrl.jobs.evaluate import eval_seed

        policy = cell.new_policy()
        before = tensor_bytes(policy._models())
        cfg = spec.eval
        with recording_prompts(cell.workflow, longest), LiveTensors() as live:
            generate = cell.make_generate(
                policy, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, sample=True,
                batch_size=cfg.batch_size, seed=eval_seed(0, 0),
            )  # fmt: skip
            problems = cell.task.eval_problems()
            batch = [p for p in problems for _ in range(cfg.samples)]
            cell.workflow.run(batch, [i // cfg.samples for i in range(len(batch))], generate)
    return before + live.peak, longest


def validate(names: str, smollm2: Path | None) -> list[dict]:
    """Measure and estimate every case whose model is in ``names`` ("tiny", "smollm2" or "all")."""
    from matrixrl import grid as G
    from matrixrl.gpu_memory.peak import estimate

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = tiny_base(Path(tmp) / "tiny")
        for case in CASES:
            if names not in ("all", case.model):
                continue
            config = case_config(case, smollm2, Path(tmp))
            spec = G.cell_spec(config, G.runs(config)[0])
            began = time.perf_counter()
            measured, longest = measure(case, spec, base)
            assumed = estimate(spec, case.job, device="cpu")
            known = estimate(spec, case.job, device="cpu", prompt=longest)
            rows.append({
                "case": case.name, "job": case.job, "estimate": assumed.tensors, "measured": measured,
                "with measured prompts": known.tensors, "at": assumed.at, "parts": assumed.parts, "prompts": longest,
                "seconds": time.perf_counter() - began,
            })  # fmt: skip
    return rows


def validation_table(rows: list[dict]) -> str:
    """Estimate against measurement, in MiB (2^20 bytes)."""
    lines = [
        f"{'case':37s} {'job':10s} {'estimate':>8s} {'measured':>8s} {'ratio':>5s} {'w/ prompts':>10s} {'ratio':>5s}"
        "  peak at (estimate)",
    ]
    for r in rows:
        lines.append(
            f"{r['case']:37s} {r['job']:10s} {r['estimate'] / 2**20:8.1f} {r['measured'] / 2**20:8.1f} "
            f"{r['estimate'] / r['measured']:5.2f} {r['with measured prompts'] / 2**20:10.1f} "
            f"{r['with measured prompts'] / r['measured']:5.2f}  {r['at']}"
        )
    return "\n".join(lines)


# --- on paper: Qwen3 at examples/paper.yaml's settings ---------------------------------------------


def paper_rows() -> list[dict]:
    """Each Qwen3 size under shared/isolated × LoRA/full: the workflow with the largest
    training estimate over examples/paper.yaml's workflows and tasks, its evaluation's
    largest, and the fix a refusal would give on each GPU."""
    from matrixrl import grid as G
    from matrixrl.config import load_config
    from matrixrl.gpu_memory.fits import fixes
    from matrixrl.gpu_memory.peak import estimate

    configs = json.loads(QWEN3_CONFIGS.read_text())
    base = load_config(PAPER)
    rows = []
    for scale, fields in configs.items():
        if scale.startswith("_"):
            continue
        for policy in ("shared", "isolated"):
            for adapter in ("lora", "full"):
                config = base.model_copy(update={"policies": base.policies.model_copy(update={"adapter": adapter})})
                worst = {"training": None, "evaluation": None}
                by_workflow: dict[tuple[str, str], int] = {}  # (workflow, job) → its largest total over tasks
                for cell in G.cells(config):
                    if cell.scale != scale or cell.policy != policy:
                        continue
                    spec = G.cell_spec(config, G.run_of(cell))
                    for job in worst:
                        found = estimate(spec, job, config=fields, device="cuda")
                        key = (cell.workflow, job)
                        by_workflow[key] = max(by_workflow.get(key, 0), found.total)
                        if worst[job] is None or found.total > worst[job][0].total:
                            worst[job] = (found, spec)
                row = {"scale": scale, "policy": policy, "adapter": adapter, "by workflow": by_workflow}
                for job, (found, spec) in worst.items():
                    row[job] = found
                    row[f"{job} fixes"] = {
                        gpu: fixes(spec, job, found, budget, config=fields) for gpu, budget in GPUS.items()
                    }
                rows.append(row)
    return rows


def paper_table(rows: list[dict]) -> str:
    """The markdown table of docs/real-models.md, "Memory of one job": each job's largest
    estimate (GiB) and its cell, and per GPU whether every job fits, else the fix a refusal
    names first (what saves most) for each job that does not."""
    from matrixrl.gpu_memory.peak import gib

    def verdict(row, gpu: str) -> str:
        refused = []
        for job in ("training", "evaluation"):
            if row[job].total > GPUS[gpu]:
                first = (row[f"{job} fixes"][gpu] or ["no setting: a larger GPU"])[0]
                refused.append(f"{job}: {first}")
        return "fits" if not refused else "refused; " + "; ".join(refused)

    lines = [
        "| model | policy | adapter | training GiB | its largest cell | evaluation GiB | its largest cell | 80 GB GPU | 141 GB GPU |",
        "|---|---|---|---:|---|---:|---|---|---|",
    ]
    for r in rows:
        t, e = r["training"], r["evaluation"]
        lines.append(
            f"| {r['scale']} | {r['policy']} | {r['adapter']} | {gib(t.total)} | {t.cell.split('-qwen3')[0]} | "
            f"{gib(e.total)} | {e.cell.split('-qwen3')[0]} | {verdict(r, '80 GB')} | {verdict(r, '141 GB')} |"
        )
    return "\n".join(lines)


def paper_workflow_table(rows: list[dict]) -> str:
    """Each workflow's largest estimate (GiB, over examples/paper.yaml's tasks), training then evaluation."""
    from matrixrl.gpu_memory.peak import gib

    workflows = list(dict.fromkeys(w for r in rows for w, _ in r["by workflow"]))
    head = " | ".join(f"{job[:5]}. {w}" for job in ("training", "evaluation") for w in workflows)
    lines = [f"| model | policy | adapter | {head} |", "|---|---|---|" + "---:|" * (2 * len(workflows))]
    for r in rows:
        cells = " | ".join(gib(r["by workflow"][(w, job)]) for job in ("training", "evaluation") for w in workflows)
        lines.append(f"| {r['scale']} | {r['policy']} | {r['adapter']} | {cells} |")
    return "\n".join(lines)


def paper_breakdowns(rows: list[dict]) -> str:
    lines = []
    for r in rows:
        for job in ("training", "evaluation"):
            found = r[job]
            lines.append(f"{found.cell} {job} ({found.at}): {found.breakdown()}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", choices=("tiny", "smollm2", "all"), default="all")
    parser.add_argument("--paper", action="store_true", help="print the Qwen3 table of docs/real-models.md instead")
    parser.add_argument("--model", type=Path, default=None, help="converted SmolLM2 folder (default: the cache)")
    parser.add_argument("--json", type=Path, default=None, help="also write the validation rows to this file")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    if args.paper:
        rows = paper_rows()
        print(paper_table(rows))
        print()
        print(paper_workflow_table(rows))
        print()
        print(paper_breakdowns(rows))
        return
    smollm2 = None
    if args.cases != "tiny":
        from matrixrl.models.hf import convert_smollm2

        smollm2 = convert_smollm2(args.model, log=lambda message: None)
    rows = validate(args.cases, smollm2)
    print(validation_table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
