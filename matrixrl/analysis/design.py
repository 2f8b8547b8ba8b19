"""What a grid's claims table can decide, before it runs (``matrixrl plan``, ``Study.design()``).

Per claim: the units its test will count on this grid (counted as the claims count them), whether
any result can reach a verdict, and the smallest effect it detects with 80% power, from
``analysis.power`` (docs/report.md, "What a grid can decide"). Nothing is read but the
configuration. The lines are kept in ``$XDG_CACHE_HOME/matrixrl/design`` under a digest of the counts
and the analysis code, so a replan reads them instead of importing scipy (docs/performance.md).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from matrixrl.analysis.power import (
    CALM_RISES, CLIFF_SHARES, DRAWS, PRECEDES, SHARED_CLIFFS, cliff_rate_needed, context_omega2_needed, evaluation_sd,
    failure_power, failure_rate_needed, fewest_unanimous, peak_effect_needed, policy_difference_needed, rate_needed,
    sign_share_needed, sign_threshold, stratified_power,
)  # fmt: skip
from matrixrl.config import Config

HEADER = "What the claims table can decide on this grid (at 80% power; docs/report.md, \"What a grid can decide\"):"


def family_line(config: Config) -> str:
    """The line under the claims' lines: which of their powers hold under the family setting
    (``analysis.family``). Each line is its claim at its own level; Holm's procedure across claims
    2-7 tests the smallest p at 5%/6 and the largest at 5%, so there each line's power is the most
    the claim can have."""
    alpha = 1 - config.analysis.confidence
    first = f"{100 * alpha / 6:.2g}%"
    if config.analysis.family == "holm":
        return (f"Under Holm across claims 2-7 (analysis.family: holm) each of these powers is the most a claim has: "
                f"the first claim decided needs p under {first} (5%/6), the last under {100 * alpha:.2g}%.")  # fmt: skip
    return (f"Each power is its claim's at its own level (analysis.family: none); under Holm across claims 2-7 "
            f"(--family holm) it is the most a claim has: the first decided needs p under {first} (5%/6).")  # fmt: skip


@dataclass(frozen=True)
class ClaimDesign:
    """One claim on one grid: ``units`` its test counts, whether a verdict is ``possible``, and the ``line`` plan prints."""

    claim: int
    units: int
    possible: bool
    line: str


def grid_design(config: Config) -> list[ClaimDesign]:
    """Per claim, 1 to 7, what ``config``'s selected grid can decide (see the module docstring)."""
    from matrixrl import grid as G
    from matrixrl.workflows import WORKFLOWS

    confidence = config.analysis.confidence
    cells = [cell for cell in G.cells(config) if len(WORKFLOWS[cell.workflow].roles) > 1]  # multi-agent
    modes = {cell.policy for cell in cells}
    contexts = Counter((cell.workflow, cell.task, cell.scale) for cell in cells)
    configurations: dict[tuple, dict[str, set]] = {}
    for cell in cells:
        key = (cell.workflow, cell.task, cell.scale, cell.sweep)
        configurations.setdefault(key, {}).setdefault(cell.policy, set()).add(cell.seed)
    paired = [min(len(seeds["isolated"] & seeds["shared"]), 99) for seeds in configurations.values() if {"isolated", "shared"} <= set(seeds)]
    paired = [seeds for seeds in paired if seeds]
    parallel = list(dict.fromkeys(cell.workflow for cell in cells if _parallel(WORKFLOWS[cell.workflow])))
    amplified = Counter((c.workflow, c.task, c.scale, c.sweep) for c in cells if c.policy == "isolated" and _parallel(WORKFLOWS[c.workflow]))
    shared = Counter((c.workflow, c.task, c.scale, c.sweep) for c in cells if c.policy == "shared")
    trials = _trials(config, {cell.task for cell in cells})
    # Claims 4-5 count a sweep's configurations that share one base evaluation as one unit (analysis.claims).
    by_base: dict[tuple, int] = {}
    for (workflow, task, scale, _), seeds in configurations.items():
        if {"isolated", "shared"} <= set(seeds):
            common = len(seeds["isolated"] & seeds["shared"])
            if common:
                by_base[(workflow, task, scale)] = min(by_base.get((workflow, task, scale), 99), common)
    base_ratio = config.eval.samples / config.eval.base_samples_in_effect  # a base evaluation's variance, a checkpoint's 1
    inputs = {
        "cells": len(cells), "contexts": sorted([list(k), n] for k, n in contexts.items()), "modes": sorted(modes), "base_ratio": base_ratio,
        "trials": trials, "confidence": confidence, "paired": paired, "by_base": list(by_base.values()),
        "amplified": sorted([[str(x) for x in k], n] for k, n in amplified.items()),
        "shared": sorted([[str(x) for x in k], n] for k, n in shared.items()), "parallel": parallel,
    }  # fmt: skip
    path = _cache_path(inputs)
    try:
        return [ClaimDesign(**line) for line in json.loads(path.read_text())]
    except (OSError, ValueError, TypeError):
        pass
    lines = [
        _gain(len(contexts), confidence),
        _context(cells, contexts, modes, trials, confidence, base_ratio),
        _peaks(paired, trials, confidence),
        _cliffs(list(by_base.values()), confidence),
        _failures(list(by_base.values()), confidence),
        _mechanism(6, amplified, "isolated", "an amplification", f" ({', '.join(parallel)})" if parallel else "", confidence),
        _mechanism(7, shared, "shared", "a share", "", confidence),
    ]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps([asdict(line) for line in lines]))
        temporary.replace(path)
    except OSError:  # a read-only home: the lines, uncached
        pass
    return lines


def _cache_path(inputs: dict) -> Path:
    """Where the lines for ``inputs`` are kept: named by a digest of them and of the analysis code's
    source (a change to any rule or closed form makes new lines)."""
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode())
    for source in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(source.read_bytes())
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "matrixrl" / "design" / f"{digest.hexdigest()[:32]}.json"


def _parallel(workflow) -> tuple[str, ...]:
    """The roles of ``workflow`` played by several agents at once (none for a plugin's that does not say)."""
    return getattr(workflow, "parallel_roles", ())


def _plural(n: int, word: str, plural: str | None = None) -> str:
    return f"{n} {word if n == 1 else plural or word + 's'}"


def _gain(contexts: int, confidence: float) -> ClaimDesign:
    if not contexts:
        return ClaimDesign(1, 0, False, "claim 1: no multi-agent workflow: untestable")
    k = sign_threshold(contexts, confidence)
    units = _plural(contexts, "workflow-task-scale")
    if k is None:
        return ClaimDesign(1, contexts, False, f"claim 1: {units}, one unit each (seeds and modes share its base); "
                           f"a sign test needs at least {fewest_unanimous(confidence)}: no verdict possible")  # fmt: skip
    share = sign_share_needed(contexts, confidence)
    decides = (f"supported only if all {contexts} gain, contradicted only if none does" if k == contexts
               else f"supported if {k} or more of {contexts} gain, contradicted if {contexts - k} or fewer")  # fmt: skip
    return ClaimDesign(1, contexts, True, f"claim 1: {units}, one unit each (seeds and modes share its base): {decides}; "
                       f"80% power if each gains with probability {share:.2f} or more")  # fmt: skip


def _trials(config: Config, tasks: set[str]) -> list[int]:
    """The sizes of the tasks' evaluations (n_eval × samples), distinct and sorted; empty where a task
    evaluates its whole split (n_eval: null), whose size plan does not read."""
    sizes = [config.tasks[task].n_eval for task in tasks]
    if None in sizes:
        return []
    return sorted({size * config.eval.samples for size in sizes})


def _context(cells, contexts: Counter, modes: set, trials: list[int], confidence: float, base_ratio: float) -> ClaimDesign:
    if len(modes) < 2:
        return ClaimDesign(2, len(cells), False, "claim 2: one policy mode: untestable")
    if len(contexts) < 2:
        return ClaimDesign(2, len(cells), False, "claim 2: one workflow, task and scale: untestable")
    dof = len(cells) - len(contexts) - 1
    start = f"claim 2: {len(cells)} cells in {len(contexts)} contexts"
    if dof < 1:
        return ClaimDesign(2, len(cells), False, f"{start}: no residual degrees of freedom, no verdict possible (more seeds)")
    omega2 = context_omega2_needed(len(contexts), len(cells) / len(contexts), dof, confidence, base_ratio=base_ratio)
    # Evaluations of different sizes: the closed form takes every context's noise alike, the test weighs each by its
    # own; in synthetic studies of the paper's matrix (64 and 500 problems) it had 75% (one seed) and 88% (three)
    # power at this ω² (docs/report.md, "What a grid can decide").
    unequal = (f"; its tasks' evaluations differ ({' and '.join(map(str, trials))} trials), which this takes alike: "
               "approximate (docs/report.md)") if len(trials) > 1 else ""  # fmt: skip
    policy = ""
    if trials:
        needed = [policy_difference_needed(len(cells), dof, evaluation_sd(size), confidence) for size in trials]
        points = " and ".join(f"{100 * d:.1f} points at {size} trials" for d, size in zip(needed, trials) if d is not None)
        policy = (f"; its policy test (within contexts), 80% power at a mean gain difference between the modes of "
                  f"{points} (evaluation noise alone, accuracy 0.5; Holm)")  # fmt: skip
    return ClaimDesign(2, len(cells), True, f"{start}, {dof} residual degrees of freedom: 80% power if the context "
                       f"explains ω² {omega2:.2f} or more of the gains' variance (evaluation noise alone; Holm){unequal}{policy}")  # fmt: skip


def _seeds(paired: list[int]) -> str:
    seeds = sorted(set(paired))
    return _plural(seeds[0], "seed") if len(seeds) == 1 else f"{seeds[0]}–{seeds[-1]} seeds"


def _peaks(paired: list[int], trials: list[int], confidence: float) -> ClaimDesign:
    if not paired:
        return ClaimDesign(3, 0, False, "claim 3: no configuration with both modes: untestable")
    units, what = (len(paired), "configurations") if len(paired) > 1 else (paired[0], "seed pairs of one configuration")
    effect = peak_effect_needed(units, confidence)
    start = f"claim 3: {_plural(len(paired), 'configuration')} with both modes × {_seeds(paired)}"
    if effect is None:
        return ClaimDesign(3, units, False, f"{start}: no verdict possible: the sign-flip test needs {fewest_unanimous(confidence)} "
                           f"{what} or more, this grid has {units}")  # fmt: skip
    points = ""
    if trials:
        # A unit's SD from evaluation alone: two peaks' binomial SDs, averaged over its seeds (one pair a unit
        # for one configuration); trainings that differ spread the units further.
        seeds = min(paired) if len(paired) > 1 else 1
        each = " and ".join(f"{100 * effect * evaluation_sd(size) * (2 / seeds) ** 0.5:.1f} points at {size} trials" for size in trials)
        points = f" ({each} with evaluation noise alone, accuracy 0.5; more where trainings differ)"
    return ClaimDesign(3, units, True, f"{start} (Student-t and sign-flip over {units} {what}): 80% power at a mean peak difference "
                       f"of {effect:.2f} of their standard deviation or more{points}")  # fmt: skip


def _sign_over_configurations(paired: list[int], confidence: float, what: str) -> tuple[str, bool]:
    needed = fewest_unanimous(confidence)
    start = f"needs at least {needed} configurations {what}; this grid has {_plural(len(paired), 'configuration')} with both modes, {_seeds(paired)} each"
    return start, len(paired) >= needed


def _cliffs(paired: list[int], confidence: float) -> ClaimDesign:
    if not paired:
        return ClaimDesign(4, 0, False, "claim 4: no configuration with both modes: untestable")
    start, possible = _sign_over_configurations(paired, confidence, "whose cliff rates differ")
    if not possible:
        return ClaimDesign(4, len(paired), False, f"claim 4: {start}: no verdict possible")
    needed = fewest_unanimous(confidence)
    one_off = next(m for m in range(needed, 10 * needed) if sign_threshold(m, confidence) == m - 1)
    seeds = min(paired)
    rate = rate_needed(len(paired), lambda q: 1 - (1 - q) ** seeds, confidence)
    power = f"80% power if isolated's runs cliff {rate:.0%} of the time or more and shared's never" if rate is not None else "below 80% power"
    realistic = cliff_rate_needed(len(paired), seeds, SHARED_CLIFFS, confidence)
    power += (f", {realistic:.0%} if shared's cliff {SHARED_CLIFFS:.0%}" if realistic is not None
              else f"; below 80% power if shared's cliff {SHARED_CLIFFS:.0%}")  # fmt: skip
    return ClaimDesign(4, len(paired), True, f"claim 4: {start}: it can be supported only if isolated cliffs more often in "
                       f"{needed} or more (all that differ; with one the other way, {one_off - 1} of {one_off}); {power}")  # fmt: skip


def _failures(paired: list[int], confidence: float) -> ClaimDesign:
    if not paired:
        return ClaimDesign(5, 0, False, "claim 5: no configuration with both modes: untestable")
    start, possible = _sign_over_configurations(paired, confidence, "failing under both modes, in different shares of cliffs")
    if not possible:
        return ClaimDesign(5, len(paired), False, f"claim 5: {start}: no verdict possible")
    seeds = min(paired)
    rate = failure_rate_needed(len(paired), seeds, (1.0, 0.0), confidence)
    power = (f"80% power if each mode's runs fail {rate:.0%} of the time or more, isolated's by cliffs and shared's otherwise"
             if rate is not None else "below 80% power")  # fmt: skip
    isolated, shared = CLIFF_SHARES
    realistic = failure_rate_needed(len(paired), seeds, CLIFF_SHARES, confidence)
    power += (f", {realistic:.0%} if {isolated:.0%} of isolated's failures are cliffs and {shared:.0%} of shared's"
              if realistic is not None else f"; if {isolated:.0%} of isolated's failures are cliffs and {shared:.0%} of shared's, "
              f"{failure_power(len(paired), seeds, 1.0, CLIFF_SHARES, confidence):.0%} power even if every run fails")  # fmt: skip
    return ClaimDesign(5, len(paired), True, f"claim 5: {start}: {power}")


def _mechanism(claim: int, configurations: Counter, mode: str, signal: str, which: str, confidence: float) -> ClaimDesign:
    cells = sum(configurations.values())
    if not cells:
        return ClaimDesign(claim, 0, False, f"claim {claim}: no {mode} cell with {signal} signal: untestable")
    seeds = min(configurations.values())
    start = (f"claim {claim}: {_plural(cells, mode + ' cell')} with {signal} signal{which}, "
             f"{_plural(len(configurations), 'configuration')} × {_plural(seeds, 'seed')}, compared within each")  # fmt: skip
    if seeds < 2:
        return ClaimDesign(claim, cells, False, f"{start}: with one seed no configuration holds a cliff and a calm run: "
                           "no verdict possible (more seeds)")  # fmt: skip
    best = stratified_power(len(configurations), seeds, 1.0, 0.0, confidence)
    if best == 0:
        return ClaimDesign(claim, cells, False, f"{start} (exact stratified test): no verdict possible in {DRAWS} simulated "
                           "studies even if the signal precedes every cliff and no calm run's rises (more configurations)")  # fmt: skip
    power = stratified_power(len(configurations), seeds, PRECEDES, CALM_RISES, confidence)
    return ClaimDesign(claim, cells, True, f"{start} (exact stratified test): {power:.0%} power if the signal precedes "
                       f"{PRECEDES:.0%} of cliffs, half the runs cliffing and calm runs' signals rising as early in "
                       f"{CALM_RISES:.0%} ({best:.0%} if it precedes every cliff and no calm run's rises; {DRAWS} simulated studies)")  # fmt: skip
