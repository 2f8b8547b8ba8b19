"""The family's measured error rates, per grid shape, for the claims table's footer.

``bench/calibration_sim.py`` draws synthetic studies with the study's noise and feeds them to the
claims code; ``python bench/claims_calibration.py`` prints how often each rule decides with nothing
there and with an effect planted (docs/report.md, "How often the rules err"). What a report needs of
it lives here: a grid's shape (:class:`GridShape`, which the simulation also draws from) and the rate,
measured per shape, at which at least one of claims 2-7 is decided under the joint null.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from matrixrl.config import Config


@dataclass(frozen=True)
class GridShape:
    """What of a grid a synthetic study needs: its multi-agent contexts, seeds, checkpoints and evaluations.

    ``contexts``: the multi-agent (workflow, task, scale), each with one base evaluation (the
    ``single`` baseline is left out: no claim reads it); ``seeds`` per mode; ``steps``: the
    evaluated checkpoints, 0 first; ``trials``: per task, the trials of one evaluation
    (``n_eval × samples``); ``parallel``: the workflows whose isolated cells carry an
    amplification signal (parallel agents of one role); ``base_times``: the base evaluation's
    samples over a checkpoint's (``base_samples / samples``)."""

    name: str
    contexts: tuple[tuple[str, str, str], ...]
    seeds: int
    steps: tuple[int, ...]
    trials: Mapping[str, int]
    parallel: frozenset[str]
    base_times: float = 1.0

    def base_trials(self, task: str) -> int:
        """The trials of ``task``'s base evaluation."""
        return round(self.trials[task] * self.base_times)

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
        base_times = config.eval.base_samples_in_effect / config.eval.samples
        return cls(name, contexts, seeds or len(config.grid.seed), steps, trials, parallel, base_times)

    def describe(self) -> str:
        """E.g. ``12 contexts × 2 modes × 1 seed, 5 checkpoints, 512 trials an evaluation, the base's 4×``."""
        trials = sorted(set(self.trials.values()))
        each = "/".join(map(str, trials))
        seeds = f"{self.seeds} seed{'s' if self.seeds > 1 else ''}"
        contexts = f"{len(self.contexts)} context{'s' if len(self.contexts) > 1 else ''}"
        base = f", the base's {self.base_times:g}×" if self.base_times != 1 else ""
        return f"{contexts} × 2 modes × {seeds}, {len(self.steps)} checkpoints, {each} trials an evaluation{base}"



FAMILY_RATES = {
    "12 contexts × 2 modes × 1 seed, 5 checkpoints, 512 trials an evaluation, the base's 4×": (0.101, 0.010, 0.033, 0.006),
    "1 context × 2 modes × 6 seeds, 5 checkpoints, 512 trials an evaluation, the base's 4×": (0.023, 0.005, 0.000, 0.000),
    "18 contexts × 2 modes × 1 seed, 51 checkpoints, 128/1000 trials an evaluation, the base's 4×": (0.103, 0.010, 0.028, 0.005),
    "18 contexts × 2 modes × 3 seeds, 51 checkpoints, 128/1000 trials an evaluation, the base's 4×": (0.133, 0.011, 0.020, 0.004),
}
"""Per grid shape (``GridShape.describe``): how often at least one of claims 2-7 was decided under the joint
null, ``(rate, SE, rate under Holm, SE)``, from ``python bench/claims_calibration.py`` (1000 studies a shape,
seed 0, at a2d04f1; docs/report.md, "How often the rules err")."""


def family_caption(config: Config) -> str:
    """The claims table's footer line on the family: its measured rate for this grid's shape, or that it
    was not measured."""
    try:
        described = GridShape.of(config, "grid").describe()
    except (ValueError, KeyError):
        described = None
    held = "under Holm's procedure" if config.analysis.family == "holm" else "each at its own level"
    if described not in FAMILY_RATES:
        return (f"Claims 2-7 tested {held}; how often one of them is decided with nothing there is not measured "
                "for this grid's shape (bench/claims_calibration.py).")  # fmt: skip
    raw, raw_se, holm, holm_se = FAMILY_RATES[described]
    if config.analysis.family == "holm":
        return (f"With nothing there, one of claims 2-7 (under Holm) is decided in {100 * holm:.1f} ± {100 * holm_se:.1f}% "
                "of simulated studies of this grid's shape (docs/report.md).")  # fmt: skip
    # One line on the HTML page's first screen: the claims and the whole matrix must fit above the fold.
    return (f"With nothing there, one of claims 2-7 is decided in {100 * raw:.1f} ± {100 * raw_se:.1f}% of simulated studies "
            f"of this grid's shape ({100 * holm:.1f}% with --family holm; docs/report.md).")  # fmt: skip
