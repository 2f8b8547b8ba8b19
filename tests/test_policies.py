"""Shared and isolated policies, full and LoRA: which parameters a step moves, and checkpoints."""

from __future__ import annotations

import pytest
import torch

from matrixrl.config import Policies, TinyScale, Train
from matrixrl.models.hf import ModelSource
from matrixrl.models.policies import build_policy, load_policy
from matrixrl.models.tiny import build_char_tokenizer, build_tiny_model
from matrixrl.tasks.base import Problem
from matrixrl.train.update import update_policy
from matrixrl.workflows.base import Completion, Episode, Turn

ROLES = ("generator", "aggregator")
MODES = [(mode, adapter) for mode in ("shared", "isolated") for adapter in ("full", "lora")]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    folder = tmp_path_factory.mktemp("base")
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(TinyScale(kind="tiny", hidden_size=32, num_layers=1, intermediate_size=64, num_heads=2, num_kv_heads=1), tokenizer, seed=0)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def fresh_policy(base, mode, adapter):
    from matrixrl.models.policies import load_causal_lm

    return build_policy(mode, load_causal_lm(base), ROLES, Policies(adapter=adapter))


def episodes_for(roles: tuple[str, ...]) -> list[Episode]:
    """Two rollouts of one problem with opposite advantages for each role's turn."""
    episodes = []
    for rollout, advantage in enumerate((1.0, -1.0)):
        turns = [
            Turn(role, f"{role}0", 0, "1+2=", Completion("3", [10 + i, 20, 30], [40 + rollout, 3]), advantage=advantage)
            for i, role in enumerate(roles)
        ]
        episodes.append(Episode(Problem("p", "1+2", "3"), group=0, turns=turns))
    return episodes


def snapshot(policy) -> dict[str, dict[str, torch.Tensor]]:
    return {name: [p.detach().clone() for p in params] for name, (_, params) in policy.parameter_sets().items()}


def frozen_base(policy) -> list[torch.Tensor]:
    return [p.detach().clone() for n, p in policy.model.named_parameters() if "lora_" not in n]


def step(policy, roles):
    optimizers = {name: torch.optim.AdamW(params, lr=1e-2) for name, (_, params) in policy.parameter_sets().items()}
    policy.train(True)
    update_policy(policy, optimizers, episodes_for(roles), pad_token_id=0, cfg=Train())
    policy.train(False)


def changed(before, after) -> bool:
    return any(not torch.equal(a, b) for a, b in zip(before, after))


@pytest.mark.parametrize("adapter", ["full", "lora"])
def test_isolated_step_moves_only_the_roles_that_acted(base, adapter):
    policy = fresh_policy(base, "isolated", adapter)
    assert set(policy.parameter_sets()) == set(ROLES)
    before = snapshot(policy)
    base_before = frozen_base(policy) if adapter == "lora" else None
    step(policy, ("generator",))
    after = snapshot(policy)
    assert changed(before["generator"], after["generator"])
    assert all(torch.equal(a, b) for a, b in zip(before["aggregator"], after["aggregator"])), "aggregator moved"
    if adapter == "lora":
        assert all(torch.equal(a, b) for a, b in zip(base_before, frozen_base(policy))), "the LoRA base must stay frozen"
    step(policy, ROLES)
    final = snapshot(policy)
    assert changed(after["generator"], final["generator"]) and changed(after["aggregator"], final["aggregator"])


@pytest.mark.parametrize("adapter", ["full", "lora"])
def test_shared_step_moves_the_one_set_for_every_role(base, adapter):
    policy = fresh_policy(base, "shared", adapter)
    assert list(policy.parameter_sets()) == ["shared"]
    assert policy.parameter_sets()["shared"][0] == ROLES
    assert policy.model_for("generator") is policy.model_for("aggregator")
    before = snapshot(policy)
    step(policy, ("aggregator",))
    assert changed(before["shared"], snapshot(policy)["shared"])


@pytest.mark.parametrize("mode,adapter", MODES)
def test_checkpoint_round_trip(base, tmp_path, mode, adapter):
    policy = fresh_policy(base, mode, adapter)
    step(policy, ROLES)  # move away from the base so a round trip is not trivially equal
    policy.save(tmp_path)
    loaded = load_policy(mode, tmp_path, ROLES, Policies(adapter=adapter), ModelSource("tiny", str(base)))
    assert {k: [t.shape for t in v] for k, v in snapshot(policy).items()} == {
        k: [t.shape for t in v] for k, v in snapshot(loaded).items()
    }
    for name, tensors in snapshot(policy).items():
        assert all(torch.equal(a, b) for a, b in zip(tensors, snapshot(loaded)[name])), name
    ids = torch.tensor([[10, 20, 30, 40]])
    for role in ROLES:
        with torch.no_grad():
            expected = policy.model_for(role)(input_ids=ids).logits
            got = loaded.model_for(role)(input_ids=ids).logits
        assert torch.equal(expected, got), role


@pytest.mark.parametrize("prompt_logits", ["computed", "left out"])
@pytest.mark.parametrize("mode,adapter", MODES)
def test_completion_logps_score_each_completion_token_in_its_own_context(base, mode, adapter, prompt_logits, monkeypatch):
    """The update's log-probabilities over a padded batch, with the prompt positions'
    logits computed (a tiny model's batch) or left out (a real vocabulary's), are each
    turn's own: a forward over its prompt and completion alone, log-softmax at the
    position before each completion token."""
    from matrixrl.train import grpo
    from matrixrl.train.grpo import TurnBatch, completion_logps

    if prompt_logits == "left out":
        monkeypatch.setattr(grpo, "PROMPT_LOGITS_LEFT_OUT_FROM", 0)
    policy = fresh_policy(base, mode, adapter)
    turns = [  # prompts of 1 to 4 tokens (left padding), completions of 1 to 3 (right padding)
        Turn("generator", "generator0", 0, "", Completion("", prompt, completion))
        for prompt, completion in (([10, 20, 30, 40], [5, 6, 3]), ([11], [7]), ([12, 22], [8, 9]))
    ]
    model = policy.model_for("generator")
    batch = TurnBatch.from_turns(turns, pad_token_id=0)
    temperature = 0.7
    computed = []  # positions whose logits the forward computed
    hook = model.register_forward_hook(lambda module, args, output: computed.append(output.logits.shape[1]))
    with torch.no_grad():
        got = completion_logps(model, batch, temperature)
        hook.remove()
        assert computed == [3 + 1 if prompt_logits == "left out" else 4 + 3]
        assert got.shape == batch.completion_ids.shape
        for row, turn in enumerate(turns):
            prompt, completion = turn.completion.prompt_ids, turn.completion.completion_ids
            logits = model(input_ids=torch.tensor([prompt + completion])).logits[0] / temperature
            scoring = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)  # the positions before each completion token
            expected = scoring[torch.arange(len(completion)), torch.tensor(completion)]
            torch.testing.assert_close(got[row, : len(completion)], expected, rtol=1e-5, atol=1e-5)


# --- what the update skips ----------------------------------------------------------------


def mixed_episodes(advantages: list[float]) -> list[Episode]:
    """One generator turn per rollout with the given advantages (0: a group that scored alike)."""
    return [
        Episode(
            Problem("p", "1+2", "3"),
            group=0,
            turns=[Turn("generator", "generator0", 0, "1+2=", Completion("3", [10 + i % 3, 20, 30 + i], [40 + i, 41, 3][: 1 + i % 3]), advantage=a)],
        )
        for i, a in enumerate(advantages)
    ]


def reference_update(policy, optimizer, episodes, cfg: Train) -> None:
    """The textbook step: one forward and backward over every turn, advantage 0 or not."""
    from matrixrl.train.grpo import TurnBatch, completion_logps
    from matrixrl.train.losses import StepCounts, dapo

    turns = [t for e in episodes for t in e.turns]
    (_, params), = policy.parameter_sets().values()
    optimizer.zero_grad(set_to_none=True)
    batch = TurnBatch.from_turns(turns, pad_token_id=0)
    logps = completion_logps(policy.model_for("generator"), batch, cfg.temperature)
    tokens = int(batch.completion_mask.sum())
    counts = StepCounts(tokens=tokens, turns=len(turns), set_tokens=tokens, max_completion_length=cfg.max_new_tokens)
    loss, _ = dapo(logps, logps.detach(), batch.advantages, batch.completion_mask, cfg, counts)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
    optimizer.step()


def test_skipping_turns_without_advantage_leaves_the_step_unchanged(base):
    """Zero-advantage turns skip forward and backward; the parameters after two steps
    (the second with no advantage at all, where AdamW moves on momentum alone) match
    the textbook update over every turn."""
    cfg = Train(lr=1e-2)
    fast, slow = fresh_policy(base, "shared", "full"), fresh_policy(base, "shared", "full")
    opt_fast = {"shared": torch.optim.AdamW(fast.parameter_sets()["shared"][1], lr=cfg.lr)}
    opt_slow = torch.optim.AdamW(slow.parameter_sets()["shared"][1], lr=cfg.lr)
    start = snapshot(fast)["shared"]
    for advantages in ([1.0, 0.0, -1.0, 0.0, 0.5, 0.0], [0.0] * 6):
        update_policy(fast, opt_fast, mixed_episodes(advantages), pad_token_id=0, cfg=cfg, diagnostics=False)
        reference_update(slow, opt_slow, mixed_episodes(advantages), cfg)
        for a, b in zip(snapshot(fast)["shared"], snapshot(slow)["shared"]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert changed(start, snapshot(fast)["shared"])


def test_entropy_recorded_while_sampling_is_the_entropy_of_the_sampled_distribution(base):
    """Completion.entropy_sum (from generate) against a fresh forward over prompt + completion."""
    from matrixrl.models.policies import load_causal_lm
    from matrixrl.train.grpo import TurnBatch
    from matrixrl.train.rollout import make_generate
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base)
    policy = fresh_policy(base, "shared", "full")
    temperature = 0.7
    generate = make_generate(policy, tokenizer, max_new_tokens=6, temperature=temperature, sample=True)
    torch.manual_seed(0)
    completions = generate("generator", ["1+2=", "12+3=", "7="] * 4)
    model = load_causal_lm(base)
    for completion in completions:
        if not completion.completion_ids:
            continue
        turn = Turn("generator", "generator0", 0, "", completion, advantage=1.0)
        batch = TurnBatch.from_turns([turn], pad_token_id=tokenizer.pad_token_id)
        with torch.no_grad():
            logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids).logits
        width = len(completion.completion_ids)
        logps = torch.log_softmax(logits[0, -width - 1 : -1] / temperature, dim=-1)
        expected = -(logps.exp() * logps).sum().item()
        assert completion.entropy_sum == pytest.approx(expected, rel=1e-4), completion
    assert sum(c.entropy_sum for c in completions) > 0


def test_clipping_engages_from_the_second_pass_only(base):
    """ppo_epochs = 1: the ratio is 1 and nothing is clipped; more passes move the policy
    away from the one that sampled, and the clip acts (TRL's num_iterations)."""
    fractions = {}
    for epochs in (1, 4):
        policy = fresh_policy(base, "shared", "full")
        start = snapshot(policy)["shared"]
        cfg = Train(ppo_epochs=epochs, lr=5e-2)
        optimizers = {"shared": torch.optim.AdamW(policy.parameter_sets()["shared"][1], lr=cfg.lr)}
        policy.train(True)
        update = update_policy(policy, optimizers, episodes_for(ROLES), pad_token_id=0, cfg=cfg)
        row, diagnostics = update.metrics, update.diagnostics
        fractions[epochs] = row["clip_fraction"]
        assert changed(start, snapshot(policy)["shared"])
        # The diagnostics describe the first (on-policy) pass: one row set per agent either way.
        assert {d["agent"] for d in diagnostics if d["kind"] == "agent_norm"} == {"generator0", "aggregator0"}
    assert fractions[1] == 0.0
    assert 0.0 < fractions[4] <= 0.75  # clipped tokens over all passes; the first pass never clips
