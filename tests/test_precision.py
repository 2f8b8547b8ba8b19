"""Mixed precision and the update's numerics, checked on CPU (docs/real-models.md, "Precision").

A GPU scale computes in bfloat16. These tests run the same code on CPU with
``dtype: bfloat16`` (torch's CPU autocast) against float32 runs of the same model:
full fine-tuning keeps every update, the update's log-probabilities are float32,
the log-probability gap between rollout and update is measured, and micro-batches,
gradient checkpointing and the streamed gradient diagnostics give the gradients
and figures of one whole batch.
"""

from __future__ import annotations

import copy
import math
from itertools import combinations

import pytest
import torch

from chat_models import random_chat_model
from matrixrl.config import Policies, Train
from matrixrl.models.hf import ModelSource
from matrixrl.models.policies import build_policy, load_policy
from matrixrl.tasks.base import Problem
from matrixrl.train import diagnostics as D
from matrixrl.train.grpo import TurnBatch, completion_logps
from matrixrl.train.interventions import kl_k3
from matrixrl.train.update import micro_batches, update_policy
from matrixrl.workflows.base import Completion, Episode, Turn

ROLES = ("generator", "aggregator")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A random chat model of tiny-s's size whose logits spread as a trained model's do (a
    few units, where bfloat16's steps are hundredths), not the near-uniform ones of a random
    initialisation. Smaller (one layer of width 32), bfloat16 rounds the same way in the
    rollout and the update on CPU, and there would be no gap to see."""
    folder = tmp_path_factory.mktemp("precision") / "model"
    return random_chat_model(folder, seed=3, hidden_size=128, layers=2, logit_scale=40.0)


def source(model_dir, dtype: str) -> ModelSource:
    return ModelSource(scale="chat", path=str(model_dir), dtype=dtype, device="cpu", pretrained=True)


def policy_of(model_dir, dtype: str, mode: str = "shared", adapter: str = "full"):
    torch.manual_seed(0)  # LoRA's A matrices: the same adapters in every policy built here
    src = source(model_dir, dtype)
    return build_policy(mode, src.load_model(frozen=adapter == "lora"), ROLES, Policies(adapter=adapter))


def episodes(n: int = 6, roles=ROLES, width: int = 5) -> list[Episode]:
    """Rollouts of one problem with advantages of both signs, every role acting."""
    out = []
    for i in range(n):
        advantage = 1.0 if i % 2 else -1.0
        turns = [
            Turn(role, f"{role}{i % 2}", 0, "", Completion("", [4 + (i + k) % 30 for k in range(3 + i % 4)],
                 [10 + (i * 7 + k) % 40 for k in range(1 + (i + r) % width)]), advantage=advantage * (1 + r))
            for r, role in enumerate(roles)
        ]  # fmt: skip
        out.append(Episode(Problem("p", "q", "a"), group=0, turns=turns))
    return out


def adamw(policy, lr):
    return {name: torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
            for name, (_, params) in policy.parameter_sets().items()}  # fmt: skip


def weights(policy) -> list[torch.Tensor]:
    return [p.detach().clone().float() for _, (_, params) in policy.parameter_sets().items() for p in params]


def changed_fraction(before, after) -> float:
    return sum(int((a != b).sum()) for a, b in zip(before, after)) / sum(a.numel() for a in before)


# --- full fine-tuning keeps every update ------------------------------------------------------------


@pytest.mark.parametrize("lr", [1e-6, 1e-5])
def test_a_bfloat16_full_fine_tune_changes_as_many_parameters_as_float32(model_dir, lr):
    """One step: in bfloat16 weights most AdamW updates round away (below a weight's last
    bit); with float32 master weights and bfloat16 compute every one lands."""
    fractions = {}
    for dtype in ("float32", "bfloat16"):
        policy = policy_of(model_dir, dtype)
        assert all(p.dtype == torch.float32 for _, params in policy.parameter_sets().values() for p in params)
        before = weights(policy)
        policy.train(True)
        update_policy(policy, adamw(policy, lr), episodes(), 0, Train(), diagnostics=False)
        fractions[dtype] = changed_fraction(before, weights(policy))
    assert fractions["float32"] > 0.5
    assert fractions["bfloat16"] == pytest.approx(fractions["float32"], abs=0.01)

    # What the old path did: the weights themselves in bfloat16.
    naive = policy_of(model_dir, "float32")
    for model in naive._models():
        model.to(torch.bfloat16)
    before = weights(naive)
    naive.train(True)
    update_policy(naive, adamw(naive, lr), episodes(), 0, Train(), diagnostics=False)
    assert changed_fraction(before, weights(naive)) < 0.5 * fractions["float32"]


def test_ten_bfloat16_steps_track_a_float32_run(model_dir):
    """Ten updates on the same turns at lr 1e-5: the bfloat16 run's losses stay within 0.01
    (absolute) of the float32 run's, and its weights moved the same way (the difference of
    the two runs' total changes is under 10% of the float32 change)."""
    runs = {}
    for dtype in ("float32", "bfloat16"):
        policy = policy_of(model_dir, dtype)
        optimizers = adamw(policy, 1e-5)
        start = weights(policy)
        losses = []
        policy.train(True)
        for _ in range(10):
            row = update_policy(policy, optimizers, episodes(), 0, Train(), diagnostics=False).metrics
            losses.append(row["loss"])
        runs[dtype] = (losses, [a - b for a, b in zip(weights(policy), start)])
    (loss32, moved32), (loss16, moved16) = runs["float32"], runs["bfloat16"]
    assert max(abs(a - b) for a, b in zip(loss32, loss16)) < 0.01
    difference = math.sqrt(sum(float((a - b).pow(2).sum()) for a, b in zip(moved16, moved32)))
    size = math.sqrt(sum(float(a.pow(2).sum()) for a in moved32))
    assert size > 0 and difference < 0.1 * size, (difference, size)


@pytest.mark.parametrize("mode", ["shared", "isolated"])
def test_every_lora_adapter_is_float32_on_a_bfloat16_base(model_dir, tmp_path, mode):
    policy = policy_of(model_dir, "bfloat16", mode, "lora")
    dtypes = lambda p: {(("lora_" in n), str(t.dtype)) for n, t in p.model.named_parameters()}  # noqa: E731
    assert dtypes(policy) == {(True, "torch.float32"), (False, "torch.bfloat16")}
    policy.save(tmp_path)
    loaded = load_policy(mode, tmp_path, ROLES, Policies(adapter="lora"), source(model_dir, "bfloat16"))
    assert dtypes(loaded) == {(True, "torch.float32"), (False, "torch.bfloat16")}


@pytest.mark.parametrize("mode,adapter", [("shared", "full"), ("isolated", "full"), ("isolated", "lora")])
def test_a_16_bit_output_layer_on_cpu_reads_a_contiguous_input(model_dir, mode, adapter):
    """The last positions a forward keeps (``logits_to_keep``: a decoding step, an update's
    completions) are a strided view; a 16-bit output layer on CPU gets them contiguous, or
    CPUs with 16-bit matrix units copy its weight once per row (matrixrl.models.hf). Float32
    keeps the view: the input these tests give is the strided case."""
    inputs = torch.arange(4 * 6).reshape(4, 6) % 40 + 4

    def contiguity(policy) -> set[bool]:
        seen = set()
        for role in ROLES:
            output_layer = policy.model_for(role).get_output_embeddings()
            hook = output_layer.register_forward_pre_hook(lambda module, args: seen.add(args[0].is_contiguous()))
            with torch.no_grad():
                policy.model_for(role)(input_ids=inputs, logits_to_keep=1)
            hook.remove()
        return seen

    assert contiguity(policy_of(model_dir, "bfloat16", mode, adapter)) == {True}
    assert contiguity(policy_of(model_dir, "float32", mode, adapter)) == {False}


def test_a_full_checkpoint_keeps_float32_master_weights(model_dir, tmp_path):
    policy = policy_of(model_dir, "bfloat16")
    policy.train(True)
    update_policy(policy, adamw(policy, 1e-6), episodes(), 0, Train(), diagnostics=False)
    policy.save(tmp_path)
    loaded = load_policy("shared", tmp_path, ROLES, Policies(), source(model_dir, "bfloat16"))
    for a, b in zip(weights(policy), weights(loaded)):
        assert torch.equal(a, b)


def test_float16_is_refused_with_one_line(tmp_path):
    from matrixrl.config.load import validate
    from matrixrl.errors import ConfigError

    raw = {"grid": {"workflow": ["single"], "task": ["arith"], "scale": ["chat"], "policy": ["shared"], "seed": [0]},
           "scales": {"chat": {"kind": "hf", "path": "Qwen/Qwen3-0.6B", "dtype": "float16"}},
           "tasks": {"arith": {"kind": "arith"}}}  # fmt: skip
    with pytest.raises(ConfigError) as caught:
        validate(raw, "experiments.yaml")
    assert str(caught.value) == (
        "experiments.yaml: scales.chat.dtype: float16 needs loss scaling, which matrixrl's update does not do "
        "(small gradients would round to zero and nothing would say so); use bfloat16 (GPUs from NVIDIA Ampere on) "
        "or float32"
    )


# --- log-probabilities in float32 -------------------------------------------------------------------


def test_k3_from_bfloat16_logits_matches_a_float64_reference(model_dir):
    """The update takes bfloat16 logits to float32 before the log-softmax: k3 against a
    reference matches k3 computed in float64 from the same logits. In bfloat16 it would be
    exactly 0 for small differences and then jump by 0.0156."""
    policy_model = source(model_dir, "bfloat16").load_model()
    reference = copy.deepcopy(policy_model)
    with torch.no_grad():
        for p in policy_model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    turns = [t for e in episodes(8) for t in e.turns if t.role == "generator"]
    batch = TurnBatch.from_turns(turns, pad_token_id=0)
    with torch.no_grad():
        mine, theirs = completion_logps(policy_model, batch, 0.7), completion_logps(reference, batch, 0.7)
        assert mine.dtype == torch.float32
        got = kl_k3(mine, theirs, batch.completion_mask)

        def float64_logps(model):
            logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids).logits
            assert logits.dtype == torch.bfloat16  # the model computes in bfloat16
            width = batch.completion_ids.shape[1]
            scores = torch.log_softmax(logits[:, -width - 1 : -1].double() / 0.7, dim=-1)
            return scores.gather(-1, batch.completion_ids[..., None]).squeeze(-1)

        r = float64_logps(reference) - float64_logps(policy_model)
        expected = (torch.exp(r) - r - 1) * batch.completion_mask
    assert float(expected.sum()) > 0
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-6)


def sampled_episodes(policy, tokenizer, temperature=1.0) -> list[Episode]:
    from matrixrl.train.rollout import make_generate

    generate = make_generate(policy, tokenizer, max_new_tokens=6, temperature=temperature, sample=True)
    torch.manual_seed(0)
    out = []
    for role in ROLES:
        for i, completion in enumerate(generate(role, ["<|user|>1+2<|end|>\n<|assistant|>", "<|user|>7<|end|>\n<|assistant|>"] * 4)):
            turn = Turn(role, f"{role}0", 0, "", completion, advantage=1.0 if i % 2 else -1.0)
            out.append(Episode(Problem("p", "q", "a"), group=0, turns=[turn]))
    return out


def test_the_log_prob_gap_is_zero_in_float32_and_measured_in_bfloat16(model_dir):
    """The rollout records each sampled token's log-probability; the update compares its own
    (first pass) and logs the gap per role: 0 up to float32 rounding in float32, the
    training-inference mismatch of bfloat16 otherwise."""
    tokenizer = source(model_dir, "float32").load_tokenizer()
    gaps = {}
    for dtype in ("float32", "bfloat16"):
        policy = policy_of(model_dir, dtype)
        found = sampled_episodes(policy, tokenizer)
        assert all(t.completion.sampled_logps is not None for e in found for t in e.turns)
        policy.train(True)
        update = update_policy(policy, adamw(policy, 1e-6), found, tokenizer.pad_token_id, Train(), diagnostics=False)
        gaps[dtype] = {role: (u.gap[0] / u.gap[2], u.gap[1]) for role, u in update.roles.items() if u.gap}
        assert set(gaps[dtype]) == set(ROLES)
    # float32: rounding of differently shaped products only (measured here: max 8e-6).
    assert all(largest < 1e-4 for _, largest in gaps["float32"].values()), gaps["float32"]
    # bfloat16: products rounded to 8 bits of mantissa, differently in one-token decoding
    # steps and the update's whole-sequence pass: above float32's bound, far below a nat. How far
    # depends on the CPU's kernels (means 3e-3 to 7e-3, max 0.1 on one machine; 4e-4 to 1.6e-3,
    # max 0.06 on an AVX2-only AMD EPYC).
    assert all(1e-4 < mean <= largest < 1.0 for mean, largest in gaps["bfloat16"].values()), gaps["bfloat16"]


# --- micro-batches, gradient checkpointing: the same gradients --------------------------------------


class Recorder(torch.optim.Optimizer):
    """Keeps the gradients it is asked to step with (after clipping) and moves nothing."""

    def __init__(self, params):
        super().__init__(params, {})
        self.seen: list[torch.Tensor] = []

    def step(self, closure=None):
        self.seen = [p.grad.detach().clone() for group in self.param_groups for p in group["params"]]


def assert_same_gradients(expected: list[torch.Tensor], got: list[torch.Tensor]) -> None:
    """Equal up to float32 rounding of sums taken in another order, relative to the largest gradient."""
    assert len(expected) == len(got) and any(float(g.abs().sum()) > 0 for g in expected)
    scale = max(float(g.abs().max()) for g in expected)
    for a, b in zip(expected, got):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6 * scale)


def gradients(policy, found, **options) -> list[torch.Tensor]:
    optimizers = {name: Recorder(params) for name, (_, params) in policy.parameter_sets().items()}
    policy.train(True)
    update_policy(policy, optimizers, found, 0, Train(max_grad_norm=1e9), diagnostics=False, **options)
    return [g for name in sorted(optimizers) for g in optimizers[name].seen]


def test_micro_batches_cut_in_order_under_the_budget():
    turns = [Turn("g", "g0", 0, "", Completion("", [1] * p, [2] * c)) for p, c in ((3, 2), (4, 1), (2, 5), (9, 9), (1, 1))]
    assert micro_batches(turns, None) == [turns]
    cut = micro_batches(turns, 14)
    assert [len(run) for run in cut] == [2, 1, 1, 1] and [t for run in cut for t in run] == turns
    for run in cut:  # rows × (longest prompt + longest completion), unless one turn alone is longer
        rows, width = len(run), max(len(t.completion.prompt_ids) for t in run) + max(len(t.completion.completion_ids) for t in run)
        assert rows * width <= 14 or rows == 1
    assert micro_batches([], 14) == []


@pytest.mark.parametrize("mode,adapter", [("shared", "full"), ("isolated", "lora")])
def test_micro_batches_give_the_gradients_of_one_batch(model_dir, mode, adapter):
    found = episodes(12)
    whole = gradients(policy_of(model_dir, "float32", mode, adapter), found, micro_batch_tokens=None)
    cut = gradients(policy_of(model_dir, "float32", mode, adapter), found, micro_batch_tokens=20)
    assert_same_gradients(whole, cut)


@pytest.mark.parametrize("adapter", ["full", "lora"])
def test_gradient_checkpointing_gives_the_same_gradients(model_dir, adapter):
    found = episodes(8)
    plain = gradients(policy_of(model_dir, "float32", "shared", adapter), found)
    policy = policy_of(model_dir, "float32", "shared", adapter)
    policy.enable_gradient_checkpointing()
    assert all(model.is_gradient_checkpointing for model in policy._models())
    checkpointed = gradients(policy, found)
    assert_same_gradients(plain, checkpointed)


# --- gradient diagnostics, streamed ------------------------------------------------------------------


def reference_rows(vectors: dict[tuple[str, str], torch.Tensor], shared: bool) -> dict[tuple, float]:
    """The diagnostics from whole flattened float64 gradients, the way they were computed before
    they were streamed: sums of vectors, then norms and cosines."""

    def norm(v):
        return float(torch.linalg.vector_norm(v))

    def cos(a, b):
        return float(a @ b) / (norm(a) * norm(b))

    roles = sorted({role for role, _ in vectors})
    members = {role: sorted(agent for r, agent in vectors if r == role) for role in roles}
    sums = {role: sum(vectors[role, a] for a in members[role]) for role in roles}
    out = {("agent_norm", r, a, None): norm(vectors[r, a]) for r, a in vectors}
    out |= {("role_norm", r, None, None): norm(sums[r]) for r in roles}
    total = sum(norm(sums[r]) for r in roles)
    out |= {("role_share", r, None, None): norm(sums[r]) / total for r in roles}
    for r in roles:
        for a, b in combinations(members[r], 2):
            out["agent_cosine", r, a, b] = cos(vectors[r, a], vectors[r, b])
        if len(members[r]) > 1:
            out["amplification", r, None, None] = norm(sums[r]) / (sum(norm(vectors[r, a]) for a in members[r]) / len(members[r]))
    if shared:
        for r, s in combinations(roles, 2):
            out["role_cosine", r, None, s] = cos(sums[r], sums[s])
        whole = sum(sums.values())
        out |= {("role_total_cosine", r, None, None): cos(sums[r], whole) for r in roles}
    return out


def agent_vectors(policy, found) -> dict[tuple[str, str], torch.Tensor]:
    """Each agent's gradient by its own autograd.grad, flattened in float64."""
    from matrixrl.train.losses import StepCounts, dapo

    total = sum(len(t.completion.completion_ids) for e in found for t in e.turns)
    by_agent: dict[tuple[str, str], list] = {}
    for e in found:
        for t in e.turns:
            by_agent.setdefault((t.role, t.agent), []).append(t)
    policy.train(True)
    out = {}
    for (role, agent), turns in by_agent.items():
        params = policy.parameter_sets()[policy.set_of(role)][1]
        batch = TurnBatch.from_turns(turns, pad_token_id=0)
        logps = completion_logps(policy.model_for(role), batch, 1.0)
        counts = StepCounts(tokens=total, turns=sum(len(e.turns) for e in found), set_tokens=total, max_completion_length=8)
        loss, _ = dapo(logps, logps.detach(), batch.advantages, batch.completion_mask, Train(), counts)
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        out[role, agent] = torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1).double() for g, p in zip(grads, params)])
    return out


class Float64Sizes(torch.utils._python_dispatch.TorchDispatchMode):
    """The largest float64 tensor any operation makes."""

    largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.dtype == torch.float64:
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("mode", ["shared", "isolated"])
def test_streamed_diagnostics_match_whole_float64_vectors_without_making_one(model_dir, mode, monkeypatch):
    """Same figures as whole flattened float64 gradients (within 1e-6 relative), while no
    float64 tensor is larger than one chunk per agent: nothing of a model's size."""
    monkeypatch.setattr(D, "CHUNK", 256)
    found = [e for e in episodes(6, roles=("generator", "aggregator"))]
    for e in found:  # two generators and one aggregator per update, as voting has
        e.turns[1].agent = "aggregator0"
    expected = reference_rows(agent_vectors(policy_of(model_dir, "float32", mode), found), shared=mode == "shared")
    policy = policy_of(model_dir, "float32", mode)
    size = sum(p.numel() for _, params in policy.parameter_sets().values() for p in params)
    optimizers = {name: Recorder(params) for name, (_, params) in policy.parameter_sets().items()}
    policy.train(True)
    with Float64Sizes() as sizes:
        rows = update_policy(policy, optimizers, found, 0, Train()).diagnostics
    got = {(r["kind"], r["role"], r["agent"], r["other"]): r["value"] for r in rows if r["kind"] in {k[0] for k in expected}}
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-12), key
    assert size > 100 * 256 and sizes.largest <= 3 * 256


# --- resuming in bfloat16 --------------------------------------------------------------------------


def hf_spec(model_dir, folder, steps: int, adapter: str):
    """A one-cell spec of ``model_dir`` as a bfloat16 hf scale on CPU (single, arith, chat prompts)."""
    import yaml

    from matrixrl.config import load_config
    from matrixrl.grid import cell_spec, runs

    raw = {
        "grid": {"workflow": ["single"], "task": ["arith"], "scale": ["chat"], "policy": ["shared"], "seed": [0]},
        "scales": {"chat": {"kind": "hf", "path": str(model_dir), "dtype": "bfloat16", "device": "cpu"}},
        "tasks": {"arith": {"kind": "arith", "digits": 1, "terms": 2, "n_eval": 4}},
        "policies": {"adapter": adapter},
        "train": {"steps": steps, "eval_every": 2, "problems_per_step": 2, "group_size": 2, "max_new_tokens": 4,
                  "lr": 1e-5, "keep_checkpoints": "all"},
    }  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "experiments.yaml").write_text(yaml.safe_dump(raw))
    config = load_config(folder / "experiments.yaml")
    (cell,) = runs(config)
    return cell_spec(config, cell)


@pytest.mark.parametrize("adapter", ["full", "lora"])
def test_a_resumed_bfloat16_training_matches_an_uninterrupted_one(model_dir, tmp_path, adapter):
    """Checkpoints hold the float32 master weights and AdamW's state: a bfloat16 training
    stopped after 2 steps and extended to 4 ends with the weights and metrics of one run to 4."""
    from safetensors.torch import load_file

    from matrixrl.train.trainer import train_cell

    whole = train_cell(hf_spec(model_dir, tmp_path / "a", 4, adapter), tmp_path, tmp_path / "a" / "cell", log=lambda m: None)
    train_cell(hf_spec(model_dir, tmp_path / "b", 2, adapter), tmp_path, tmp_path / "b" / "cell", log=lambda m: None)
    lines: list[str] = []
    resumed = train_cell(hf_spec(model_dir, tmp_path / "b", 4, adapter), tmp_path, tmp_path / "b" / "cell", log=lines.append)
    assert any("resuming" in line for line in lines)
    strip = lambda rows: [{k: v for k, v in row.items() if k != "seconds"} for row in rows]  # noqa: E731
    assert strip(resumed["metrics"]) == strip(whole["metrics"])
    files = [sorted((tmp_path / run / "cell").rglob("step_4/**/*.safetensors")) for run in ("a", "b")]
    assert len(files[0]) == len(files[1]) >= 1
    for a, b in zip(*files):
        for name, tensor in load_file(a).items():
            assert tensor.dtype == torch.float32, name  # master weights, and float32 adapters
            assert torch.equal(tensor, load_file(b)[name]), name


def test_training_rollouts_decode_at_most_rollout_batch_size_rows_per_call(model_dir, tmp_path, monkeypatch):
    """train.rollout_batch_size caps the rows of every generate call of a training rollout (a
    stage of voting decodes 3 generators × its episodes at once otherwise)."""
    from matrixrl.train import rollout
    from matrixrl.train.trainer import train_cell

    seen: list[int] = []
    real = rollout.decode

    def decode(model, input_ids, *args, **kwargs):
        seen.append(input_ids.shape[0])
        return real(model, input_ids, *args, **kwargs)

    spec = hf_spec(model_dir, tmp_path, 1, "lora")
    capped = spec.model_copy(update={"train": spec.train.model_copy(update={"rollout_batch_size": 3})})
    monkeypatch.setattr(rollout, "decode", decode)
    train_cell(spec, tmp_path, tmp_path / "whole", log=lambda m: None)
    whole, seen[:] = list(seen), []
    train_cell(capped, tmp_path, tmp_path / "capped", log=lambda m: None)
    assert max(whole) == 4  # 2 problems × group 2 in one call
    assert max(seen) <= 3 and sum(seen) == sum(whole)
