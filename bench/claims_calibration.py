"""How often each claim's verdict rule decides with nothing there, and how often it finds a planted effect.

Synthetic studies with the study's noise (bench/calibration_sim.py: binomial
evaluations of n_eval × samples trials around true curves, one base evaluation per
context shared by its seeds and both modes, seeds as independent trainings, cliffs and
gradient signals planted or not), fed to the real claims code; nothing is written to
disk. Per grid shape (the default grid; one of its configurations with six seeds;
examples/paper.yaml's matrix with one seed and with three) and per claim:

- under no effect (the null: 30% of runs cliff, 20% stay flat, signals rise in half the
  runs at random, all alike in both modes), the share of studies in which the claim was
  supported or contradicted: its error rate, which must be at most 5% (the rules' level)
  within the Monte-Carlo error, the ± one standard error shown; and the share untestable;
- with that claim's effect planted on the same null, the share supported (its power)
  and contradicted (the wrong way).

Under the further nulls of issue 51 (``calibration_sim.EXTRA_NULLS``: collapses in isolated runs only
for claim 4, configurations that differ in cliffs and signals for claims 6-7), the share decided;
under the joint null, the share of studies with at least one of claims 2-7 decided, each at its
level and under Holm's procedure. First, the cliff rule on single runs of each kind
(``calibration_sim.LABELLED``) per schedule and evaluation size, and the height a rise needs to be
found in 80%.

Then claim 2 under no effect by its former rule (either F-test at 5%, the context's
with one mean base variance and Satterthwaite's df), which the calibration changed (docs/report.md, "How often the rules err").

With --design-check, instead: claim 2's design line (``matrixrl plan``: "80% power if the
context explains ω² X or more of the gains' variance (evaluation noise alone; Holm)", from
the closed form ``analysis.power.context_power``) against --planted synthetic studies per
grid shape with two or more contexts. As the line has it, every run learns and trainings do
not spread (evaluation noise alone), and the contexts' effects, fixed as a grid's are (the
same spread in every study, in an order drawn per study), explain exactly the line's ω² of a
cell's gain variance: ω² = σ²/(σ² + s̄_b² + s̄_f²), the population value of the claims' ω²
(its denominator SS_total + MSE + n̄·s̄² is the cells' whole variance), with the simulator's
binomial variances in closed form (:func:`planted_sd`). Printed: the line's ω², the contexts'
SD that plants it, claim 2's supported rate ± SE, the closed form's power there (80%), their
difference ± SE, and the mean ω² the claims table showed (an estimate of the planted one).

    python bench/claims_calibration.py [--studies 1000] [--planted 300] [--runs 2000] [--seed 0]
    python bench/claims_calibration.py --design-check [--planted 1000] [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from calibration_sim import (
    BASE_RANGE, EXTRA_NULLS, LABELLED, NO_GAIN, NULL, PLANTED, cliff_label_rate, study_shapes, synthetic_study, verdict_rates,
)  # fmt: skip
from matrixrl.analysis.calibration import GridShape
from matrixrl.analysis.claims import claims_table
from matrixrl.analysis.power import POWER, context_omega2_needed, context_power
from matrixrl.config import Analysis

REPO = Path(__file__).resolve().parents[1]


def former_claim_2(per_cell, confidence: float, claims) -> pd.DataFrame:
    """Claim 2's verdict by the rule the calibration replaced: either test at 1 − ``confidence`` on its
    own; the context's the nested F-test of the model against policy alone with error MSE + n̄·s̄² (one
    mean base variance s̄²) and Satterthwaite's df_resid·(error/MSE)². Least squares in numpy (the
    cell-means model of the contexts is the full factorial's), so that a test can afford 1000 studies."""
    from scipy.special import fdtrc

    rows = [row for row in per_cell.rows if row["workflow"] != "single" and math.isfinite(row["gain"])]
    context = [axis for axis in ("workflow", "task", "scale") if len({row[axis] for row in rows}) > 1]
    keys = [tuple(row[axis] for axis in context) for row in rows]
    codes = {key: i for i, key in enumerate(sorted(set(keys)))}
    indicators = np.eye(len(codes))[[codes[key] for key in keys]]
    isolated = np.array([[row["policy"] == "isolated"] for row in rows], dtype=float)
    y = np.array([float(row["gain"]) for row in rows])

    def ssr(x: np.ndarray) -> tuple[float, int]:
        coefficients, _, rank, _ = np.linalg.lstsq(x, y, rcond=None)
        residual = y - x @ coefficients
        return float(residual @ residual), int(rank)

    full, full_rank = ssr(np.hstack([indicators, isolated]))
    context_only, context_rank = ssr(indicators)
    policy_only, policy_rank = ssr(np.hstack([np.ones((len(y), 1)), isolated]))
    df_resid = len(y) - full_rank
    total = float(((y - y.mean()) ** 2).sum())
    mse = full / df_resid
    error = mse + len(rows) / len(codes) * sum(float(row["base_se"]) ** 2 for row in rows) / len(rows)
    df_policy = full_rank - context_rank
    p_policy = float(fdtrc(df_policy, df_resid, (context_only - full) / df_policy / mse))
    df_context = full_rank - policy_rank
    ss_context = max(policy_only - full, 0.0)
    p_context = float(fdtrc(df_context, df_resid * (error / mse) ** 2, ss_context / df_context / error))
    omega_c = max((ss_context - df_context * error) / (total + error), 0.0)
    omega_p = max((context_only - full - df_policy * mse) / (total + error), 0.0)
    alpha, decided = 1 - confidence, "inconclusive"
    if p_context < alpha and omega_c > omega_p:
        decided = "supported"
    elif p_policy < alpha and omega_p > omega_c:
        decided = "contradicted"
    return pd.DataFrame({"claim": [2], "verdict": [decided]})


# --- claim 2's design line against the simulation (--design-check) ---------------------------------


def design_scenario(context_sd: float):
    """Claim 2's effect as its design line states it: the contexts' gains spread by ``context_sd``, with
    evaluation noise alone (every run learns, trainings do not spread; no policy effect)."""
    return replace(NULL, name="design", effect=f"contexts' gains SD {context_sd:.4f}, evaluation noise alone",
                   context_sd=context_sd, cliff=(0.0, 0.0), flat=(0.0, 0.0), training_sd=0.0)  # fmt: skip


def line_omega2(shape: GridShape, confidence: float) -> float:
    """The ω² claim 2's design line states 80% power at for this shape (``analysis.design``: cells, contexts,
    the residual's degrees of freedom)."""
    contexts, cells = len(shape.contexts), len(shape.contexts) * 2 * shape.seeds
    return context_omega2_needed(contexts, cells / contexts, cells - contexts - 1, confidence, base_ratio=1 / shape.base_times)


def line_power(shape: GridShape, omega2: float, confidence: float) -> float:
    """The closed form's power at ``omega2`` for this shape (what the design line is computed from)."""
    contexts, cells = len(shape.contexts), len(shape.contexts) * 2 * shape.seeds
    return context_power(contexts, cells / contexts, cells - contexts - 1, omega2, confidence, base_ratio=1 / shape.base_times)


SHOWN = re.compile(r"ω² context (-?\d+\.\d+)")


def planted_effects(contexts: int) -> np.ndarray:
    """The contexts' effects in SDs: the normal quantiles at (i + ½)/C, with mean 0 and SD 1 over the C
    contexts (divisor C)."""
    from statistics import NormalDist

    z = np.array([NormalDist().inv_cdf((i + 0.5) / contexts) for i in range(contexts)])
    return (z - z.mean()) / z.std()


def context_studies(shape: GridShape, context_sd: float, studies: int, seed: int, analysis: Analysis | None = None):
    """``(omega2, supported)`` arrays, one entry per synthetic study of :func:`design_scenario` with the
    contexts' effects :func:`planted_effects` times ``context_sd`` (in an order drawn per study): the
    context's ω² as the claims table shows it (its ``evidence``, 0 or above, 2 decimals; 0 without one)
    and whether claim 2 was supported."""
    analysis = analysis or Analysis()
    rng = np.random.default_rng(seed)
    scenario = design_scenario(context_sd)
    effects = planted_effects(len(shape.contexts))
    omega2, supported = [], []
    for _ in range(studies):
        # Planted, not drawn: the effects spread by exactly context_sd in every study, as a grid's
        # contexts have the effects they have (what the design line's ω² is of).
        study = synthetic_study(shape, scenario, rng, analysis, signals=False, context_effects=context_sd * rng.permutation(effects))
        row = claims_table(study, analysis.confidence, [2]).iloc[0]
        shown = SHOWN.search(row["evidence"] or "")
        omega2.append(float(shown.group(1)) if shown else 0.0)
        supported.append(row["verdict"] == "supported")
    return np.array(omega2), np.array(supported)


def planted_sd(shape: GridShape, omega2: float) -> float:
    """The contexts' SD whose effects explain ``omega2`` of a cell's gain variance in these synthetic studies,
    exactly: ω² = σ²/(σ² + s̄_b² + s̄_f²), the design line's (and the claims' ω²'s, as its denominator has
    it), with σ the contexts' SD (:func:`planted_effects`, exact in every study) and s̄_b², s̄_f² the
    expected binomial variances of a base and a final evaluation over the contexts: E[p(1 − p)]/T (the base's
    T ``base_times`` a final's), the
    base p uniform on BASE_RANGE and the final NULL.gain and the context's effect above it, which takes
    σ² off E[p(1 − p)]."""
    lo, hi = BASE_RANGE

    def p_q(shift: float) -> float:  # E[p(1 − p)] for p uniform on [lo + shift, hi + shift]
        mean = (lo + hi) / 2 + shift
        return mean * (1 - mean) - (hi - lo) ** 2 / 12

    per_trial = float(np.mean([1 / shape.trials[task] for _, task, _ in shape.contexts]))
    base = p_q(0.0) / shape.base_times  # the base evaluation's trials are base_times a checkpoint's
    variance = omega2 * per_trial * (base + p_q(NULL.gain)) / (1 - omega2 + omega2 * per_trial)
    return math.sqrt(variance)


@dataclass
class DesignCheck:
    """Claim 2's design line on one shape against ``studies`` simulated studies with its ω² planted."""

    shape: GridShape
    line: float  # the line's ω² (80% power by the closed form), planted
    context_sd: float  # the contexts' SD that plants it (planted_sd)
    studies: int
    shown: float  # the mean ω² of the context that the claims table showed
    shown_se: float
    supported: float  # claim 2's supported rate
    supported_se: float
    closed_form: float  # the closed form's power at the line's ω² (80%, to its bisection)

    @property
    def agrees(self) -> bool:
        """The simulated rate within 2 of its SEs of the closed form's."""
        return abs(self.supported - self.closed_form) <= 2 * self.supported_se


def design_check(shape: GridShape, studies: int, seed: int, analysis: Analysis | None = None, omega2: float | None = None) -> DesignCheck:
    """Plants, on ``shape``, the contexts' spread that explains claim 2's design line's ω² (or ``omega2``) of the
    gains' variance, and measures claim 2's supported rate there over ``studies`` synthetic studies."""
    analysis = analysis or Analysis()
    line = line_omega2(shape, analysis.confidence) if omega2 is None else omega2
    context_sd = planted_sd(shape, line)
    shown, supported = context_studies(shape, context_sd, studies, seed, analysis)
    rate = float(supported.mean())
    return DesignCheck(shape, line, context_sd, studies, float(shown.mean()), float(shown.std(ddof=1)) / math.sqrt(studies),
                       rate, math.sqrt(rate * (1 - rate) / studies), line_power(shape, line, analysis.confidence))  # fmt: skip


def print_design_checks(shapes: dict[str, GridShape], studies: int, seed: int) -> None:
    started = time.perf_counter()
    print(f"claim 2's design line against {studies} synthetic studies per grid shape (seed {seed}), evaluation noise alone:")
    print(f"{'grid shape':<20}  {'line: ω²':>8}  {'planted: contexts SD':>20}  {'supported':>13}  {'closed form':>11}  "
          f"{'difference':>15}  {'ω² shown':>13}")  # fmt: skip
    for number, (name, shape) in enumerate(shapes.items()):
        if len(shape.contexts) < 2:
            continue
        found = design_check(shape, studies, seed + 1000 * number)
        difference = f"{100 * (found.supported - found.closed_form):+.1f} ± {100 * found.supported_se:.1f}%"
        print(f"{name:<20}  {found.line:>8.3f}  {found.context_sd:>20.4f}  {percent(found.supported, found.supported_se):>13}  "
              f"{percent(found.closed_form):>11}  {difference:>15}  {found.shown:>6.3f} ± {found.shown_se:.3f}"
              f"{'' if found.agrees else '  beyond 2 SE'}")  # fmt: skip
    print(f"(the contexts' effects planted as a grid's are, fixed, so that they explain the line's ω² of the gains' variance; "
          f"closed form: its power there; ω² shown: the claims table's mean; {time.perf_counter() - started:.0f} s)")


def percent(rate: float, se: float | None = None) -> str:
    return f"{100 * rate:.1f}%" if se is None else f"{100 * rate:.1f} ± {100 * se:.1f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=1000, help="studies per null and grid shape (default 1000)")
    parser.add_argument("--planted", type=int, default=300, help="studies per planted effect and grid shape (default 300)")
    parser.add_argument("--runs", type=int, default=2000, help="runs per kind for the cliff rule's labels (default 2000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every draw (default 0)")
    parser.add_argument("--design-check", action="store_true",
                        help="instead: claim 2's design line against --planted simulated studies per grid shape")  # fmt: skip
    args = parser.parse_args()

    shapes = study_shapes(REPO / "experiments.yaml", REPO / "examples" / "paper.yaml")
    if args.design_check:
        print_design_checks(shapes, args.planted, args.seed)
        return
    started = time.perf_counter()
    print_labels(shapes, args.runs, args.seed)
    print()
    print(f"claims calibration: {args.studies} studies per null and {args.planted} per planted effect, per grid shape (seed {args.seed})")
    former, family = {}, {}
    for number, (name, shape) in enumerate(shapes.items()):
        seed = args.seed + 1000 * number
        null = verdict_rates(shape, NULL, args.studies, seed, claims=range(2, 8))
        family[name] = null
        null.counts.update(verdict_rates(shape, NO_GAIN, args.studies, seed + 500, claims=[1]).counts)
        extra = {claim: verdict_rates(shape, scenario, args.studies, seed + 600 + claim, claims=[claim])
                 for claim, scenario in EXTRA_NULLS.items()}  # fmt: skip
        print()
        print(f"{name}: {shape.describe()}")
        print(f"{'claim':>5}  {'no effect: decided':>18}  {'untestable':>10}  {'further null: decided':>21}  "
              f"{'planted effect':<40}  {'supported':>13}  {'contradicted':>12}")  # fmt: skip
        for claim, scenario in PLANTED.items():
            planted = verdict_rates(shape, scenario, args.planted, seed + claim, claims=[claim])
            decided = null.decided(claim)
            power = planted.rate(claim, "supported")
            further = f"{EXTRA_NULLS[claim].name} {percent(extra[claim].decided(claim), extra[claim].se(extra[claim].decided(claim)))}" if claim in extra else ""
            print(
                f"{claim:>5}  {percent(decided, null.se(decided)):>18}  {percent(null.rate(claim, 'untestable')):>10}  {further:>21}  "
                f"{scenario.effect:<40}  {percent(power, planted.se(power)):>13}  {percent(planted.rate(claim, 'contradicted')):>12}"
            )
        if len(shape.contexts) > 1:
            former[name] = verdict_rates(shape, NULL, args.studies, seed, claims=[2], table=former_claim_2)
    print()
    print(f"the family (claims 2-7) under no effect, {args.studies} studies: at least one decided, each claim at 5% / Holm across them:")
    for name, rates in family.items():
        raw, holm = rates.family / rates.studies, rates.family_holm / rates.studies
        print(f"  {name}: {percent(raw, rates.se(raw))} / {percent(holm, rates.se(holm))}")
    print()
    print(f"claim 2 under no effect by its former rule (either F-test at 5%, one mean base variance, Satterthwaite's df), {args.studies} null studies:")
    for name, rates in former.items():
        print(f"  {name}: {percent(rates.decided(2), rates.se(rates.decided(2)))} decided")
    print(f"({time.perf_counter() - started:.0f} s)")


def print_labels(shapes: dict[str, GridShape], runs: int, seed: int) -> None:
    """The share of single runs of each kind that the cliff rule labels ``cliff``, per schedule and evaluation size."""
    schedules = {len(shape.steps): shape.steps for shape in shapes.values()}
    print(f"the cliff rule on single runs ({runs} a kind, seed {seed}): the share labelled cliff (± SE)")
    print(f"{'checkpoints':>11}  {'trials':>6}  " + "  ".join(f"{what:>38}" for what in LABELLED))
    for checkpoints, steps in sorted(schedules.items()):
        for trials in (128, 512, 1000):
            rates = [cliff_label_rate(steps, trials, kind, runs, seed) for kind in LABELLED.values()]
            print(f"{checkpoints:>11}  {trials:>6}  " + "  ".join(f"{percent(r, math.sqrt(r * (1 - r) / runs)):>38}" for r in rates))
    for checkpoints, steps in sorted(schedules.items()):
        for trials in (128, 512):
            height = next(h / 100 for h in range(15, 60) if cliff_label_rate(steps, trials, "rise", runs, seed, height=h / 100) >= 0.8)
            print(f"  {checkpoints} checkpoints, {trials} trials: a rise then back to the base is found in 80% from a height of {height:.2f}")


if __name__ == "__main__":
    main()
