"""Synthetic studies with the study's noise, to measure how often the claims' rules err.

The verdict rules of the claims table (``analysis.claims``, docs/report.md) were fixed in
advance; this module measures, by simulation, how often each one decides when nothing
is there (its error rate) and how often it finds what is planted (its power), on grids
of a given shape. A synthetic study is made the way a run makes one, down to the per-cell
records the claims read, and is fed to the real code (``summarize_curve`` for each
cell's curve, ``mechanism.assess`` for its gradient signal, ``claims_table`` or one
claim's own function for the verdicts); nothing is written to disk.

**The noise.** Every multi-agent (workflow, task, scale) is a *context* with a true base
accuracy drawn uniformly from :data:`BASE_RANGE`, and one base evaluation: its accuracy
a binomial draw of ``n_eval × samples`` trials, shared by every seed of both modes as
the study's one ``evaluate_base`` job is (docs/design.md §3). Each seed of each mode is
an independent training: its true curve (below, with a seed-to-seed spread of its gain,
``training_sd``) is evaluated at every checkpoint after 0 by its own binomial draw. Each
evaluation's SE is the binomial one of those trials, as the draw has it. (A real
evaluation's SE is per-problem, larger with correlated samples, and so is its noise;
what the rules need is that a record's SE be its noise's, as it is here.) The peak is
the best checkpoint and the cliff, collapse and signature are the project's own rules
on the drawn curve. A run's kind is drawn independently of every other's.

**The true curves.** A run is one of three kinds, drawn per cell with a :class:`Scenario`'s
probabilities for its mode:

- *learning*: the accuracy rises linearly from the base to ``base + gain`` at the last
  step, where the gain is the scenario's ``gain``, plus its context's effect (normal,
  SD ``context_sd``), plus half of ``policy_gain`` under isolated (minus under shared),
  plus the training's own spread; isolated runs also sit ``isolated_lift`` above that
  at every checkpoint after 0 (higher peaks);
- *flat*: it stays at the base (a failure that is no cliff);
- *cliff*: it rises to a peak well beyond noise (:func:`cliff_height`) at a checkpoint
  drawn from the middle of the run, then falls back to the base from the next one on.

**The gradient signals.** Isolated cells of workflows with parallel agents carry an
amplification signal and shared multi-agent cells a dominant-share signal, one value per
update (1, then 2 from the update where it rises). In every such cell it rises with
probability ``rise``, at an update drawn uniformly after the baseline window, whatever
the run does; in a cliff run it rises instead, with probability ``precedes`` for its
mode, a few updates before the checkpoint preceding the onset (the study's mechanism).

Units and names follow the real study's (workflows, tasks, scales from the grid), so the
claims group and pair the cells as they would a run's.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from matrixrl.analysis.axes import PerCell
from matrixrl.analysis.claims import claims_table
from matrixrl.analysis.curves import summarize_curve
from matrixrl.analysis.mechanism import Signal, assess
from matrixrl.config import Analysis, Config

BASE_RANGE = (0.25, 0.55)
"""The true base accuracies of the contexts are drawn uniformly from this range."""
POLICIES = ("shared", "isolated")
CLIFF_MIN_HEIGHT = 0.15
"""A planted cliff's peak rises at least this far above the base (and 5 SEs of the difference)."""


@dataclass(frozen=True)
class GridShape:
    """What of a grid a synthetic study needs: its multi-agent contexts, seeds, checkpoints and evaluations.

    ``contexts``: the multi-agent (workflow, task, scale), each with one base evaluation (the
    ``single`` baseline is left out: no claim reads it); ``seeds`` per mode; ``steps``: the
    evaluated checkpoints, 0 first; ``trials``: per task, the trials of one evaluation
    (``n_eval × samples``); ``parallel``: the workflows whose isolated cells carry an
    amplification signal (parallel agents of one role)."""

    name: str
    contexts: tuple[tuple[str, str, str], ...]
    seeds: int
    steps: tuple[int, ...]
    trials: Mapping[str, int]
    parallel: frozenset[str]

    @classmethod
    def of(cls, config: Config, name: str, seeds: int | None = None) -> GridShape:
        """The shape of ``config``'s grid (``seeds``: that many instead of the grid's)."""
        from matrixrl import grid as G
        from matrixrl.workflows import WORKFLOWS

        if config.grid.sweeps:
            raise ValueError(f"{name}: a grid with extra axes ({', '.join(config.grid.sweeps)}) is not simulated; leave them out")
        contexts = tuple(
            (workflow, task, scale)
            for workflow in config.grid.workflow
            if len(WORKFLOWS[workflow].roles) > 1
            for task in config.grid.task
            for scale in config.grid.scale
        )
        trials = {}
        for task in config.grid.task:
            n_eval = config.tasks[task].n_eval
            if n_eval is None:
                raise ValueError(f"{name}: task {task} evaluates every problem of its split (n_eval: null); give n_eval")
            trials[task] = n_eval * config.eval.samples
        parallel = frozenset(w for w in config.grid.workflow if WORKFLOWS[w].parallel_roles)
        steps = tuple(G.checkpoint_steps(config.train))
        return cls(name, contexts, seeds or len(config.grid.seed), steps, trials, parallel)

    def describe(self) -> str:
        """E.g. ``12 contexts × 2 modes × 1 seed, 5 checkpoints, 512 trials an evaluation``."""
        trials = sorted(set(self.trials.values()))
        each = "/".join(map(str, trials))
        seeds = f"{self.seeds} seed{'s' if self.seeds > 1 else ''}"
        contexts = f"{len(self.contexts)} context{'s' if len(self.contexts) > 1 else ''}"
        return f"{contexts} × 2 modes × {seeds}, {len(self.steps)} checkpoints, {each} trials an evaluation"


@dataclass(frozen=True)
class Scenario:
    """The true effects of a synthetic study (the module docstring says how each enters a curve).

    Each pair is ``(isolated, shared)``; probabilities are per run. ``effect``: the planted
    effect in a few words, for the tables (empty for a null)."""

    name: str
    effect: str = ""
    gain: float = 0.0
    context_sd: float = 0.0
    policy_gain: float = 0.0
    isolated_lift: float = 0.0
    training_sd: float = 0.01
    cliff: tuple[float, float] = (0.0, 0.0)
    flat: tuple[float, float] = (0.0, 0.0)
    rise: float = 0.0
    precedes: tuple[float, float] = (0.0, 0.0)


NO_GAIN = Scenario("no gain", cliff=(0.3, 0.3), flat=(0.2, 0.2), rise=0.5)
"""Claim 1's null: nothing learns (a learning run's true gain is 0, give or take its training's
spread); 30% of runs still end in a cliff and 20% stay flat, and every signal rises in half the
runs at a random update, cliff or none, all alike in both modes."""

NULL = replace(NO_GAIN, name="null", gain=0.10)
"""The null of claims 2–7: as :data:`NO_GAIN`, but a learning run gains +0.10 (so that the runs that
do not fail read as gains, and a failure's pattern means something); no context, policy or mode
effect, cliffs and signals alike in both modes."""

NULLS = {1: NO_GAIN, **dict.fromkeys(range(2, 8), NULL)}
"""Per claim, the null its error rate is measured under."""

PLANTED = {
    1: replace(NO_GAIN, name="gain", effect="learning runs gain +0.08", gain=0.08),
    2: replace(NULL, name="context", effect="contexts' gains SD 0.08", context_sd=0.08),
    3: replace(NULL, name="peaks", effect="isolated +0.03 at every checkpoint", isolated_lift=0.03),
    4: replace(NULL, name="cliffs", effect="cliffs 60% isolated, 10% shared", cliff=(0.6, 0.1)),
    5: replace(NULL, name="failures", effect="flat 0% isolated, 50% shared", flat=(0.0, 0.5)),
    6: replace(NULL, name="amplify", effect="isolated: signal precedes 90% of cliffs", precedes=(0.9, 0.0)),
    7: replace(NULL, name="capture", effect="shared: signal precedes 90% of cliffs", precedes=(0.0, 0.9)),
}  # fmt: skip
"""Per claim, its null with that claim's effect planted (and no other)."""


def cliff_height(trials: int) -> float:
    """How far a planted cliff's peak rises above the base: :data:`CLIFF_MIN_HEIGHT`, or 5 binomial
    SEs of the difference of two evaluations at accuracy 0.5 where that is more (so the peak is a
    real rise, ``cliff_noise_se`` = 2 SEs, in all but a few runs)."""
    return max(CLIFF_MIN_HEIGHT, 5 * math.sqrt(2 * 0.25 / trials))


def synthetic_study(
    shape: GridShape, scenario: Scenario, rng: np.random.Generator, analysis: Analysis, signals: bool = True,
    context_effects: np.ndarray | None = None,
) -> PerCell:
    """One synthetic study of ``shape`` under ``scenario``: its per-cell records as the claims read them.
    ``signals``: also the gradient signals and what the mechanism table makes of them (claims 6, 7).
    ``context_effects``: each context's effect on the gain, in the shape's order, in place of the
    scenario's draw ``normal(0, context_sd)`` (a grid's contexts have the effects they have)."""
    steps = list(shape.steps)
    last = steps[-1]
    updates = np.arange(1, last + 1)
    after_window = analysis.mechanism_baseline_steps + 1  # the first update a rise can be seen at
    rows = []
    for i, (workflow, task, scale) in enumerate(shape.contexts):
        trials = shape.trials[task]
        true_base = rng.uniform(*BASE_RANGE)
        base = rng.binomial(trials, true_base) / trials  # the one base evaluation, shared by every cell below
        if context_effects is not None:
            effect = float(context_effects[i])
        else:
            effect = rng.normal(0, scenario.context_sd) if scenario.context_sd else 0.0
        context_gain = scenario.gain + effect
        for policy in POLICIES:
            side = 0 if policy == "isolated" else 1
            signal = _signal_name(workflow, policy, shape) if signals else None
            for seed in range(shape.seeds):
                kind = rng.choice(3, p=_kinds(scenario, side))  # 0 learning, 1 flat, 2 cliff
                true, pre_onset = _true_curve(kind, steps, true_base, trials, context_gain, policy, scenario, rng)
                accuracy = [base, *(rng.binomial(trials, p) / trials for p in true[1:])]
                se = [math.sqrt(a * (1 - a) / trials) for a in accuracy]
                curve = summarize_curve(steps, accuracy, trials, analysis, se)
                record = asdict(curve)
                rise_step = None
                if signal is not None:
                    if kind == 2 and rng.random() < scenario.precedes[side]:
                        rise_step = max(after_window, pre_onset - max(1, (steps[1] - steps[0]) // 2))
                    elif rng.random() < scenario.rise:
                        rise_step = int(rng.integers(after_window, last + 1))
                    values = np.where(updates >= (rise_step or last + 1), 2.0, 1.0)
                    series = pd.Series(values, index=pd.Index(updates, dtype="int64"))
                    found = Signal(signal, "generator", series)
                else:
                    found = None
                record.update(assess(found, curve.cliff_onset, steps, analysis, collapse=curve.signature == "collapse"))
                cell = f"{workflow}-{task}-{scale}-{policy}-s{seed}"
                rows.append({"cell": cell, "workflow": workflow, "task": task, "scale": scale, "policy": policy,
                             "seed": seed, "run": cell, **record})  # fmt: skip
    return PerCell(rows, dict.fromkeys(rows[0] if rows else ["cell"], "object"))


def _signal_name(workflow: str, policy: str, shape: GridShape) -> str | None:
    if policy == "isolated":
        return "amplification" if workflow in shape.parallel else None
    return "share"  # every multi-agent workflow has several roles


def _kinds(scenario: Scenario, side: int) -> list[float]:
    flat, cliff = scenario.flat[side], scenario.cliff[side]
    return [1 - flat - cliff, flat, cliff]


def _true_curve(kind, steps, base, trials, context_gain, policy, scenario, rng) -> tuple[list[float], int | None]:
    """The run's true accuracy at each checkpoint, and (a cliff run) the checkpoint before its onset."""
    last = steps[-1]
    if kind == 1:
        return [base] * len(steps), None
    if kind == 2:
        height = cliff_height(trials)
        peak = int(rng.integers(max(1, len(steps) // 4), max(2, 3 * len(steps) // 4)))  # a checkpoint in the middle
        peak = min(peak, len(steps) - 2)
        true = [base + height * steps[i] / steps[peak] if i <= peak else base for i in range(len(steps))]
        return [min(p, 0.99) for p in true], steps[peak]
    gain = context_gain + (scenario.policy_gain / 2 if policy == "isolated" else -scenario.policy_gain / 2)
    gain += rng.normal(0, scenario.training_sd) if scenario.training_sd else 0.0
    lift = scenario.isolated_lift if policy == "isolated" else 0.0
    true = [base + gain * step / last + (lift if step else 0.0) for step in steps]
    return [min(max(p, 0.01), 0.99) for p in true], None


def study_shapes(experiments: Path, paper: Path) -> dict[str, GridShape]:
    """The grid shapes the calibration is reported for (docs/report.md): the default grid, one of its
    configurations with six seeds, and the paper's matrix with one seed and with three."""
    from matrixrl.config import load_config

    one = ["grid.workflow=[voting]", "grid.task=[arith]", "grid.scale=[tiny-s]", "grid.seed=[0, 1, 2, 3, 4, 5]"]
    return {
        "default grid": GridShape.of(load_config(experiments), "default grid"),
        "one configuration, 6 seeds": GridShape.of(load_config(experiments, sets=one), "one configuration, 6 seeds"),
        "paper.yaml, 1 seed": GridShape.of(load_config(paper), "paper.yaml, 1 seed"),
        "paper.yaml, 3 seeds": GridShape.of(load_config(paper, sets=["grid.seed=[0, 1, 2]"]), "paper.yaml, 3 seeds"),
    }


# --- rates ---------------------------------------------------------------------------------


@dataclass
class Rates:
    """How often each verdict came out, per claim, over ``studies`` synthetic studies."""

    studies: int
    counts: dict[int, Counter] = field(default_factory=dict)

    def rate(self, claim: int, *verdicts: str) -> float:
        return sum(self.counts[claim][v] for v in verdicts) / self.studies

    def decided(self, claim: int) -> float:
        """The share of studies in which the claim was supported or contradicted (under a null: its error rate)."""
        return self.rate(claim, "supported", "contradicted")

    def se(self, rate: float) -> float:
        """The Monte-Carlo standard error of a rate over these studies."""
        return math.sqrt(rate * (1 - rate) / self.studies)


def verdict_rates(
    shape: GridShape, scenario: Scenario, studies: int, seed: int, analysis: Analysis | None = None,
    claims: Sequence[int] = range(1, 8), table=claims_table,
) -> Rates:  # fmt: skip
    """The verdicts of ``claims`` over ``studies`` synthetic studies (seeded by ``seed``: the same
    numbers every time). ``table``: what computes the verdicts from a study's records (the claims
    table; a test passes another rule to see it caught)."""
    analysis = analysis or Analysis()
    rng = np.random.default_rng(seed)
    rates = Rates(studies, {claim: Counter() for claim in claims})
    signals = any(claim in (6, 7) for claim in claims)  # only the mechanism's claims read them
    for _ in range(studies):
        found = table(synthetic_study(shape, scenario, rng, analysis, signals), analysis.confidence, claims)
        verdicts = dict(zip(found["claim"].tolist(), found["verdict"].tolist()))
        for claim in claims:
            rates.counts[claim][verdicts[claim]] += 1
    return rates
