"""matrixrl from Python: one study's plan, run, report tables, stored results and figures.

docs/api.md documents every method.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from matrixrl.config import Config, load_config
from matrixrl.errors import ConfigError, did_you_mean

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from matrixrl.analysis.design import ClaimDesign
    from matrixrl.planning import Plan
    from matrixrl.runner import RunOutcome

    from matrixrl.report.plots import PlotData

FIGURE_KINDS = ("curves", "diagnostics")
"""What :meth:`Study.figure` draws."""


def _only_options(only: Sequence[str] | Mapping[str, Any]) -> list[str]:
    """``only`` as ``--only`` strings: ``{"scale": "tiny-s", "seed": [0, 1]}`` → ``["scale=tiny-s", "seed=0,1"]``."""
    from matrixrl.config.sweeps import spelled

    if isinstance(only, str):
        return [only]
    if not isinstance(only, Mapping):
        return list(only)
    options = []
    for axis, values in only.items():
        listed = values if isinstance(values, (list, tuple)) else [values]
        options.append(f"{axis}={','.join(spelled(v) for v in listed)}")
    return options


def _set_options(sets: Sequence[str] | Mapping[str, Any]) -> list[str]:
    """``set`` as ``--set`` strings: a mapping's values are written as YAML (a string as it is)."""
    import json

    if isinstance(sets, str):
        return [sets]
    if not isinstance(sets, Mapping):
        return list(sets)
    return [f"{key}={value if isinstance(value, str) else json.dumps(value)}" for key, value in sets.items()]


class Study:
    """One experiments file's study: its grid (``config``), the selected cells and their stored results
    (docs/api.md)."""

    def __init__(
        self, config: Config, selected: Config | None = None, only: Sequence[str] = (), path: str | Path | None = None,
        sets: Sequence[str] = (),
    ):
        self.config = config
        self.selected = selected if selected is not None else config
        self.only = tuple(only)
        self.sets = tuple(sets)
        self.path = Path(path) if path is not None else None  # the experiments file, if loaded from one

    @classmethod
    def load(
        cls,
        path: str | Path = "experiments.yaml",
        *,
        only: Sequence[str] | Mapping[str, Any] = (),
        set: Sequence[str] | Mapping[str, Any] = (),  # the name of the CLI's --set
    ) -> Study:
        """Read an experiments file as ``matrixrl report -c PATH --only ... --set ...`` does; ConfigError
        on any problem."""
        only_options, set_options = _only_options(only), _set_options(set)
        config = load_config(path, sets=set_options)
        selected = load_config(path, sets=set_options, only=only_options) if only_options else None
        return cls(config, selected, only_options, path, set_options)

    def __repr__(self) -> str:
        narrowed = f", only={list(self.only)}" if self.only else ""
        return f"<matrixrl.Study of {len(self.cells())} cells in {self.results_dir}{narrowed}>"

    @property
    def name(self) -> str:
        """The study's name: its experiments file's stem (``lr-sweep`` for examples/lr-sweep.yaml),
        else its results folder's name."""
        return self.path.stem if self.path is not None else self.results_dir.name

    @property
    def results_dir(self) -> Path:
        """The study's results folder (its store is ``results_dir / "matrixrl.sqlite"``)."""
        return Path(self.config.results_dir)

    def ingest(self) -> int:
        """Read new or changed result files into the store; returns how many (ConfigError when there are none)."""
        from matrixrl.store import ingest_for_report

        return ingest_for_report(self.results_dir)

    # --- the grid ---------------------------------------------------------------------

    def cells(self) -> pd.DataFrame:
        """The selected grid's cells in the grid's order, with their axes and ``run``; reads no results."""
        from matrixrl.report.rows import grid_cells

        return grid_cells(self.selected)

    def progress(self) -> pd.DataFrame:
        """How far each selected cell's jobs are, from the result files: ``cell, run, trained, evaluated,
        checkpoints, status``."""
        import pandas as pd

        from matrixrl import grid as G
        from matrixrl.status import job_statuses

        jobs = {}
        for row in job_statuses(self.selected):
            if row["cell"] is not None:
                jobs.setdefault(row["cell"], []).append(row)
        rows = []
        for cell, run in G.run_ids(self.selected).items():
            mine = jobs[run]
            evals = [j for j in mine if j["rule"] in ("copy_base_eval", "evaluate")]
            done = [j for j in mine if j["status"] == "done"]
            status = "done" if len(done) == len(mine) else "in progress" if done else "pending"
            rows.append({
                "cell": cell, "run": run, "trained": any(j["rule"] == "train" for j in done),
                "evaluated": sum(j["status"] == "done" for j in evals), "checkpoints": len(evals), "status": status,
            })
        return pd.DataFrame(rows, columns=["cell", "run", "trained", "evaluated", "checkpoints", "status"])

    # --- running it -------------------------------------------------------------------

    def plan(self, profile: str | Path | None = None, cores: int | None = None) -> Plan:
        """Every job of the selected grid, done or pending and why, without running anything
        (``matrixrl plan``; matrixrl.planning); ``profile`` adds its resources per rule,
        ``cores`` sets the time estimate's cores (default: this machine's)."""
        from matrixrl.planning import make_plan, run_command

        command = run_command(self.path, list(self.only), list(self.sets))
        return make_plan(self.selected, Path(profile) if profile is not None else None, command, cores)

    def design(self) -> list[ClaimDesign]:
        """Per claim of the claims table, what the selected grid can decide before it runs (the lines
        `matrixrl plan` prints; matrixrl.analysis.design). Reads no results."""
        from matrixrl.analysis.design import grid_design

        return grid_design(self.selected)

    def run(
        self, cores: int | None = None, *, keep_going: bool = False, profile: str | Path | None = None,
        on_event: Callable | None = None, on_note: Callable[[str], None] | None = None,
    ) -> RunOutcome:
        """Run the selected grid's pending jobs as ``matrixrl run`` does; returns how it ended
        (RunLockedError if locked)."""
        import os

        from matrixrl.runner import run_grid

        return run_grid(
            self.selected, cores=cores or os.cpu_count() or 1, keep_going=keep_going,
            profile=Path(profile) if profile is not None else None, on_event=on_event, on_note=on_note,
        )

    def unlock(self) -> None:
        """Remove the lock a killed run left on the results folder (refused while that run lives)."""
        from matrixrl.runner import unlock

        unlock(self.selected)

    # --- report tables ----------------------------------------------------------------

    def table(self, name: str = "summary", *, group_by: str | Sequence[str] | None = None, against: str | None = None) -> pd.DataFrame:
        """One report table's rows (``matrixrl report --table NAME``); ConfigError when it has none or an
        option is wrong."""
        from matrixrl.report.tables import load_report_table

        frame = load_report_table(self.config, name, _group_by_text(group_by), self._narrowed(), against)
        if "cell" in frame.columns:
            attrs = dict(frame.attrs)
            frame = frame.set_index("cell")
            frame.attrs.update(attrs)
        return frame

    def tables(self) -> dict[str, pd.DataFrame]:
        """Every report table that has rows, by name, as :meth:`table` gives them."""
        from matrixrl.report import TABLE_NAMES

        found = {}
        for name in TABLE_NAMES:
            try:
                found[name] = self.table(name)
            except ConfigError:
                if name == TABLE_NAMES[0]:
                    raise  # no summary: nothing stored for these cells at all; say so
        return found

    # --- stored results, per cell -----------------------------------------------------

    def curves(self) -> pd.DataFrame:
        """Every evaluated checkpoint: one row per (cell, step), in grid order, then step
        (columns: docs/api.md, "Stored results")."""
        return self._stored("evaluations", ["step"])

    def training(self) -> pd.DataFrame:
        """Every training step's metrics: one row per (cell, step) (columns: docs/api.md)."""
        return self._stored("train_steps", ["step"])

    def diagnostics(self, kind: str | Sequence[str] | None = None) -> pd.DataFrame:
        """Per-role gradient diagnostics of every update, long format, of ``kind`` only where given (docs/api.md)."""
        from matrixrl.results import DIAGNOSTIC_KINDS

        kinds = [] if kind is None else [kind] if isinstance(kind, str) else list(kind)
        for unknown in (k for k in kinds if k not in DIAGNOSTIC_KINDS):
            raise ConfigError(f"kind={unknown!r}: no such diagnostic; {did_you_mean(unknown, DIAGNOSTIC_KINDS)}")
        frame = self._stored("diagnostics", ["step"])
        if kinds:
            frame = frame[frame["kind"].isin(kinds)].reset_index(drop=True)
        return frame

    def role_metrics(self, source: str | None = None) -> pd.DataFrame:
        """Each role's own metrics, long format, per training step (``source`` "train") and
        per evaluated checkpoint ("eval"); ``source`` keeps one (metrics: docs/api.md).
        """
        if source not in (None, "train", "eval"):
            raise ConfigError(f"source={source!r}: use 'train', 'eval' or None (both)")
        frame = self._stored("role_metrics", ["source", "step"])
        if source is not None:
            frame = frame[frame["source"] == source].reset_index(drop=True)
        return frame

    # --- figures ----------------------------------------------------------------------

    def figures(self, cells: Sequence[str] = (), lines: str = "policy") -> dict[str, Figure]:
        """What ``matrixrl plot --cell ... --lines ...`` draws, by file stem (``curves-TASK``,
        ``diagnostics-CELL``), as matplotlib Figures without pyplot state."""
        from matrixrl.report.plots import study_figures

        return study_figures(self.plot_data(), [cells] if isinstance(cells, str) else list(cells), lines,
                             options=("cell", "lines"))  # fmt: skip

    def figure(self, kind: str = "curves", *, task: str | None = None, cell: str | None = None, lines: str = "policy") -> Figure:
        """One figure: ``"curves"`` (the learning curves of ``task``; it may be left out
        when the grid has one task) or ``"diagnostics"`` (one ``cell``'s per-role gradient
        norm, share and amplification). See docs/report.md for what they show."""
        from matrixrl.report import plots

        if kind not in FIGURE_KINDS:
            raise ConfigError(f"figure {kind!r}: use one of: {', '.join(FIGURE_KINDS)}")
        data = self.plot_data()
        if kind == "diagnostics":
            if cell is None:
                raise ConfigError("figure('diagnostics'): pass cell=CELL_ID; study.cells() lists them")
            plots.check_diagnostics_cells(data, [cell], "cell")
            return plots.diagnostics_figure(cell, data.diagnostics, data.evals, data.analysis)
        tasks = list(dict.fromkeys(data.cells["task"]))
        if task is None and len(tasks) > 1:
            raise ConfigError(f"figure('curves'): the grid has tasks {', '.join(tasks)}; pass task=NAME")
        task = tasks[0] if task is None else task
        if task not in tasks:
            raise ConfigError(f"task {task}: not a task of this grid; use one of: {', '.join(tasks)}")
        plots.check_line_by(data, lines, "lines")
        of_task = data.cells[data.cells["task"] == task]
        return plots.learning_curve_figures(of_task, data.evals, data.analysis, lines)[plots.curves_name(task)]

    def plot_data(self) -> PlotData:
        """What the figures are drawn from (``matrixrl.report.plots.PlotData``), for figures of
        your own. Raises ConfigError when nothing is evaluated yet."""
        from matrixrl.report.plots import load_study

        return load_study(self.selected)

    # --- internals --------------------------------------------------------------------

    def _current_specs(self) -> dict[str, tuple[str, str]]:
        """Each selected run's spec digests: what its results must have been computed under (fixed for the study)."""
        if not hasattr(self, "_specs"):
            from matrixrl.report.rows import current_specs

            self._specs = current_specs(self.selected)
        return self._specs

    def _narrowed(self) -> Config | None:
        return self.selected if self.only else None

    def _stored(self, table: str, order: list[str]) -> pd.DataFrame:
        """The store's ``table`` for the selected cells, with their axes, sorted by grid order then ``order``."""
        import pandas as pd

        from matrixrl.report.rows import stored_rows
        from matrixrl.store import ingest_for_report

        ingest_for_report(self.results_dir)
        cells = self.cells().drop(columns="run")
        rows = stored_rows(self.selected, table, self._current_specs())
        position = pd.Series(range(len(cells)), index=cells["cell"])
        frame = cells.merge(rows, on="cell", how="inner", sort=False)
        keys = frame["cell"].map(position).rename("_position")
        frame = frame.assign(_position=keys).sort_values(["_position", *order], kind="stable")
        return frame.drop(columns="_position").reset_index(drop=True)

def _group_by_text(group_by: str | Sequence[str] | None) -> str | None:
    if group_by is None or isinstance(group_by, str):
        return group_by
    return ",".join(group_by)


__all__ = ["FIGURE_KINDS", "Study"]
