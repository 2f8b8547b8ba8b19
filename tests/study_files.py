"""Result files of a small study, written as the jobs write them, with every kind of row.

Two workflows (single, voting) x arith x tiny-s x both policy modes x two seeds: six
runs (single's isolated cells are its shared runs). Every value is a function of
the run and the step, so a test can say what any exported or returned number must be.
"""

from __future__ import annotations

from pathlib import Path

from matrixrl import grid as G
from matrixrl.config import load_config
from matrixrl.layout import eval_result, train_result
from matrixrl.results import DiagnosticRow, EvalResult, RoleMetric, StepMetrics, TrainResult, write_result

ONLY = ["workflow=single,voting", "task=arith", "scale=tiny-s"]
"""The default experiments file narrowed to this study (with seeds [0, 1])."""
STEPS = (0, 10, 20, 30, 40)
TRAIN_STEPS = 40
N_EVAL = 256
ROLES = {"single": {"generator": 1}, "voting": {"generator": 3, "aggregator": 1}}
# voting/shared/seed 0 peaks at step 10 and collapses from step 30: a terminal cliff.
CURVES = {
    ("single", "shared", 0): (0.30, 0.32, 0.34, 0.33, 0.35),
    ("single", "shared", 1): (0.30, 0.28, 0.30, 0.31, 0.29),
    ("voting", "shared", 0): (0.30, 0.50, 0.45, 0.20, 0.20),
    ("voting", "shared", 1): (0.30, 0.34, 0.36, 0.35, 0.37),
    ("voting", "isolated", 0): (0.30, 0.31, 0.32, 0.33, 0.34),
    ("voting", "isolated", 1): (0.30, 0.29, 0.31, 0.30, 0.32),
}


def two_seed_experiment(experiment: Path) -> Path:
    """The default experiments file (a copy) with seeds [0, 1]."""
    text = experiment.read_text()
    assert "  seed: [0]\n" in text
    experiment.write_text(text.replace("  seed: [0]\n", "  seed: [0, 1]\n"))
    return experiment


def reward(run: G.Cell, step: int) -> float:
    return round(0.1 + 0.01 * step + 0.001 * run.seed + (0.002 if run.policy == "isolated" else 0.0), 6)


def grad_norm(run: G.Cell, role: str, step: int) -> float:
    return round(0.1 * step * (2 if role == "generator" else 1) + 0.01 * run.seed, 6)


def accuracy(run: G.Cell, step: int) -> float:
    return round(CURVES[(run.workflow, run.policy, run.seed)][STEPS.index(step)] * N_EVAL) / N_EVAL


def training(run: G.Cell, spec_digest: str | None = None) -> TrainResult:
    metrics = [
        StepMetrics(step=s, reward_mean=reward(run, s), reward_std=0.1, loss=0.2, entropy=1.0, response_length=2.0,
                    grad_norm=0.3, clip_fraction=0.0, group_size=8, seconds=0.1, completion_tokens=100 + s)
        for s in range(1, TRAIN_STEPS + 1)
    ]  # fmt: skip
    diagnostics, roles = [], []
    for step in range(1, TRAIN_STEPS + 1):
        norms = {role: grad_norm(run, role, step) for role in ROLES[run.workflow]}
        for role, n_agents in ROLES[run.workflow].items():
            agents = [f"{role}{i}" for i in range(n_agents)]
            for agent in agents:
                diagnostics.append(DiagnosticRow(step=step, kind="agent_norm", role=role, agent=agent, other=None, value=norms[role] / 2))
            if n_agents > 1:
                diagnostics.append(DiagnosticRow(step=step, kind="agent_cosine", role=role, agent=agents[0], other=agents[1], value=0.5))
                diagnostics.append(DiagnosticRow(step=step, kind="amplification", role=role, agent=None, other=None, value=2.0))
            diagnostics.append(DiagnosticRow(step=step, kind="role_norm", role=role, agent=None, other=None, value=norms[role]))
            share = norms[role] / sum(norms.values())
            diagnostics.append(DiagnosticRow(step=step, kind="role_share", role=role, agent=None, other=None, value=share))
            roles.append(RoleMetric(step=step, role=role, metric="answer_acc", value=0.25))
        roles.append(RoleMetric(step=step, role="episode", metric="any_correct", value=0.5))
    return TrainResult(cell=run.id, axes=run.axes(), steps=TRAIN_STEPS, spec_digest=spec_digest, metrics=metrics,
                       diagnostics=diagnostics, roles=roles)  # fmt: skip


def evaluation(run: G.Cell, step: int, spec_digest: str | None = None, shift: float = 0.0) -> EvalResult:
    value = accuracy(run, step) + shift
    roles = [RoleMetric(role=role, metric="answer_acc", value=value) for role in ROLES[run.workflow]]
    return EvalResult(
        cell=run.id, step=step, accuracy=value, n=N_EVAL, n_correct=round(value * N_EVAL * 2), seconds=0.1, roles=roles,
        samples=2, se=0.02, pass_at={"1": value, "2": min(1.0, value + 0.1)}, spec_digest=spec_digest,
    )  # fmt: skip


def write_study(experiment: Path, steps=STEPS, runs: list[str] | None = None, digests: bool = True) -> list[G.Cell]:
    """Write the study's result files (evaluations at ``steps``; of ``runs`` only, if given)
    under the experiment's results_dir; with ``digests``, stamped with each run's spec
    digests as the jobs stamp them. Returns the runs written."""
    config = load_config(experiment, only=ONLY)
    results = Path(config.results_dir)
    written = []
    for run in G.runs(config):
        if runs is not None and run.id not in runs:
            continue
        spec = G.cell_spec(config, run)
        train_digest, eval_digest = (spec.train_digest(), spec.eval_digest()) if digests else (None, None)
        write_result(results / train_result(run.id), training(run, train_digest))
        for step in steps:
            write_result(results / eval_result(run.id, step), evaluation(run, step, eval_digest))
        written.append(run)
    return written
