"""GPU smoke test: each workflow, policy and adapter trains a few steps and is evaluated.

One command for the first minutes on a GPU (and, with a tiny model, on CPU):

    python bench/gpu_smoke.py [--model PATH_OR_HUB_ID] [--steps 2] [--dtype bfloat16]

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
- **log-prob gap**: the update's ``role_logp_gap`` (|Δ log p| between the rollout's sampled
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
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).parent))  # bench/gpu.py, bench/gpu_memory.py
sys.path.append(str(REPO / "tests"))  # chat_models.py

from gpu import generate_flops, matmul_parameters, mfu, peak_tflops, synchronize, update_flops  # noqa: E402
from gpu_memory import alternating_rewards  # noqa: E402

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a model folder or a cached hub id (default: on a GPU converted SmolLM2 if present, else a random tiny chat model)")
    parser.add_argument("--steps", type=int, default=2, help="training steps per case")
    parser.add_argument("--dtype", choices=("bfloat16", "float32", "auto"), default="bfloat16", help="the compute dtype")
    parser.add_argument("--new", type=int, default=8, help="max_new_tokens of training and evaluation")
    parser.add_argument("--problems", type=int, default=4, help="evaluation problems (2 samples each)")
    parser.add_argument("--device", choices=("auto", "cpu"), default="auto", help="auto: the GPU when one is visible")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the GPU's peak (default: bench/gpu.py's table)")
    parser.add_argument("--only", default=None, help="run the cases whose name contains this (e.g. 'voting shared')")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")

    import torch
    from transformers.utils import logging as hf_logging

    from matrixrl.workflows import WORKFLOWS

    hf_logging.disable_progress_bar()
    cuda = args.device == "auto" and torch.cuda.is_available()
    threads = torch.get_num_threads()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.model:
            model = str(Path(args.model).resolve()) if Path(args.model).is_dir() else args.model
            what = args.model
        else:
            model, what = default_model(tmp / "model", cuda)
        name = torch.cuda.get_device_name() if cuda else "cpu"
        peak = args.peak_tflops or (peak_tflops(name) if cuda else None)
        print(f"device: {name}; compute dtype {args.dtype}; torch {torch.__version__}; "
              f"peak {f'{peak:.0f} TFLOP/s' if peak else 'unknown'}")  # fmt: skip
        print(f"model: {what}; {args.steps} steps per case (2 problems x group 2, replies up to {args.new} tokens); "
              f"evaluation of {args.problems} problems x 2 samples")  # fmt: skip
        if not cuda:
            print("no CUDA here: skipped in every case: the memory peaks (torch.cuda.max_memory_allocated) and MFU")
        cases = [(w, p, a) for w in WORKFLOWS for p in POLICIES for a in ADAPTERS]
        cases = [c for c in cases if args.only is None or args.only in " ".join(c)]
        print("  ".join(f"{n:>{w}s}" if i else f"{n:{w}s}" for i, (n, w) in enumerate(COLUMNS)), flush=True)
        for i, (workflow, policy, adapter) in enumerate(cases):
            case = f"{workflow} {policy} {adapter}"
            folder = tmp / f"case{i}"
            folder.mkdir()
            try:
                row = run_case(case, case_spec(model, workflow, policy, adapter, args, folder), folder, cuda, peak)
            except Exception as exc:  # one case's failure is a row; the others still run
                traceback.print_exc(file=sys.stderr)
                row = {"case": case, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
            finally:
                torch.set_num_threads(threads)  # each job sets its own
            rows.append(row)
            print(formatted(row, cuda), flush=True)
    failed = [r for r in rows if r.get("failures", True)]
    if not failed:
        print(f"all {len(rows)} cases passed")
        return
    print(f"{len(failed)} of {len(rows)} cases failed:")
    for r in failed:
        for failure in r.get("failures") or [r["error"]]:
            print(f"  {r['case']}: {failure}")
    raise SystemExit(1)


if __name__ == "__main__":
    main()
