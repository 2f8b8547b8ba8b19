"""The GPU smoke test's checks, shared by its pytest cases (tests/test_gpu_smoke.py) and the
paper's shapes (bench/gpu_smoke.py): what a training moved, the log-prob gap, the memory peaks
against the estimate; and one workflow × policy × adapter case trained, evaluated and checked."""

from __future__ import annotations

import contextlib
import gc
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))  # bench/gpu.py, bench/gpu_memory.py

from gpu import generate_flops, matmul_parameters, mfu, synchronize, update_flops  # noqa: E402
from gpu_memory import alternating_rewards  # noqa: E402

MIB = 1 << 20
POLICIES = ("shared", "isolated")
ADAPTERS = ("full", "lora")

GAP_LIMIT = 0.05
"""The mean |Δ log p| per role and step (nats per token) from which a case fails: 7 times the
largest mean bfloat16's rounding gave (7e-3, tests/test_precision.py), and half of what a
rollout without its KV cache gave the random tiny chat model (a mean of 0.104, a largest of
about 0.5, as with transformers 5.17, which ignores ``cache=``: tests/test_gpu_smoke.py makes
that case fail). A real model's distribution depends far more on the context, so a rollout
computing another policy moves its log-probs by far more."""

def _copy(p):
    return p.detach().to("cpu", copy=True)



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




# --- a workflow × policy × adapter case ------------------------------------------------------------


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


@dataclass(frozen=True)
class CaseSettings:
    """A case's settings: compute dtype, device (auto: the GPU when one is visible), training
    steps, replies' ``max_new_tokens``, evaluation problems (2 samples each)."""

    dtype: str = "bfloat16"
    device: str = "auto"
    steps: int = 2
    new: int = 8
    problems: int = 4


def case_spec(model: str, workflow: str, policy: str, adapter: str, args: CaseSettings, folder: Path):
    """The one-cell spec of a case: arith (two one-digit terms) in chat prompts, 2 problems ×
    group 2 per step, short replies, on an hf scale of ``model``."""
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


def default_model(folder: Path, cuda: bool) -> tuple[str, str]:
    """(the model, what it is): on a GPU converted SmolLM2 if present, else a random tiny chat model."""
    from matrixrl.models.hf import default_smollm2_dir, is_converted

    if cuda and is_converted(default_smollm2_dir()):
        return str(default_smollm2_dir()), "SmolLM2-135M-Instruct (converted)"
    from chat_models import random_chat_model

    random_chat_model(folder, seed=0, hidden_size=64, layers=2)
    return str(folder), "a random tiny chat model (Qwen3, hidden 64, 2 layers, character tokenizer)"


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
a compute dtype in place of the case's): its failure then names the GPU-only path that makes
the NaN, so one GPU window finds it."""


def divergence_variants(case: str, model: str, args: CaseSettings, folder: Path) -> dict[str, str]:
    """Each of ``DIVERGENCE_VARIANTS``: does the case's training still diverge under it?"""
    from dataclasses import replace

    from matrixrl.errors import DivergedError
    from matrixrl.train.trainer import train_cell

    workflow, policy, adapter = case.split()
    outcomes = {}
    for k, (name, (contexts, dtype)) in enumerate(DIVERGENCE_VARIANTS.items()):
        varied = replace(args, dtype=dtype or args.dtype)
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


