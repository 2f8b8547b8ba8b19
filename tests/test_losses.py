"""Every policy loss (``train.loss_type``) at both importance-sampling levels: equal to TRL's own
``GRPOTrainer`` on the same tensors, and the same step whatever the micro-batches.

The reference is TRL 1.16 itself, never a formula copied here: a ``GRPOTrainer`` built
on a tiny model on CPU answers ``_compute_loss(model, inputs)`` for a batch made of
the turns matrixrl trained on. matrixrl's side is ``update_policy`` as training runs
it, at ``ppo_epochs`` 2: the first pass steps the model (AdamW), so in the second
the ratios leave 1 and the clips, caps and gates act; its loss and gradient are
compared with TRL's for the model as it was then, TRL's old log-probabilities
computed by TRL from the model as it was before the first pass.
"""

from __future__ import annotations

import copy
import functools
import logging

import pytest
import torch

from matrixrl.config import Policies, TinyScale, Train
from matrixrl.config.schema import LOSS_TYPES
from matrixrl.models.policies import build_policy
from matrixrl.models.tiny import build_char_tokenizer, build_tiny_model
from matrixrl.tasks.base import Problem
from matrixrl.train import update
from matrixrl.workflows.base import Completion, Episode, Turn

ROLES = ("generator", "aggregator")
PROMPT = [12, 13, 14, 15]  # one prompt length for every turn: TRL numbers positions without position_ids
MAX_NEW_TOKENS = 6
# (role, agent, completion, advantage): two parallel generators and an aggregator, completions of
# 0 to 6 tokens, a turn without advantage (skipped by the update, counted by every normaliser).
TURNS = [
    ("generator", "generator0", [40, 41, 42], 1.0),
    ("generator", "generator0", [43, 44, 45, 46, 47, 48], -0.7),
    ("generator", "generator1", [50], 0.9),
    ("generator", "generator1", [51, 52, 53, 54], 0.0),
    ("generator", "generator1", [], -1.2),
    ("aggregator", "aggregator0", [60, 61, 62, 63, 64], -0.4),
    ("aggregator", "aggregator0", [65, 66], 1.3),
]
REFUSED = {("luspo", "token"), ("vespo", "sequence")}
RUNNABLE = [(loss, level) for loss in LOSS_TYPES for level in ("token", "sequence") if (loss, level) not in REFUSED]


def settings(loss: str, level: str, **more) -> Train:
    """The train: settings of one case; cispo's cap at 1, the lowest matrixrl takes, so that it acts here."""
    cap = {"epsilon_high": 1.0} if loss == "cispo" else {}
    # max_grad_norm: no clipping, so the gradient an optimizer steps on is the loss's (TRL's is unclipped).
    values = dict(ppo_epochs=2, lr=0.05, max_grad_norm=1e9, max_new_tokens=MAX_NEW_TOKENS, **cap)
    return Train(loss_type=loss, importance_sampling_level=level, **{**values, **more})


def test_the_losses_are_the_registrys_names_in_its_order():
    """The configuration's registry (matrixrl.config.loss_types) names every loss function of
    matrixrl.train.losses, and no other, the default first."""
    from matrixrl.config.loss_types import LOSS_TYPES as REGISTERED
    from matrixrl.train.losses import LOSSES

    assert tuple(LOSSES) == REGISTERED == LOSS_TYPES and REGISTERED[0] == Train().loss_type == "dapo"


def test_gspo_is_named_as_the_setting_it_is():
    """GSPO is a level of grpo, not a loss: the plan's error says which two settings make it."""
    from conftest import run_cli

    result = run_cli("plan", "--set", "train.loss_type=gspo")
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [
        "Error: experiments.yaml with --set 'train.loss_type=gspo': train.loss_type: unknown loss type 'gspo'; "
        "GSPO is loss_type grpo with importance_sampling_level: sequence; set both"
    ]


def test_the_kl_correction_is_part_of_a_cells_spec_only_with_a_kl_anchor():
    """Without a KL anchor the correction computes nothing, so the default grid keeps its digests;
    with one the KL term is TRL's (not the form earlier results were computed with), so the
    setting, at either value, is part of the spec and those results are not reused."""
    from matrixrl.settings import science

    assert "use_bias_correction_kl" not in science(Train(use_bias_correction_kl=False))
    assert science(Train(kl_beta=0.1))["use_bias_correction_kl"] is True
    assert science(Train(kl_beta_roles={"aggregator": 0.1}, use_bias_correction_kl=False))["use_bias_correction_kl"] is False


def test_the_refused_pairs_are_the_ones_listed():
    refused = set()
    for loss in LOSS_TYPES:
        for level in ("token", "sequence"):
            try:
                settings(loss, level)
            except ValueError:
                refused.add((loss, level))
    assert refused == REFUSED


@pytest.fixture(scope="module")
def tiny():
    tokenizer = build_char_tokenizer()
    scale = TinyScale(kind="tiny", hidden_size=32, num_layers=1, intermediate_size=64, num_heads=2, num_kv_heads=1)
    return tokenizer, build_tiny_model(scale, tokenizer, seed=0)


def episodes() -> list[Episode]:
    turns = [
        Turn(role, agent, 0, "p", Completion("", list(PROMPT), list(completion)), advantage=advantage)
        for role, agent, completion, advantage in TURNS
    ]
    return [Episode(Problem("p", "q", "a"), group=0, turns=[turn]) for turn in turns]


class Recording:
    """An optimizer that keeps, at each step, the gradient it steps on and the parameters it steps from."""

    def __init__(self, params, lr):
        self.params = list(params)
        super().__init__(self.params, lr=lr)
        self.grads: list[list[torch.Tensor]] = []
        self.before: list[list[torch.Tensor]] = []

    def step(self, closure=None):
        self.grads.append([p.grad.detach().clone() for p in self.params])
        self.before.append([p.detach().clone() for p in self.params])
        return super().step(closure)


class RecordingAdamW(Recording, torch.optim.AdamW):
    """Training's optimizer: its first step moves every parameter by about lr, whatever the loss's scale."""


class RecordingSGD(Recording, torch.optim.SGD):
    """A step proportional to the gradient: two gradients equal up to rounding give parameters equal
    up to rounding (AdamW's first step is lr · sign(g), which rounding flips where g is about 0)."""


def matrixrl_passes(
    model, cfg: Train, mode: str, monkeypatch, micro_batch_tokens=None, optimizer=RecordingAdamW, steps: int = 1
):
    """``update_policy`` over :data:`TURNS` at ``cfg``, ``steps`` times: the last step's metrics
    row, the parameter sets' recording optimizers, and (one parameter set: ``shared``) each
    pass's summed loss, passes of every step in order. With ``cfg.kl_beta`` > 0 the KL's
    reference is ``model`` as given."""
    policy = build_policy(mode, copy.deepcopy(model), ROLES, Policies(adapter="full"))
    if cfg.kl_beta > 0:
        policy.attach_reference(copy.deepcopy(model))
    optimizers = {name: optimizer(params, cfg.lr) for name, (_, params) in policy.parameter_sets().items()}
    losses: list[list[float]] = [[] for _ in range(cfg.ppo_epochs * steps)]
    compute = update.policy_loss

    def recorded(*args, **kwargs):
        loss, clipped = compute(*args, **kwargs)
        if mode == "shared":  # the optimizer's steps so far say which pass this is
            losses[len(optimizers["shared"].grads)].append(loss.item())
        return loss, clipped

    monkeypatch.setattr(update, "policy_loss", recorded)
    policy.train(True)
    for _ in range(steps):
        done = update.update_policy(
            policy, optimizers, episodes(), 0, cfg, diagnostics=False, micro_batch_tokens=micro_batch_tokens
        )
    row = {**done.metrics, "role_kl": done.by_role("kl")}
    monkeypatch.undo()
    return policy, optimizers, [sum(pass_losses) for pass_losses in losses], row


def trl_batch(pad_token_id: int) -> dict[str, torch.Tensor]:
    """:data:`TURNS` as TRL's trainer holds a generation batch (every turn one row)."""
    width = max(len(c) for _, _, c, _ in TURNS)
    completion_ids = torch.tensor([c + [pad_token_id] * (width - len(c)) for _, _, c, _ in TURNS])
    completion_mask = torch.tensor([[1] * len(c) + [0] * (width - len(c)) for _, _, c, _ in TURNS])
    return {
        "prompt_ids": torch.tensor([PROMPT] * len(TURNS)),
        "prompt_mask": torch.ones((len(TURNS), len(PROMPT)), dtype=torch.long),
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.tensor([a for *_, a in TURNS]),
        "num_items_in_batch": completion_mask.sum(),
    }


def trl_trainer(model, tokenizer, cfg: Train, tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", save_strategy="no", logging_strategy="no",
        per_device_train_batch_size=2, num_generations=2, num_iterations=cfg.ppo_epochs, beta=0.0,
        loss_type=cfg.loss_type, importance_sampling_level=cfg.importance_sampling_level,
        epsilon=cfg.epsilon_low, epsilon_high=cfg.epsilon_high, max_completion_length=cfg.max_new_tokens,
        temperature=cfg.temperature, scale_rewards="none",
        sapo_temperature_pos=cfg.sapo_temperature_pos, sapo_temperature_neg=cfg.sapo_temperature_neg,
        vespo_k_pos=cfg.vespo_k_pos, vespo_lambda_pos=cfg.vespo_lambda_pos,
        vespo_k_neg=cfg.vespo_k_neg, vespo_lambda_neg=cfg.vespo_lambda_neg,
    )  # fmt: skip
    logging.getLogger("trl").setLevel(logging.ERROR)
    # Built at beta 0 (with a beta TRL would load a reference model by name); the KL's terms are
    # set after: _compute_loss reads them, and the reference's log-probabilities come in its inputs.
    args.use_bias_correction_kl = cfg.use_bias_correction_kl
    trainer = GRPOTrainer(
        model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions), args=args,
        train_dataset=Dataset.from_dict({"prompt": ["1+2="] * 2}), processing_class=tokenizer,
    )  # fmt: skip
    trainer.current_gradient_accumulation_steps = 1  # set by TRL's training loop, which this test does not run
    trainer.beta = cfg.kl_beta
    trainer.model.train(True)
    return trainer


def trl_logps(trainer, parameters: dict, inputs: dict) -> torch.Tensor:
    """TRL's per-token log-probabilities of ``inputs``'s completions for the model at ``parameters``."""
    model = trainer.model
    set_parameters(model, parameters)
    with torch.no_grad():
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        logps, _, _ = trainer._get_per_token_logps_and_entropies(model, input_ids, attention_mask, inputs["completion_ids"].shape[1])
    return logps


def trl_pass(trainer, start: dict | None, current: dict, pad_token_id: int, reference: dict | None = None):
    """TRL's loss and gradients (by parameter name) for the model at ``current``, its old
    log-probabilities computed by TRL from the model at ``start`` (None: TRL's on-policy pass,
    old = current), the KL's reference (with ``trainer.beta`` > 0) from the model at ``reference``."""
    model = trainer.model
    inputs = trl_batch(pad_token_id)
    if reference is not None:
        inputs["ref_per_token_logps"] = trl_logps(trainer, reference, inputs)
    if start is not None:
        old = trl_logps(trainer, start, inputs)
        new = trl_logps(trainer, current, inputs)
        moved = float((new - old)[inputs["completion_mask"].bool()].abs().max())
        assert moved > 0.1  # the first pass moved the model: the second pass's ratios are off 1
        inputs["old_per_token_logps"] = old
    set_parameters(model, current)
    model.zero_grad(set_to_none=True)
    loss = trainer._compute_loss(model, inputs)
    loss.backward()
    return loss.item(), {name: p.grad for name, p in model.named_parameters()}


def trl_second_pass(trainer, start: dict, second: dict, pad_token_id: int):
    """TRL's loss and gradients for the model at ``second``, its old log-probabilities from ``start``."""
    return trl_pass(trainer, start, second, pad_token_id)


def assert_trls(ours_loss: float, ours: dict, trl_loss: float, trl_grads: dict) -> None:
    """matrixrl's loss and gradients (by parameter name) equal TRL's up to float32 rounding."""
    assert ours_loss == pytest.approx(trl_loss, rel=1e-5, abs=1e-7)
    assert set(ours) == set(trl_grads)
    scale = max(float(g.abs().max()) for g in trl_grads.values())
    assert scale > 0
    for name, grad in ours.items():
        torch.testing.assert_close(grad, trl_grads[name], rtol=1e-4, atol=1e-6 * scale, msg=name)


def set_parameters(model, values: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(values[name])


def by_name(model, params: list, tensors: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    names = {id(p): name for name, p in model.named_parameters()}
    return {names[id(p)]: t for p, t in zip(params, tensors)}


@pytest.mark.parametrize("loss,level", RUNNABLE, ids=[f"{loss}-{level}" for loss, level in RUNNABLE])
def test_the_loss_and_its_gradient_are_trls(tiny, loss, level, monkeypatch, tmp_path):
    tokenizer, model = tiny
    cfg = settings(loss, level)
    policy, optimizers, losses, row = matrixrl_passes(model, cfg, "shared", monkeypatch)
    if loss not in ("sapo", "vespo"):  # the others clip (cispo: caps); sapo and vespo weigh every token
        assert row["clip_fraction"] > 0
    (optimizer,) = optimizers.values()
    start = by_name(policy.model_for("generator"), optimizer.params, optimizer.before[0])
    second = by_name(policy.model_for("generator"), optimizer.params, optimizer.before[1])
    ours = by_name(policy.model_for("generator"), optimizer.params, optimizer.grads[1])

    trainer = trl_trainer(copy.deepcopy(model), tokenizer, cfg, tmp_path)
    trl_loss, trl_grads = trl_second_pass(trainer, start, second, tokenizer.pad_token_id)
    assert_trls(losses[1], ours, trl_loss, trl_grads)


KL_CASES = [(loss, level, bias) for loss, level in RUNNABLE for bias in (True, False)]


@pytest.mark.parametrize(
    "loss,level,bias", KL_CASES, ids=[f"{loss}-{level}-{'corrected' if b else 'bare'}" for loss, level, b in KL_CASES]
)
def test_the_kl_anchor_is_trls(tiny, loss, level, bias, monkeypatch, tmp_path):
    """β > 0, as TRL adds it: β · k3 (× the importance ratio with ``use_bias_correction_kl``) in
    each token's term, before the loss's normaliser. Two steps of two passes each, so that the
    second step's policy is away from the reference (the model before the first step), and
    both of that step's passes are compared: the on-policy one (ratio 1, where the bias
    correction changes the gradient only through the ratio's own) and the clipped one."""
    tokenizer, model = tiny
    cfg = settings(loss, level, kl_beta=0.3, use_bias_correction_kl=bias)
    policy, optimizers, losses, row = matrixrl_passes(model, cfg, "shared", monkeypatch, steps=2)
    (optimizer,) = optimizers.values()
    named = functools.partial(by_name, policy.model_for("generator"), optimizer.params)
    reference, old, second = named(optimizer.before[0]), named(optimizer.before[2]), named(optimizer.before[3])
    trainer = trl_trainer(copy.deepcopy(model), tokenizer, cfg, tmp_path)
    pad = tokenizer.pad_token_id
    on_policy = trl_pass(trainer, None, old, pad, reference=reference)
    assert_trls(losses[2], named(optimizer.grads[2]), *on_policy)
    assert_trls(losses[3], named(optimizer.grads[3]), *trl_pass(trainer, old, second, pad, reference=reference))
    assert row["role_kl"]["generator"] > 1e-4  # the KL term acted: the policy is away from its reference


@pytest.mark.parametrize("mode", ["shared", "isolated"])
@pytest.mark.parametrize("loss,level", RUNNABLE, ids=[f"{loss}-{level}" for loss, level in RUNNABLE])
def test_micro_batches_keep_the_normaliser_of_the_whole_step(tiny, loss, level, mode, monkeypatch):
    """One row per micro-batch (``micro_batch_tokens`` 10: a prompt of 4 and a completion of up
    to 6) against every agent's turns at once: the same gradients in both passes, up to rounding
    (SGD steps between them, so the second pass's ratios leave 1)."""
    _, model = tiny
    cfg = settings(loss, level, lr=0.02)
    passes = functools.partial(matrixrl_passes, model, cfg, mode, monkeypatch, optimizer=RecordingSGD)
    _, whole, _, whole_row = passes(micro_batch_tokens=None)
    _, split, _, split_row = passes(micro_batch_tokens=10)
    assert whole_row["loss"] == pytest.approx(split_row["loss"], rel=1e-5, abs=1e-8)
    for name in whole:
        for one, other in zip(whole[name].grads, split[name].grads, strict=True):
            scale = max(float(g.abs().max()) for g in one)
            assert scale > 0
            for a, b in zip(one, other, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * scale)


def role_tokens(role: str) -> int:
    return sum(len(c) for r, _, c, _ in TURNS if r == role)


def test_bnpo_is_dapo_under_a_shared_policy_and_each_roles_own_token_mean_under_isolated(tiny, monkeypatch):
    """bnpo's batch is the parameter set's turns: under shared, every turn of the step (dapo's
    update, bit for bit); under isolated, one role's, so each role's first-pass gradient is
    dapo's times (step tokens / the role's tokens)."""
    _, model = tiny
    step_tokens = sum(len(c) for _, _, c, _ in TURNS)
    found = {}
    for mode in ("shared", "isolated"):
        for loss in ("dapo", "bnpo"):
            _, optimizers, _, _ = matrixrl_passes(model, settings(loss, "token"), mode, monkeypatch)
            found[mode, loss] = {name: o.grads[0] for name, o in optimizers.items()}
    for a, b in zip(found["shared", "dapo"]["shared"], found["shared", "bnpo"]["shared"], strict=True):
        assert torch.equal(a, b)
    for role in ROLES:
        factor = step_tokens / role_tokens(role)
        assert factor > 1
        dapo, bnpo = found["isolated", "dapo"][role], found["isolated", "bnpo"][role]
        scale = max(float(g.abs().max()) for g in bnpo)
        for a, b in zip(dapo, bnpo, strict=True):
            torch.testing.assert_close(a * factor, b, rtol=1e-5, atol=1e-6 * scale)


def test_at_one_pass_the_losses_come_down_to_their_normalisers(tiny, monkeypatch):
    """At ppo_epochs 1 the ratio is 1: no clip, cap, gate or weight acts, so losses of one
    normaliser give one gradient (docs/design.md §2, Losses), and luspo's is dr_grpo's ×
    max_new_tokens."""
    _, model = tiny

    def gradient(loss, level="token", **more):
        _, optimizers, _, _ = matrixrl_passes(model, settings(loss, level, ppo_epochs=1, **more), "shared", monkeypatch)
        return optimizers["shared"].grads[0]

    def assert_same(one, other, factor=1.0):
        scale = max(float(g.abs().max()) for g in other)
        for a, b in zip(one, other, strict=True):
            torch.testing.assert_close(a * factor, b, rtol=1e-5, atol=1e-6 * scale)

    dapo, grpo = gradient("dapo"), gradient("grpo")
    assert_same(dapo, gradient("cispo"))
    assert_same(dapo, gradient("vespo"))
    assert_same(grpo, gradient("sapo"))
    assert_same(grpo, gradient("grpo", "sequence"))
    assert_same(gradient("dr_grpo"), gradient("luspo", "sequence"), factor=MAX_NEW_TOKENS)
    different = max(float((a - b).abs().max()) for a, b in zip(dapo, grpo))
    assert different > 1e-3 * max(float(g.abs().max()) for g in dapo)


def test_the_losses_bench_times_every_accepted_loss_against_dapo(run_bench):
    """bench/losses.py runs end to end on a small step: a row for every (loss, level) the schema
    accepts, each refused one named, dapo at token level the reference (its timings are not asserted)."""
    from matrixrl.config.schema import IMPORTANCE_SAMPLING_LEVELS, loss_problem

    lines = run_bench("losses.py", "--repeats", "1", "--problems", "2", "--group", "2")
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["loss", "level"])
    table = [line.split() for line in lines[header + 1 :] if not line.startswith("refused")]
    rows = {tuple(cells[:2]): cells[2:] for cells in table}
    accepted, refused = set(), []
    for loss in LOSS_TYPES:
        for level in IMPORTANCE_SAMPLING_LEVELS:
            cispo_fix = {"epsilon_high": 5.0} if loss == "cispo" else {}
            train = Train.model_construct(loss_type=loss, importance_sampling_level=level, **cispo_fix)
            if loss_problem(train) is None:
                accepted.add((loss, level))
            else:
                refused.append(f"{loss}@{level}")
    assert set(rows) == accepted and len(table) == len(accepted)
    assert rows["dapo", "token"][1] == "1.00x"
    assert all(float(seconds) > 0 for seconds, _ in rows.values())
    assert lines[-1] == f"refused by the schema (loss_problem), not run: {', '.join(refused)}"


def test_the_last_pass_shows_what_the_first_cannot_gspos_roles(tiny):
    """The first pass's ratio is 1, so GSPO's role shares there are token-level grpo's; the
    last pass's (``last_pass_share``, recorded from ppo_epochs 2 on) see the sequence ratio."""
    _, model = tiny

    def shares(level: str, epochs: int):
        policy = build_policy("shared", copy.deepcopy(model), ROLES, Policies(adapter="full"))
        optimizers = {name: torch.optim.AdamW(params, lr=0.05) for name, (_, params) in policy.parameter_sets().items()}
        policy.train(True)
        done = update.update_policy(policy, optimizers, episodes(), 0, settings("grpo", level, ppo_epochs=epochs))
        first = {row["role"]: row["value"] for row in done.diagnostics if row["kind"] == "role_share"}
        return first, done.by_role("last_pass_share")

    (token_first, token_last), (gspo_first, gspo_last) = shares("token", 2), shares("sequence", 2)
    assert gspo_first == pytest.approx(token_first, rel=1e-6)
    assert set(gspo_last) == set(token_last) == set(ROLES)
    assert sum(gspo_last.values()) == pytest.approx(1.0)
    assert max(abs(gspo_last[r] - token_last[r]) for r in ROLES) > 1e-3
    assert shares("sequence", 1)[1] == {}  # one pass: nothing beyond the diagnostics
