"""Gradient diagnostics (docs/design.md §5), checked against hand-computed values."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from matrixrl.analysis.gradients import SUMMARY_COLUMNS, summarize_diagnostics
from matrixrl.train import diagnostics as D
from matrixrl.results import DIAGNOSTIC_KINDS as KINDS
from matrixrl.train.diagnostics import AgentGrad, AgentGradients, gradient_diagnostics


def g(role: str, agent: str, values, tokens: int = 1) -> AgentGrad:
    return AgentGrad(role, agent, torch.tensor(values, dtype=torch.float32), tokens)


def index(rows: list[dict]) -> dict[tuple, float]:
    keyed = {(r["kind"], r["role"], r["agent"], r["other"]): r["value"] for r in rows}
    assert len(keyed) == len(rows), "no duplicate rows"
    return keyed


def kinds(rows: list[dict]) -> set[str]:
    return {r["kind"] for r in rows}


VOTING = [
    g("generator", "generator0", [3.0, 0.0], tokens=10),
    g("generator", "generator1", [0.0, 4.0], tokens=12),
    g("aggregator", "aggregator0", [1.0, 1.0], tokens=7),
]


def test_two_roles_every_kind_exact():
    rows = gradient_diagnostics(VOTING, shared=True)
    assert all(set(r) == {"kind", "role", "agent", "other", "value"} for r in rows)
    assert all(type(r["value"]) is float for r in rows)
    assert kinds(rows) <= set(KINDS)
    s2, s41 = math.sqrt(2), math.sqrt(41)
    expected = {
        ("agent_norm", "aggregator", "aggregator0", None): s2,
        ("agent_norm", "generator", "generator0", None): 3.0,
        ("agent_norm", "generator", "generator1", None): 4.0,
        ("agent_tokens", "aggregator", "aggregator0", None): 7.0,
        ("agent_tokens", "generator", "generator0", None): 10.0,
        ("agent_tokens", "generator", "generator1", None): 12.0,
        ("role_norm", "aggregator", None, None): s2,
        ("role_norm", "generator", None, None): 5.0,  # ‖[3, 4]‖
        ("role_tokens", "aggregator", None, None): 7.0,
        ("role_tokens", "generator", None, None): 22.0,
        ("role_share", "aggregator", None, None): s2 / (5 + s2),
        ("role_share", "generator", None, None): 5 / (5 + s2),
        ("agent_cosine", "generator", "generator0", "generator1"): 0.0,
        ("role_cosine", "aggregator", None, "generator"): 7 / (s2 * 5),  # [1,1]·[3,4] = 7
        ("amplification", "generator", None, None): 5 / 3.5,
        # total update = [4, 5], norm √41
        ("role_total_cosine", "aggregator", None, None): 9 / (s2 * s41),
        ("role_total_cosine", "generator", None, None): 32 / (5 * s41),
    }
    got = index(rows)
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-12), key
    shares = [v for k, v in got.items() if k[0] == "role_share"]
    assert sum(shares) == pytest.approx(1.0, abs=1e-12)


def test_rows_do_not_depend_on_input_order():
    assert gradient_diagnostics(VOTING[::-1], shared=True) == gradient_diagnostics(VOTING, shared=True)


def test_isolated_omits_cross_role_kinds_and_allows_different_spaces():
    rows = gradient_diagnostics(VOTING, shared=False)
    assert "role_cosine" not in kinds(rows)
    assert "role_total_cosine" not in kinds(rows)
    got = index(rows)
    assert got[("amplification", "generator", None, None)] == pytest.approx(5 / 3.5)
    assert got[("role_share", "generator", None, None)] == pytest.approx(5 / (5 + math.sqrt(2)))
    # Under IP each role has its own parameters, so vector lengths may differ across roles.
    mixed = [g("generator", "generator0", [1.0, 0.0]), g("evaluator", "evaluator0", [1.0, 2.0, 2.0])]
    got = index(gradient_diagnostics(mixed, shared=False))
    assert got[("role_norm", "evaluator", None, None)] == pytest.approx(3.0)
    with pytest.raises(ValueError):
        gradient_diagnostics(mixed, shared=True)


@pytest.mark.parametrize("n", [2, 3, 5])
def test_aligned_agents_amplify_by_n(n):
    agents = [g("worker", f"worker{i}", [1.0, 2.0, -2.0]) for i in range(n)]
    got = index(gradient_diagnostics(agents, shared=True))
    assert got[("amplification", "worker", None, None)] == pytest.approx(n)
    cosines = [v for k, v in got.items() if k[0] == "agent_cosine"]
    assert len(cosines) == n * (n - 1) // 2
    assert cosines == pytest.approx([1.0] * len(cosines))


@pytest.mark.parametrize("n", [2, 3, 4])
def test_orthogonal_equal_norm_agents_amplify_by_sqrt_n(n):
    agents = [g("generator", f"generator{i}", (2.0 * torch.eye(n)[i]).tolist()) for i in range(n)]
    got = index(gradient_diagnostics(agents, shared=False))
    assert got[("amplification", "generator", None, None)] == pytest.approx(math.sqrt(n))
    assert [v for k, v in got.items() if k[0] == "agent_cosine"] == pytest.approx([0.0] * (n * (n - 1) // 2))


def test_cancelling_agents_amplify_by_zero():
    agents = [g("generator", "generator0", [1.0, -2.0]), g("generator", "generator1", [-1.0, 2.0])]
    got = index(gradient_diagnostics(agents, shared=True))
    assert got[("amplification", "generator", None, None)] == 0.0
    assert got[("agent_cosine", "generator", "generator0", "generator1")] == pytest.approx(-1.0)
    assert got[("role_norm", "generator", None, None)] == 0.0
    # The role's summed gradient is zero: cosines involving it are skipped, shares are all 0.
    assert "role_total_cosine" not in kinds(got_rows := gradient_diagnostics(agents, shared=True))
    assert [r["value"] for r in got_rows if r["kind"] == "role_share"] == [0.0]


def test_single_agent_roles_have_no_amplification_or_agent_cosine():
    rows = gradient_diagnostics([g("generator", "generator0", [1.0, 0.0]), g("evaluator", "evaluator0", [0.0, 1.0])], shared=True)
    assert "amplification" not in kinds(rows)
    assert "agent_cosine" not in kinds(rows)
    got = index(rows)
    assert got[("role_cosine", "evaluator", None, "generator")] == pytest.approx(0.0)
    assert got[("role_total_cosine", "generator", None, None)] == pytest.approx(1 / math.sqrt(2))


def test_zero_gradients_do_not_crash_and_skip_undefined_rows():
    agents = [
        g("generator", "generator0", [0.0, 0.0]),
        g("generator", "generator1", [0.0, 0.0]),
        g("aggregator", "aggregator0", [0.0, 0.0]),
    ]
    rows = gradient_diagnostics(agents, shared=True)
    assert kinds(rows) == {"agent_norm", "agent_tokens", "role_norm", "role_tokens", "role_share"}
    assert all(r["value"] == 0.0 for r in rows if r["kind"] in ("agent_norm", "role_norm", "role_share"))
    assert not any(math.isnan(r["value"]) for r in rows)
    # One zero agent beside a non-zero one: its cosine is skipped, amplification still defined.
    mixed = [g("generator", "generator0", [0.0, 0.0]), g("generator", "generator1", [0.0, 4.0])]
    got = index(gradient_diagnostics(mixed, shared=True))
    assert ("agent_cosine", "generator", "generator0", "generator1") not in got
    assert got[("amplification", "generator", None, None)] == pytest.approx(4 / 2)
    assert gradient_diagnostics([], shared=True) == []


def test_rejects_duplicate_agents_and_mismatched_lengths():
    with pytest.raises(ValueError):
        gradient_diagnostics([g("generator", "generator0", [1.0]), g("generator", "generator0", [2.0])], shared=True)
    with pytest.raises(ValueError):
        gradient_diagnostics([g("generator", "generator0", [1.0]), g("generator", "generator1", [1.0, 2.0])], shared=False)


def test_float64_accumulation():
    # In float32, 1e8 + 1 - 1e8 == 0; the diagnostics must see the exact sum.
    agents = [
        AgentGrad("worker", "worker0", torch.tensor([1e8, 1.0], dtype=torch.float64), 1),
        AgentGrad("worker", "worker1", torch.tensor([-1e8, 1.0], dtype=torch.float64), 1),
    ]
    got = index(gradient_diagnostics(agents, shared=True))
    assert got[("role_norm", "worker", None, None)] == 2.0


@pytest.mark.parametrize("chunk", [1 << 20, 3])  # whole parameters, and chunks smaller than them
def test_agent_gradients_recover_each_backward_pass(chunk, monkeypatch):
    monkeypatch.setattr(D, "CHUNK", chunk)
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    params = list(layer.parameters())
    x1, x2 = torch.randn(4, 3), torch.randn(5, 3)

    def loss_a():
        return layer(x1).pow(2).sum() / 9

    def loss_b():
        return (layer(x2).sin() * torch.tensor([1.0, -2.0])).sum() / 9

    expect_a = torch.cat([t.reshape(-1) for t in torch.autograd.grad(loss_a(), params)]).double()
    expect_b = torch.cat([t.reshape(-1) for t in torch.autograd.grad(loss_b(), params)]).double()

    layer.zero_grad(set_to_none=True)
    grads = AgentGradients(params)
    grads.before_backward()
    loss_a().backward()
    grads.record("generator", "generator0", 4)
    grads.record("generator", "generator1", 0)  # no backward pass: a zero gradient, no copy
    grads.before_backward()
    loss_b().backward()
    grads.record("aggregator", "aggregator0", 5)
    assert len([b for b in grads.boundaries if b is not None]) == 2  # the start (no gradient) and a's end
    found = grads.close()
    # The accumulated .grad is still the sum: the optimizer step is unchanged.
    torch.testing.assert_close(torch.cat([p.grad.reshape(-1) for p in params]).double(), expect_a + expect_b)
    assert found.dot("generator0", "generator0") == pytest.approx(float(expect_a @ expect_a), rel=1e-6)
    # Float32 accumulation in .grad rounds once; the difference matches to float32 precision.
    assert found.dot("aggregator0", "aggregator0") == pytest.approx(float(expect_b @ expect_b), rel=1e-6)
    assert found.dot("generator0", "aggregator0") == pytest.approx(float(expect_a @ expect_b), rel=1e-5)
    assert found.dot("generator1", "generator1") == 0.0 and found.dot("generator1", "aggregator0") == 0.0
    assert found.group_dot("generator", "aggregator") == pytest.approx(float(expect_a @ expect_b), rel=1e-5)
    assert grads.boundaries == []  # the copies are released


def test_agent_gradients_are_exact_when_accumulation_is_exact():
    # Integer weights and inputs, dyadic loss weights: every gradient and every sum is
    # exactly representable in float32, so every product equals autograd.grad's exactly.
    layer = torch.nn.Linear(2, 2)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, -2.0], [3.0, 0.0]]))
        layer.bias.copy_(torch.tensor([0.5, -1.0]))
    params = list(layer.parameters())
    x1, x2 = torch.tensor([[1.0, 2.0], [-1.0, 3.0]]), torch.tensor([[4.0, -2.0]])
    losses = [
        lambda: (layer(x1) * torch.tensor([0.5, 0.25])).sum(),
        lambda: layer(x2).pow(2).sum() * 0.125,
    ]
    expected = [torch.cat([t.reshape(-1) for t in torch.autograd.grad(f(), params)]).double() for f in losses]
    layer.zero_grad(set_to_none=True)
    grads = AgentGradients(params)
    for i, f in enumerate(losses):
        grads.before_backward()
        f().backward()
        grads.record("worker", f"worker{i}", 1)
    found = grads.close()
    for i in range(2):
        for j in range(2):
            assert found.dot(f"worker{i}", f"worker{j}") == float(expected[i] @ expected[j])
    assert found.group_dot("worker", "worker") == float((expected[0] + expected[1]) @ (expected[0] + expected[1]))


def long_frame(cell: str, steps: list[list[AgentGrad]], *, shared: bool) -> pd.DataFrame:
    frames = []
    for step, agents in enumerate(steps, start=1):
        frame = pd.DataFrame(gradient_diagnostics(agents, shared=shared))
        frames.append(frame.assign(cell=cell, step=step))
    return pd.concat(frames, ignore_index=True)


def test_summarize_diagnostics_one_row_per_cell():
    # Voting under IP: the generators go from orthogonal (√3) to aligned (3).
    orth = [g("generator", f"generator{i}", torch.eye(3)[i].tolist()) for i in range(3)]
    aligned = [g("generator", f"generator{i}", [1.0, 0.0, 0.0]) for i in range(3)]
    agg = [g("aggregator", "aggregator0", [0.0, 3.0, 0.0])]
    voting = long_frame("voting-ip", [orth + agg, aligned + agg], shared=False)
    # Step 1 shares: gen √3/(√3+3), agg 3/(√3+3); step 2: gen 3/6, agg 3/6.
    gen_share = (math.sqrt(3) / (math.sqrt(3) + 3) + 0.5) / 2
    agg_share = (3 / (math.sqrt(3) + 3) + 0.5) / 2

    # Eval-opt under SP, single agent per role: evaluator dominates; in step 2 the
    # evaluator did not act, so it counts as share 0 there.
    step1 = [g("generator", "generator0", [1.0, 0.0]), g("evaluator", "evaluator0", [0.0, 3.0])]
    step2 = [g("generator", "generator0", [2.0, 0.0])]
    step3 = [g("generator", "generator0", [1.0, 0.0]), g("evaluator", "evaluator0", [0.0, 3.0])]
    eval_opt = long_frame("eval_opt-sp", [step1, step2, step3], shared=True)

    summary = summarize_diagnostics(pd.concat([voting, eval_opt], ignore_index=True))
    assert list(summary.columns) == SUMMARY_COLUMNS
    assert list(summary["cell"]) == ["eval_opt-sp", "voting-ip"]
    eo, vo = summary.iloc[0], summary.iloc[1]

    assert vo["dominant_role"] == "aggregator"
    assert vo["dominant_share"] == pytest.approx(agg_share)
    assert agg_share > gen_share
    assert vo["amplified_role"] == "generator"
    assert vo["amplification_mean"] == pytest.approx((math.sqrt(3) + 3) / 2)
    assert vo["amplification_max"] == pytest.approx(3.0)

    # generator shares: 1/4, 1, 1/4 → mean 0.5; evaluator 3/4, (0), 3/4 → mean 0.5: tie → "evaluator" sorts first.
    assert eo["dominant_role"] == "evaluator"
    assert eo["dominant_share"] == pytest.approx(0.5)
    assert pd.isna(eo["amplified_role"])  # pandas stores None as its missing value
    assert math.isnan(eo["amplification_mean"]) and math.isnan(eo["amplification_max"])


def test_summarize_diagnostics_empty_frame():
    empty = pd.DataFrame(columns=["kind", "role", "agent", "other", "value", "cell", "step"])
    summary = summarize_diagnostics(empty)
    assert list(summary.columns) == SUMMARY_COLUMNS and summary.empty
