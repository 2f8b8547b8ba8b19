"""The remedies as switches: per-role KL anchor, gradient-coherence damper, agent-wise advantages.

Off, each leaves the update exactly as it was; on, the KL term and the damper follow
their formulas (checked by hand on tiny batches and constructed gradients), the KL's
reference is the base model, and a resumed run damps as an uninterrupted one.
"""

from __future__ import annotations

import math

import pytest
import torch

from matrixrl.config import Train
from matrixrl.settings import science
from matrixrl.tasks.base import Problem
from matrixrl.train.interventions import Damper, kl_k3
from matrixrl.train.rewards import assign_advantages
from matrixrl.train.update import _damp, update_policy
from matrixrl.workflows.base import Completion, Episode, Turn
from test_policies import MODES, ROLES, base, episodes_for, fresh_policy, snapshot  # noqa: F401 (base: a fixture)


def seeded(base, mode, adapter):
    torch.manual_seed(0)  # LoRA's initial adapters are drawn: the same for both sides
    return fresh_policy(base, mode, adapter)


def optimizers_of(policy, lr=1e-2):
    return {name: torch.optim.AdamW(params, lr=lr) for name, (_, params) in policy.parameter_sets().items()}


def updated(policy, cfg: Train, damper=None, steps: int = 2):
    optimizers = optimizers_of(policy, cfg.lr)
    policy.train(True)
    rows = [update_policy(policy, optimizers, episodes_for(ROLES), 0, cfg, damper=damper) for _ in range(steps)]
    policy.train(False)
    return snapshot(policy), rows


# --- off is the update as before ------------------------------------------------------------


def test_the_switches_are_not_science_while_off() -> None:
    """Off, they are left out of specs and digests: existing results rerun nothing."""
    assert not {"kl_beta", "kl_beta_roles", "damper", "damper_roles", "damper_window", "advantage_group"} & set(
        science(Train())
    )
    assert {"kl_beta", "advantage_group"} <= set(science(Train(kl_beta=0.1, advantage_group="agent")))


@pytest.mark.parametrize("mode, adapter", MODES)
def test_a_damper_of_strength_zero_and_a_zero_kl_leave_the_update_bit_for_bit(base, mode, adapter) -> None:
    plain, plain_rows = updated(seeded(base, mode, adapter), Train(lr=1e-2))
    zero = Train(lr=1e-2, kl_beta=0.0, kl_beta_roles={"generator": 0.0}, damper_roles={"generator": 0.0})
    damped, rows = updated(seeded(base, mode, adapter), zero, damper=Damper(0.0, {}, 10))
    for name in plain:
        assert all(torch.equal(a, b) for a, b in zip(plain[name], damped[name])), name
    assert [r.metrics["loss"] for r in rows] == [r.metrics["loss"] for r in plain_rows]
    assert all(scale == 1.0 for row in rows for scale in row.by_role("damper_scale").values())


# --- the KL anchor ----------------------------------------------------------------------


def test_k3_and_its_gradient_by_hand() -> None:
    logps = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, -0.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # the third token is padding
    k3 = kl_k3(logps, ref, mask)
    r = [-0.5, 1.0]
    expected = [math.exp(x) - x - 1 for x in r] + [0.0]
    assert k3.detach()[0].tolist() == pytest.approx(expected)
    beta, n_tokens = 0.3, 4
    (beta * k3.sum() / n_tokens).backward()
    # d/dlogp (e^r − r − 1) with r = ref − logp: 1 − e^r
    assert logps.grad[0].tolist() == pytest.approx([beta * (1 - math.exp(x)) / n_tokens for x in r] + [0.0])


@pytest.mark.parametrize("mode, adapter", MODES)
def test_the_kl_is_zero_at_the_base_and_grows_as_the_policy_moves(base, mode, adapter) -> None:
    policy = fresh_policy(base, mode, adapter)
    if adapter == "full":
        from matrixrl.models.policies import load_causal_lm

        policy.attach_reference(load_causal_lm(base))
    _, rows = updated(policy, Train(lr=5e-2, kl_beta=0.5), steps=3)
    assert rows[0].by_role("kl") == {"aggregator": pytest.approx(0.0, abs=1e-7), "generator": pytest.approx(0.0, abs=1e-7)}
    assert all(value > 1e-6 for value in rows[-1].by_role("kl").values()), rows[-1].by_role("kl")


def test_the_kl_value_matches_a_forward_of_the_base_model(base) -> None:
    """The logged KL is the token-mean k3 between the policy and a fresh load of the base model."""
    from matrixrl.models.policies import load_causal_lm
    from matrixrl.train.grpo import TurnBatch, completion_logps

    policy = fresh_policy(base, "shared", "full")
    policy.attach_reference(load_causal_lm(base))
    cfg = Train(lr=5e-2, kl_beta=0.5)
    updated(policy, cfg, steps=2)  # move away from the base
    optimizers = {name: torch.optim.SGD(params, lr=0.0) for name, (_, params) in policy.parameter_sets().items()}
    policy.train(True)
    row = update_policy(policy, optimizers, episodes_for(("generator",)), 0, cfg)
    turns = [t for e in episodes_for(("generator",)) for t in e.turns]
    batch = TurnBatch.from_turns(turns, pad_token_id=0)
    with torch.no_grad():
        mine = completion_logps(policy.model_for("generator"), batch, cfg.temperature)
        theirs = completion_logps(load_causal_lm(base), batch, cfg.temperature)
    expected = float(kl_k3(mine, theirs, batch.completion_mask).sum() / batch.completion_mask.sum())
    assert row.by_role("kl")["generator"] == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("adapter", ["full", "lora"])
def test_the_reference_is_the_base_model(base, adapter) -> None:
    from matrixrl.models.policies import load_causal_lm
    from matrixrl.train.grpo import TurnBatch, completion_logps

    policy = fresh_policy(base, "isolated", adapter)
    if adapter == "full":
        policy.attach_reference(load_causal_lm(base))
    updated(policy, Train(lr=5e-2, kl_beta=0.1), steps=2)
    batch = TurnBatch.from_turns([t for e in episodes_for(("generator",)) for t in e.turns], pad_token_id=0)
    with torch.no_grad():
        with policy.reference() as reference:
            anchored = completion_logps(reference, batch, 1.0)
        trained = completion_logps(policy.model_for("generator"), batch, 1.0)
        fresh = completion_logps(load_causal_lm(base), batch, 1.0)
    assert torch.allclose(anchored, fresh, atol=1e-6), "the reference must be the base model"
    assert not torch.allclose(trained, fresh, atol=1e-4), "the policy should have moved"


# --- the damper ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "average, strength, scale",
    [
        ([2.0, 0.0], 0.3, 0.7),  # aligned: cos 1
        ([0.0, 5.0], 0.3, 1.0),  # orthogonal: cos 0
        ([-1.0, 0.0], 0.3, 1.0),  # opposed: cos −1, clamped to 0
        ([1.0, 1.0], 0.3, 1 - 0.3 / math.sqrt(2)),  # 45°
        ([2.0, 0.0], 0.0, 1.0),  # λ = 0
        ([2.0, 0.0], 1.0, 0.0),  # λ = 1 freezes an aligned role
    ],
    ids=["aligned", "orthogonal", "opposed", "45-degrees", "lambda-0", "lambda-1"],
)
def test_the_damper_scale(average, strength, scale) -> None:
    damper = Damper(strength, {}, window=4)
    damper.average["generator"] = torch.tensor(average)
    got, cos = damper.scale("generator", torch.tensor([3.0, 0.0]))
    assert got == pytest.approx(scale)
    assert cos == pytest.approx(float(torch.nn.functional.cosine_similarity(torch.tensor(average), torch.tensor([3.0, 0.0]), dim=0)))


def test_the_first_step_is_undamped_and_seeds_the_average() -> None:
    damper = Damper(0.3, {"aggregator": 0.1}, window=4)
    assert damper.scale("generator", torch.tensor([1.0, 2.0])) == (1.0, 0.0)
    damper.update("generator", torch.tensor([1.0, 2.0]))
    damper.update("generator", torch.tensor([3.0, 0.0]))
    tau = 1 - 1 / 4
    expected = tau * (1 - tau) * torch.tensor([1.0, 2.0]) + (1 - tau) * torch.tensor([3.0, 0.0])
    assert torch.allclose(damper.average["generator"], expected)
    assert (damper.strength_of("generator"), damper.strength_of("aggregator")) == (0.3, 0.1)


def grads_of(params, values):
    for p, v in zip(params, values):
        p.grad = torch.tensor(v, dtype=torch.float32)


def test_under_shared_each_roles_contribution_is_damped_before_the_sum() -> None:
    """One parameter set, two roles: .grad = g_gen + g_agg; only the aligned role is scaled."""
    params = [torch.nn.Parameter(torch.zeros(2))]
    damper = Damper(0.5, {}, window=10)
    damper.average = {"generator": torch.tensor([1.0, 0.0]), "aggregator": torch.tensor([1.0, 0.0])}
    from matrixrl.train.diagnostics import grad_snapshot

    starts = {"generator": grad_snapshot(params)}  # no gradient yet
    grads_of(params, [[4.0, 0.0]])  # the generator's backward: aligned with its average
    starts["aggregator"] = grad_snapshot(params)
    grads_of(params, [[4.0, 3.0]])  # the aggregator's adds [0, 3]: orthogonal to its average
    found = _damp(params, starts, damper, update=True)
    assert found == {"generator": (pytest.approx(1.0), pytest.approx(0.5)), "aggregator": (pytest.approx(0.0), 1.0)}
    assert params[0].grad.tolist() == pytest.approx([2.0, 3.0])  # 0.5 · [4, 0] + 1 · [0, 3]
    assert damper.average["generator"].tolist() == pytest.approx([0.9 * 1 + 0.1 * 2.0, 0.0])


def test_under_isolated_each_set_is_its_roles_gradient() -> None:
    params = [torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))]
    damper = Damper(0.2, {}, window=2)
    damper.average = {"generator": torch.tensor([-1.0, -1.0])}
    from matrixrl.train.diagnostics import grad_snapshot

    starts = {"generator": grad_snapshot(params)}
    grads_of(params, [[1.0], [1.0]])
    assert _damp(params, starts, damper, update=False) == {"generator": (pytest.approx(-1.0), 1.0)}
    assert [p.grad.item() for p in params] == [1.0, 1.0]  # opposed: untouched


@pytest.mark.parametrize("mode", ["shared", "isolated"])
def test_a_damped_update_moves_less_along_a_repeated_direction(base, mode) -> None:
    """The same batch twice: the second step's gradient is aligned with the first's, so it is damped."""
    _, rows = updated(fresh_policy(base, mode, "full"), Train(lr=1e-3), damper=Damper(0.3, {}, 10), steps=3)
    first, later = rows[0].roles, rows[-1].roles
    assert all(role.damper[1] == 1.0 for role in first.values())
    assert all(role.damper[0] > 0.5 and role.damper[1] < 1.0 for role in later.values()), later


# --- advantages ----------------------------------------------------------------------------


def two_turn_episodes(rewards: list[tuple[float, float]]) -> list[Episode]:
    """One problem, rollouts whose generator speaks twice (turn 0 and 1) with these rewards."""
    episodes = []
    for r0, r1 in rewards:
        turns = [
            Turn("generator", "generator0", 0, "p", Completion("a", [1], [2]), reward=r0),
            Turn("generator", "generator0", 1, "p", Completion("b", [1], [2]), reward=r1),
        ]
        episodes.append(Episode(Problem("p", "1+1", "2"), group=0, turns=turns))
    return episodes


def test_turn_wise_and_agent_wise_advantage_groups() -> None:
    rewards = [(1.0, 0.0), (0.0, 0.0)]
    by_turn = two_turn_episodes(rewards)
    assign_advantages(by_turn, scale_rewards=False, group_by="turn")
    # turn 0: rewards 1, 0 → ±0.5; turn 1: 0, 0 → 0
    assert [[t.advantage for t in e.turns] for e in by_turn] == [[0.5, 0.0], [-0.5, 0.0]]
    by_agent = two_turn_episodes(rewards)
    sizes = assign_advantages(by_agent, scale_rewards=False, group_by="agent")
    # all four of generator0's turns: mean 0.25
    assert [[t.advantage for t in e.turns] for e in by_agent] == [[0.75, -0.25], [-0.25, -0.25]]
    assert sizes == {"generator": 4}
    scaled = two_turn_episodes(rewards)
    assign_advantages(scaled, scale_rewards=True, group_by="agent")
    std = torch.tensor([1.0, 0.0, 0.0, 0.0]).std().item()
    assert scaled[0].turns[0].advantage == pytest.approx(0.75 / (std + 1e-4), rel=1e-3)


# --- whole trainings -----------------------------------------------------------------------

from test_resume import curve, study, train, weights  # noqa: E402, F401 (study: a fixture)
from matrixrl.layout import checkpoint_dir  # noqa: E402

SWITCHED_ON = ("train.damper=0.3", "train.kl_beta=0.2", "train.advantage_group=agent")


def test_a_resumed_run_damps_and_anchors_as_an_uninterrupted_one(study, tmp_path) -> None:
    short, _ = train(study, tmp_path / "extended", *SWITCHED_ON)
    extended, lines = train(study, tmp_path / "extended", *SWITCHED_ON, "train.steps=10")
    assert lines[0] == "resuming single-arith-tiny-s-shared-s0 from its checkpoint at step 6"
    uninterrupted, _ = train(study, tmp_path / "uninterrupted", *SWITCHED_ON, "train.steps=10")
    assert curve(extended) == curve(uninterrupted) and curve(extended)[:6] == curve(short)
    assert extended["roles"] == uninterrupted["roles"]  # the damper's cos and scale, the KL, per step
    a, b = weights(checkpoint_dir(tmp_path / "extended", 10)), weights(checkpoint_dir(tmp_path / "uninterrupted", 10))
    assert all(torch.equal(a[k], b[k]) for k in a)
    # After the resume the damper compares with the restored moving average (a lost one gives cos 0).
    cosines = [r["value"] for r in extended["roles"] if r["metric"] == "damper_cos" and r["step"] > 6]
    assert cosines and any(c != 0 for c in cosines), "no gradient met the average after the resume: the test shows nothing"
    kl = [r["value"] for r in extended["roles"] if r["metric"] == "kl"]
    assert kl and max(kl) > 0


def test_switched_on_the_training_differs_and_off_it_is_the_default(study, tmp_path) -> None:
    default, _ = train(study, tmp_path / "default")
    off, _ = train(study, tmp_path / "off", "train.damper=0.0", "train.kl_beta=0.0", "train.advantage_group=turn")
    assert curve(off) == curve(default)
    on, _ = train(study, tmp_path / "on", *SWITCHED_ON)
    assert curve(on) != curve(default)


# --- configuration and tables --------------------------------------------------------------


@pytest.mark.parametrize(
    "assignment, message",
    [
        (
            "train.kl_beta_roles={genrator: 0.1}",
            "train.kl_beta_roles: unknown role 'genrator'; did you mean generator?",
        ),
        (
            "scales.tiny-s.train.damper_roles={x: 0.1}",
            "scales.tiny-s.train.damper_roles: unknown role 'x'; use one of: aggregator, evaluator, generator, "
            "orchestrator, synthesizer, worker",
        ),
        ("train.damper=1.5", "train.damper: must be less than or equal to 1 (got 1.5)"),
        ("train.kl_beta=-0.1", "train.kl_beta: must be greater than or equal to 0 (got -0.1)"),
        ("train.advantage_group=episode", "train.advantage_group: must be 'turn' or 'agent' (got 'episode')"),
    ],
)
def test_bad_switches_are_one_line(experiment, assignment: str, message: str) -> None:
    from matrixrl.config import load_config
    from matrixrl.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        load_config(experiment, sets=[assignment])
    assert str(caught.value) == f"{experiment} with --set {assignment!r}: {message}"


def test_the_signals_up_to_the_onset_reach_the_diagnostics_and_mechanism_tables() -> None:
    import pandas as pd

    from matrixrl.analysis.cell_record import intervention_signals, records_frame
    from matrixrl.analysis.summary import diagnostics_rows

    rows = pd.DataFrame(
        [{"step": s, "role": role, "metric": metric, "value": value}
         for s in (1, 2, 3)
         for role, metric, value in (("generator", "kl", 0.1 * s), ("aggregator", "kl", 0.2), ("generator", "damper_scale", 1.0 - 0.1 * s))]
    )  # fmt: skip
    signals = intervention_signals(rows, until=2)
    assert signals["generator_kl_mean"] == pytest.approx(0.2) and signals["aggregator_kl_mean"] == pytest.approx(0.2)
    assert signals["generator_damper_scale_mean"] == pytest.approx(0.8)
    assert signals["kl_mean"] == pytest.approx((0.1 + 0.2 + 0.2 + 0.2) / 4)  # steps 1 and 2 only
    assert signals["damper_scale_mean"] == pytest.approx(0.85)
    record = {"has_diagnostics": True, "base": 0.1, **signals}
    cells = pd.DataFrame([{"cell": "c", "workflow": "voting", "task": "arith", "scale": "tiny-s", "policy": "shared", "seed": 0}])
    table = diagnostics_rows(records_frame({"c": record}, cells))
    assert {"generator_kl_mean", "aggregator_kl_mean", "generator_damper_scale_mean"} <= set(table.columns)
