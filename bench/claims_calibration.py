"""How often each claim's verdict rule decides with nothing there, and how often it finds a planted effect.

Synthetic studies with the study's noise (matrixrl.analysis.calibration: binomial
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

Then claim 2 under no effect by its former rule (either F-test at 5%, the context's
with one mean base variance and Satterthwaite's df), which the calibration changed (docs/report.md, "How often the rules err").

    python bench/claims_calibration.py [--studies 2000] [--planted 500] [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import pandas as pd

from matrixrl.analysis.calibration import NO_GAIN, NULL, PLANTED, study_shapes, verdict_rates

REPO = Path(__file__).resolve().parents[1]


def former_claim_2(per_cell, confidence: float, claims) -> pd.DataFrame:
    """Claim 2's verdict by the rule the calibration replaced: either test at 1 − ``confidence`` on its
    own; the context's the nested F-test of the model against policy alone with error MSE + n̄·s̄² (one
    mean base variance s̄²) and Satterthwaite's df_resid·(error/MSE)²."""
    import statsmodels.formula.api as smf
    from scipy.special import fdtrc

    rows = [row for row in per_cell.rows if row["workflow"] != "single" and math.isfinite(row["gain"])]
    context = [axis for axis in ("workflow", "task", "scale") if len({row[axis] for row in rows}) > 1]
    frame = pd.DataFrame({axis: [str(row[axis]) for row in rows] for axis in [*context, "policy"]})
    frame["gain"] = [float(row["gain"]) for row in rows]
    terms = "*".join(f"C({axis})" for axis in context)
    full = smf.ols(f"gain ~ {terms} + C(policy)", frame).fit()
    policy_only, context_only = smf.ols("gain ~ C(policy)", frame).fit(), smf.ols(f"gain ~ {terms}", frame).fit()
    total = float(((frame["gain"] - frame["gain"].mean()) ** 2).sum())
    mse = full.ssr / full.df_resid
    error = mse + len(rows) / len({tuple(row[a] for a in context) for row in rows}) * sum(float(row["base_se"]) ** 2 for row in rows) / len(rows)
    _, p_policy, df_policy = full.compare_f_test(context_only)
    df_context = full.df_model - policy_only.df_model
    ss_context = max(policy_only.ssr - full.ssr, 0.0)
    p_context = float(fdtrc(df_context, full.df_resid * (error / mse) ** 2, ss_context / df_context / error))
    omega_c = max((ss_context - df_context * error) / (total + error), 0.0)
    omega_p = max((context_only.ssr - full.ssr - df_policy * mse) / (total + error), 0.0)
    alpha, decided = 1 - confidence, "inconclusive"
    if p_context < alpha and omega_c > omega_p:
        decided = "supported"
    elif p_policy < alpha and omega_p > omega_c:
        decided = "contradicted"
    return pd.DataFrame({"claim": [2], "verdict": [decided]})


def percent(rate: float, se: float | None = None) -> str:
    return f"{100 * rate:.1f}%" if se is None else f"{100 * rate:.1f} ± {100 * se:.1f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=2000, help="null studies per grid shape (default 2000)")
    parser.add_argument("--planted", type=int, default=500, help="studies per planted effect and grid shape (default 500)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every draw (default 0)")
    args = parser.parse_args()

    shapes = study_shapes(REPO / "experiments.yaml", REPO / "examples" / "paper.yaml")
    started = time.perf_counter()
    print(f"claims calibration: {args.studies} null studies and {args.planted} per planted effect, per grid shape (seed {args.seed})")
    former = {}
    for number, (name, shape) in enumerate(shapes.items()):
        seed = args.seed + 1000 * number
        null = verdict_rates(shape, NULL, args.studies, seed, claims=range(2, 8))
        null.counts.update(verdict_rates(shape, NO_GAIN, args.studies, seed + 500, claims=[1]).counts)
        print()
        print(f"{name}: {shape.describe()}")
        print(f"{'claim':>5}  {'no effect: decided':>18}  {'untestable':>10}  {'planted effect':<40}  {'supported':>13}  {'contradicted':>12}")
        for claim, scenario in PLANTED.items():
            planted = verdict_rates(shape, scenario, args.planted, seed + claim, claims=[claim])
            decided = null.decided(claim)
            power = planted.rate(claim, "supported")
            print(
                f"{claim:>5}  {percent(decided, null.se(decided)):>18}  {percent(null.rate(claim, 'untestable')):>10}  "
                f"{scenario.effect:<40}  {percent(power, planted.se(power)):>13}  {percent(planted.rate(claim, 'contradicted')):>12}"
            )
        if len(shape.contexts) > 1:
            former[name] = verdict_rates(shape, NULL, args.studies, seed, claims=[2], table=former_claim_2)
    print()
    print(f"claim 2 under no effect by its former rule (either F-test at 5%, one mean base variance, Satterthwaite's df), {args.studies} null studies:")
    for name, rates in former.items():
        print(f"  {name}: {percent(rates.decided(2), rates.se(rates.decided(2)))} decided")
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
