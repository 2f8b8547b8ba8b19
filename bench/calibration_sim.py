"""Synthetic studies with the study's noise, to measure how often the claims' rules err.

``bench/claims_calibration.py`` runs it; tests/test_calibration.py imports it from bench/.

The verdict rules of the claims table (``analysis.claims``, docs/report.md) were fixed in
advance; this module measures, by simulation, how often each one decides when nothing
is there (its error rate) and how often it finds what is planted (its power), on grids
of a given shape. A synthetic study is made the way a run makes one, down to the per-cell
records the claims read, and is fed to the real code (``summarize_curve`` for each
cell's curve, ``mechanism.assess`` for its gradient signal, ``claims_table`` or one
claim's own function for the verdicts); nothing is written to disk.

**The noise.** Every multi-agent (workflow, task, scale) is a *context* with a true base
accuracy drawn uniformly from :data:`BASE_RANGE`, and one base evaluation: its accuracy
a binomial draw of ``n_eval × base_samples`` trials, shared by every seed of both modes as
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
from matrixrl.analysis.calibration import GridShape
from matrixrl.analysis.claims import FAMILY, claim_results, claims_table, family_holm
from matrixrl.analysis.curves import summarize_curves
from matrixrl.analysis.mechanism import Signal, assess
from matrixrl.config import Analysis, Config
from matrixrl.config.schema import BASE_SAMPLES_TIMES

BASE_RANGE = (0.25, 0.55)
"""The true base accuracies of the contexts are drawn uniformly from this range."""
POLICIES = ("shared", "isolated")
DECIDED = ("supported", "contradicted")
FALL_DEPTH = 0.20
"""A flat-then-fall run stays at its base for the first half of its checkpoints, then this far below it."""
CRASH_TO = 0.05
"""A crashing run stays at its base for the first half of its checkpoints, then at this accuracy."""
CLIFF_MIN_HEIGHT = 0.15
"""A planted cliff's peak rises at least this far above the base (and 5 SEs of the difference)."""


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
    fall: tuple[float, float] = (0.0, 0.0)
    steady: tuple[float, float] = (0.0, 0.0)
    confound: tuple[tuple[float, float], tuple[float, float]] | None = None
    cliff_height: float | None = None


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

COLLAPSES = replace(NULL, name="collapses", effect="", cliff=(0.0, 0.0), fall=(0.3, 0.0), steady=(0.3, 0.0))
"""Claim 4's second null: no real cliff anywhere, but 60% of isolated runs collapse (half flat then a fall of
:data:`FALL_DEPTH`, half a steady fall) and no shared run does: collapses must not read as cliffs."""

CONFOUNDED = replace(NULL, name="confounded", confound=((0.6, 0.8), (0.1, 0.2)))
"""Claims 6-7's second null: within every configuration the signal says nothing of cliffs, but half the
contexts cliff 60% of the time with signals rising in 80% of runs, the others 10% and 20%."""

EXTRA_NULLS = {4: COLLAPSES, 6: CONFOUNDED, 7: CONFOUNDED}
"""Per claim, the further null its error rate is measured under (docs/report.md, "How often the rules err")."""

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
    scenario's draw ``normal(0, context_sd)`` (a grid's contexts have the effects they have).

    Drawn for all cells at once (numpy) and read by :func:`matrixrl.analysis.curves.summarize_curves`,
    the cliff rule over many curves, and by :func:`signal_records`, the mechanism's verdict for a
    signal that steps up at one update; tests/test_calibration.py checks both against the per-cell
    code (``summarize_curve``, ``mechanism.assess``)."""
    drawn = draw_study(shape, scenario, rng, analysis, signals, context_effects)
    return study_records(shape, drawn, analysis)


@dataclass
class Drawn:
    """A synthetic study's draws, one entry (row) per cell in the shape's order (context, mode, seed)."""

    context: np.ndarray
    side: np.ndarray  # 0 isolated, 1 shared
    seed: np.ndarray
    accuracy: np.ndarray  # cells × checkpoints, the base evaluation first
    trials: np.ndarray
    signal: list  # the signal's name or None
    rise: np.ndarray  # the update at which the signal steps up (0: never)
    base_trials: np.ndarray  # of each cell's base evaluation


def draw_study(shape, scenario, rng, analysis, signals=True, context_effects=None) -> Drawn:
    """The draws of :func:`synthetic_study` (see the module docstring)."""
    steps = np.array(shape.steps, dtype=float)
    contexts, seeds = len(shape.contexts), shape.seeds
    cells = contexts * 2 * seeds
    context = np.repeat(np.arange(contexts), 2 * seeds)
    side = np.tile(np.repeat([1, 0], seeds), contexts)  # POLICIES order: shared, isolated
    seed = np.tile(np.arange(seeds), 2 * contexts)
    trials = np.array([shape.trials[task] for _, task, _ in shape.contexts])[context]
    base_trials = np.array([shape.base_trials(task) for _, task, _ in shape.contexts])
    true_base = rng.uniform(*BASE_RANGE, size=contexts)
    base = rng.binomial(base_trials, true_base) / base_trials
    if context_effects is not None:
        effect = np.asarray(context_effects, dtype=float)
    else:
        effect = rng.normal(0, scenario.context_sd, size=contexts) if scenario.context_sd else np.zeros(contexts)
    # Each run's kind: 0 learning, 1 flat, 2 cliff, 3 flat then a fall.
    cliff_p = np.where(side == 0, scenario.cliff[0], scenario.cliff[1])
    rise_p = np.full(cells, scenario.rise)
    if scenario.confound is not None:
        (cliff_a, rise_a), (cliff_b, rise_b) = scenario.confound
        odd = context % 2 == 1
        cliff_p, rise_p = np.where(odd, cliff_b, cliff_a), np.where(odd, rise_b, rise_a)
    flat_p = np.where(side == 0, scenario.flat[0], scenario.flat[1])
    fall_p = np.where(side == 0, scenario.fall[0], scenario.fall[1])
    steady_p = np.where(side == 0, scenario.steady[0], scenario.steady[1])
    u = rng.random(cells)
    bounds = np.cumsum([cliff_p, flat_p, fall_p, steady_p], axis=0)
    kind = np.select([u < bounds[0], u < bounds[1], u < bounds[2], u < bounds[3]], [2, 1, 3, 4], 0)
    tb = true_base[context]
    last = steps[-1]
    k = len(steps)
    # Learning: linear to base + gain at the last step; isolated runs `isolated_lift` higher after step 0.
    gain = scenario.gain + effect[context] + np.where(side == 0, 0.5, -0.5) * scenario.policy_gain
    gain = gain + (rng.normal(0, scenario.training_sd, size=cells) if scenario.training_sd else 0.0)
    lift = np.where(side == 0, scenario.isolated_lift, 0.0)
    learning = np.clip(tb[:, None] + gain[:, None] * steps / last + lift[:, None] * (steps > 0), 0.01, 0.99)
    # Cliff: up to a real peak at a checkpoint in the middle, back at the base from the next one.
    height = np.array([cliff_height(t) for t in trials]) if scenario.cliff_height is None else np.full(cells, scenario.cliff_height)
    peak = rng.integers(max(1, k // 4), max(2, 3 * k // 4), size=cells)
    peak = np.minimum(peak, k - 2)
    index = np.arange(k)
    ramp = np.where(index[None, :] <= peak[:, None], steps[None, :] / steps[peak][:, None], 0.0)
    cliff = np.minimum(tb[:, None] + height[:, None] * ramp, 0.99)
    # Flat, then from the middle FALL_DEPTH below the base: a fall without a peak.
    fall = np.clip(tb[:, None] - FALL_DEPTH * (index[None, :] >= k // 2), 0.01, 0.99)
    # Steady fall: linear from the base to FALL_DEPTH below it at the last step.
    steady = np.clip(tb[:, None] - FALL_DEPTH * steps[None, :] / last, 0.01, 0.99)
    flat = np.repeat(tb[:, None], k, axis=1)
    true = np.select([kind[:, None] == 0, kind[:, None] == 1, kind[:, None] == 2, kind[:, None] == 3],
                     [learning, flat, cliff, fall], steady)  # fmt: skip
    accuracy = rng.binomial(trials[:, None], true) / trials[:, None]
    accuracy[:, 0] = base[context]
    # Signals: isolated cells of parallel workflows (amplification) and every shared cell (share).
    names = [_signal_name(shape.contexts[c][0], POLICIES[1 - s], shape) if signals else None for c, s in zip(context, side)]
    rise = np.zeros(cells, dtype=int)
    if signals:
        after_window = analysis.mechanism_baseline_steps + 1
        precedes_p = np.where(side == 0, scenario.precedes[0], scenario.precedes[1])
        lead = max(1, int(steps[1] - steps[0]) // 2)
        a, b = rng.random(cells), rng.random(cells)
        anywhere = rng.integers(after_window, int(last) + 1, size=cells)
        preceding = np.maximum(after_window, steps[peak].astype(int) - lead)
        rise = np.where((kind == 2) & (a < precedes_p), preceding, np.where(b < rise_p, anywhere, 0))
        rise = np.where([name is not None for name in names], rise, 0)
    return Drawn(context, side, seed, accuracy, trials, names, rise, base_trials[context])


def study_records(shape: GridShape, drawn: Drawn, analysis: Analysis) -> PerCell:
    """The per-cell records of ``drawn`` as the claims read them."""
    summary = summarize_curves(shape.steps, drawn.accuracy, drawn.trials, analysis, drawn.base_trials)
    mechanism = signal_records(drawn.signal, drawn.rise, summary, list(shape.steps), analysis)
    names = list(summary)
    columns = [value if isinstance(value := summary[name], list) else value.tolist() for name in names]
    rows = []
    for i in range(len(drawn.context)):
        workflow, task, scale = shape.contexts[drawn.context[i]]
        policy = POLICIES[1 - drawn.side[i]]
        cell = f"{workflow}-{task}-{scale}-{policy}-s{drawn.seed[i]}"
        record = {name: column[i] for name, column in zip(names, columns)}
        rows.append({"cell": cell, "workflow": workflow, "task": task, "scale": scale, "policy": policy,
                     "seed": int(drawn.seed[i]), "run": cell, **record, **mechanism[i]})  # fmt: skip
    return PerCell(rows, dict.fromkeys(rows[0] if rows else ["cell"], "object"))


def _detection_lag(analysis: Analysis, updates: int) -> int | None:
    """Updates from a signal's step up (1 → 2) to the update at which ``mechanism.assess`` finds it risen
    (its trailing mean past the baseline's 1 + ``mechanism_rise``); None when it never does."""
    key = (analysis.mechanism_baseline_steps, analysis.mechanism_rise, analysis.mechanism_smooth_steps, updates)
    if key not in _LAGS:
        _LAGS[key] = _lag(analysis, updates)
    return _LAGS[key]


_LAGS: dict[tuple, int | None] = {}


def _lag(analysis: Analysis, updates: int) -> int | None:
    start = analysis.mechanism_baseline_steps + 1
    index = np.arange(1, updates + 1)
    series = pd.Series(np.where(index >= start, 2.0, 1.0), index=pd.Index(index, dtype="int64"))
    found = assess(Signal("share", "generator", series), None, [0, updates], analysis)["rise_step"]
    return None if found is None else int(found) - start


def signal_records(names, rise, summary: dict, steps: list[int], analysis: Analysis) -> list[dict]:
    """``mechanism.assess``'s fields per cell for a signal named ``names[i]`` (None: no signal) that
    steps from 1 to 2 at update ``rise[i]`` (0: never), on the cell's summarized curve."""
    last = steps[-1]
    lag = _detection_lag(analysis, last)
    k = analysis.mechanism_baseline_steps
    out = []
    for i, name in enumerate(names):
        record = {"signal": None, "signal_role": None, "baseline": None, "change": None, "rose": None,
                  "rise_step": None, "lead": None, "verdict": "n/a"}  # fmt: skip
        if name is None or last <= k:
            out.append(record)
            continue
        onset = summary["cliff_onset"][i]
        end = last if onset is None else onset
        record.update(signal=name, signal_role="generator", baseline=1.0)
        if end <= k:
            out.append(record)  # the onset falls inside the baseline window
            continue
        found = int(rise[i]) + lag if rise[i] and lag is not None and int(rise[i]) + lag <= end else None
        record.update(rose=found is not None, rise_step=found)
        if onset is None:
            record["verdict"] = "collapse" if summary["signature"][i] == "collapse" else "no cliff"
        elif found is None:
            record["verdict"] = "absent"
        else:
            record["lead"] = onset - found
            record["verdict"] = "precedes" if found <= summary["pre_onset"][i] else "coincides"
        out.append(record)
    return out


def _signal_name(workflow: str, policy: str, shape: GridShape) -> str | None:
    if policy == "isolated":
        return "amplification" if workflow in shape.parallel else None
    return "share"  # every multi-agent workflow has several roles


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
    """How often each verdict came out, per claim, over ``studies`` synthetic studies; ``family`` and
    ``family_holm``: in how many at least one claim of 2-7 among those tested was decided, each at its
    own level and under Holm's procedure across them (``claims.family_holm``)."""

    studies: int
    counts: dict[int, Counter] = field(default_factory=dict)
    family: int = 0
    family_holm: int = 0

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
        study = synthetic_study(shape, scenario, rng, analysis, signals)
        if table is claims_table:  # the same rows, without a DataFrame per study
            results = claim_results(study, analysis.confidence, claims, brief=True)
            verdicts = {claim: row["verdict"] for claim, row in results.items()}
            held = family_holm(results, 1 - analysis.confidence)
            rates.family += any(verdicts[c] in DECIDED for c in verdicts if c in FAMILY)
            rates.family_holm += any(held[c]["verdict"] in DECIDED for c in held if c in FAMILY)
        else:
            found = table(study, analysis.confidence, claims)
            verdicts = dict(zip(found["claim"].tolist(), found["verdict"].tolist()))
        for claim in claims:
            rates.counts[claim][verdicts[claim]] += 1
    return rates


# --- the cliff rule on single runs ----------------------------------------------------------------

LABELLED = {
    "flat, then a fall of 0.20": "fall",
    "a steady fall of 0.20": "steady",
    "flat (noise alone)": "flat",
    "a dip of 0.20, back to the base, then a fall of 0.20": "dip-fall",
    "a dip of 0.20, then back to the base": "dip",
    "flat, then a crash to 0.05": "crash",
    "a rise of 0.15, then back to the base": "rise",
}
"""The runs whose ``cliff`` label :func:`cliff_label_rate` measures: what each does, and its kind."""


def labelled_runs(steps: Sequence[int], trials: int, kind: str, runs: int, seed: int, height: float = CLIFF_MIN_HEIGHT,
                  base_times: int = BASE_SAMPLES_TIMES) -> np.ndarray:  # fmt: skip
    """``runs`` drawn curves of ``kind`` (:data:`LABELLED`) on ``steps`` (runs × checkpoints), each
    evaluation a binomial draw of ``trials`` (the base's of ``base_times`` as many, drawn last: the other
    readings are the same whatever it is) around a base drawn from :data:`BASE_RANGE`. A ``rise``
    climbs linearly to ``height`` above the base at a checkpoint in the middle of the run (as a planted
    cliff's) and is back at the base from the next one on; a ``dip`` spends the first tenth of the run
    (one reading at least) :data:`FALL_DEPTH` below the base, then is back at it; a ``crash`` stays at the
    base for half the run, then at :data:`CRASH_TO`."""
    rng = np.random.default_rng(seed)
    step = np.asarray(steps, dtype=float)
    k, last = len(step), step[-1]
    index = np.arange(k)
    base = rng.uniform(*BASE_RANGE, size=runs)[:, None]
    if kind == "fall":
        true = base - FALL_DEPTH * (index >= k // 2)
    elif kind == "steady":
        true = base - FALL_DEPTH * step / last
    elif kind == "flat":
        true = np.repeat(base, k, axis=1)
    elif kind == "crash":  # readings near 0 have a small variance: the base's ratio to the readings' reads high
        true = np.where(index >= k // 2, CRASH_TO, np.repeat(base, k, axis=1))
    elif kind in ("dip", "dip-fall"):
        true = base - FALL_DEPTH * ((index >= 1) & (index <= max(1, k // 10)))
        true = true - FALL_DEPTH * (index >= k // 2) * (kind == "dip-fall")
    else:
        peak = np.minimum(rng.integers(max(1, k // 4), max(2, 3 * k // 4), size=runs), k - 2)
        true = base + height * np.where(index <= peak[:, None], step / step[peak][:, None], 0.0)
    true = np.clip(true, 0.01, 0.99)
    accuracy = rng.binomial(trials, true) / trials
    if base_times != 1:
        accuracy[:, 0] = rng.binomial(trials * base_times, true[:, 0]) / (trials * base_times)
    return accuracy


def cliff_label_rate(steps: Sequence[int], trials: int, kind: str, runs: int, seed: int, analysis: Analysis | None = None,
                     height: float = CLIFF_MIN_HEIGHT, base_times: int = BASE_SAMPLES_TIMES) -> float:  # fmt: skip
    """The share of :func:`labelled_runs` that the cliff rule labels ``cliff``."""
    accuracy = labelled_runs(steps, trials, kind, runs, seed, height, base_times)
    summary = summarize_curves(steps, accuracy, np.full(runs, trials), analysis or Analysis(), np.full(runs, trials * base_times))
    return float(summary["cliff"].mean())


