"""Talking to Snakemake: the resolved config it reads, dry-runs for `plan`, runs for `run`.

Snakemake owns scheduling, resumption and retries. matrixrl hands it the resolved
config as a ``--configfile`` (``--config`` would turn nested values into strings)
and runs it as a CLI subprocess, the stable interface across releases. Dry-runs
use the Python API in a fresh subprocess: one process must not evaluate two DAGs
(the second answer comes back stale).
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from matrixrl import atomic
from matrixrl.config import Config
from matrixrl.errors import ProfileError, SnakemakeError

SNAKEFILE = Path(__file__).parent / "workflow" / "Snakefile"

RULES = ("prepare_base", "train", "evaluate", "analyse")
"""The Snakefile's job rules, in the order a plan lists them (the Snakefile checks it defines exactly these)."""
LOCAL_RULES = ("analyse",)
"""Rules that run on the submitting host, never through a cluster profile (they write the store)."""


def write_configfile(config: Config, path: Path) -> Path:
    atomic.write_text(path, yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    return path


def job_environment() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    env.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    env.setdefault("TQDM_DISABLE", "1")
    return env


# --- dry-run ----------------------------------------------------------------------------


def pending_jobs(config: Config, workdir: Path) -> list[dict]:
    """Jobs a run would execute now: ``[{"rule": ..., "wildcards": {...}}]``.

    ``workdir`` must exist; for a results directory that does not exist yet, pass an
    empty temporary folder (everything is pending).
    """
    with tempfile.TemporaryDirectory() as tmp:
        configfile = write_configfile(config, Path(tmp) / "config.yaml")
        proc = subprocess.run(
            [sys.executable, "-m", "matrixrl.snake", str(configfile), str(workdir)],
            capture_output=True,
            text=True,
            env=job_environment(),
        )
    if proc.returncode != 0:
        lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
        reason = next((line for line in reversed(lines) if "Error" in line or "Exception" in line), lines[-1] if lines else "no output")
        raise SnakemakeError(f"snakemake's dry-run of {workdir} failed ({reason}); run it by hand for details: snakemake -n --directory {workdir}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _dry_run_in_this_process(configfile: Path, workdir: Path) -> list[dict]:
    from snakemake.api import SnakemakeApi
    from snakemake.logging import logger
    from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, ResourceSettings
    from snakemake_interface_logger_plugins.common import LogEvent

    jobs: list[dict] = []

    class Collect(logging.Handler):
        def emit(self, record):
            if getattr(record, "event", None) == LogEvent.JOB_INFO:
                jobs.append({"rule": record.rule_name, "wildcards": dict(record.wildcards or {})})

    handler = Collect()
    # Default output settings: "quiet" would also filter the JOB_INFO events we collect.
    with SnakemakeApi(OutputSettings()) as api:
        logger.addHandler(handler)
        try:
            workflow = api.workflow(
                resource_settings=ResourceSettings(cores=1),
                config_settings=ConfigSettings(configfiles=[configfile]),
                snakefile=SNAKEFILE,
                workdir=workdir,
            )
            # As `matrixrl run` passes --rerun-incomplete: a killed job's outputs are pending, not an error.
            workflow.dag(DAGSettings(force_incomplete=True)).execute_workflow(executor="local", pseudo_executor="dryrun")
        finally:
            logger.removeHandler(handler)
    return jobs


def planned_jobs(config: Config) -> list[dict]:
    """Every job of the grid with its status (done or pending), from one real Snakemake dry-run."""
    from matrixrl import grid as G

    results = Path(config.results_dir)
    if results.is_dir():
        pending = pending_jobs(config, results)
    else:
        with tempfile.TemporaryDirectory() as empty:
            pending = pending_jobs(config, Path(empty))
    pending_keys = {(j["rule"], tuple(sorted(j["wildcards"].items()))) for j in pending}

    def job(rule: str, wildcards: dict, cell=None, scale=None, step=None) -> dict:
        key = (rule, tuple(sorted((k, str(v)) for k, v in wildcards.items())))
        status = "pending" if key in pending_keys else "done"
        return {"rule": rule, "cell": cell, "scale": scale, "step": step, "status": status}

    runs = G.runs(config)  # a one-role workflow's isolated cell is its shared cell's run
    jobs = [job("prepare_base", {"scale": s}, scale=s) for s in G.base_scales(config)]
    jobs += [job("train", {"cell": c.id}, cell=c.id, scale=c.scale) for c in runs]
    for c in runs:
        for step in G.checkpoint_steps(config.train_for(c.scale)):
            jobs.append(job("evaluate", {"cell": c.id, "step": step}, cell=c.id, scale=c.scale, step=step))
    jobs.append(job("analyse", {}))
    return jobs


# --- run ----------------------------------------------------------------------------------


@dataclass
class RunEvent:
    """What the run's progress display needs from Snakemake's log."""

    kind: str  # "start" | "failed" | "progress" | "nothing" | "locked" | "line"
    rule: str | None = None
    wildcards: str = ""
    log: str = ""
    done: int = 0
    total: int = 0
    text: str = ""


_PROGRESS = re.compile(r"(\d+) of (\d+) steps \(\d+%\) done")
_BLOCK = re.compile(r"^(?:(?:local)?rule|Error in rule) (\w+):$")
_FIELD = re.compile(r"^\s+(\w+): (.*)$")


def snakemake_command(config: Config, configfile: Path, cores: int, extra: list[str], gpus: int | None = None) -> list[str]:
    """The Snakemake command line of a run. ``gpus``: the machine's GPU count for a local run.

    Locally ``--resources gpu=N`` is a semaphore over the jobs that declare a GPU, and
    an unset limit means unlimited, so a local run always passes the detected count
    (0 here: GPU jobs then run on CPU). Cluster runs (a profile) pass None: there the
    scheduler allocates GPUs, and a limit of 0 would strip their requests.
    """
    resources = ["--resources", f"gpu={gpus}"] if gpus is not None else []
    return [
        sys.executable,
        "-m",
        "snakemake",
        "--snakefile",
        str(SNAKEFILE),
        "--directory",
        config.results_dir,
        "--configfile",
        str(configfile),
        "--cores",
        str(cores),
        # run: rules execute in this process: analyse itself, and the forks of train,
        # evaluate and prepare_base from the server that imported torch once (jobs/forked.py).
        "--force-use-threads",
        "--rerun-incomplete",
        "--printshellcmds",
        "--nocolor",
        *resources,
        *extra,
    ]


def run_snakemake(command: list[str], log_path: Path) -> Iterator[RunEvent]:
    """Run Snakemake, tee its log to ``log_path`` and yield parsed events; returns its exit code.

    Snakemake reports a job as a block: ``rule NAME:`` (or ``Error in rule NAME:``)
    followed by indented ``key: value`` lines. An error block names the job only by
    its jobid, so wildcards are remembered from the job's start block.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=job_environment()
    )
    wildcards_of: dict[str, str] = {}
    block: dict | None = None

    def close(block: dict) -> RunEvent:
        wildcards = block.get("wildcards") or wildcards_of.get(block.get("jobid", ""), "")
        if block["error"]:
            return RunEvent("failed", rule=block["rule"], wildcards=wildcards, log=block.get("log", "").split(" (")[0])
        wildcards_of[block.get("jobid", "")] = wildcards
        return RunEvent("start", rule=block["rule"], wildcards=wildcards)

    with log_path.open("w") as log:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            log.flush()
            line = line.rstrip("\n")
            if block is not None:
                if field := _FIELD.match(line):
                    block.setdefault(field.group(1), field.group(2).strip())
                    continue
                yield close(block)
                block = None
            if match := _BLOCK.match(line):
                block = {"rule": match.group(1), "error": line.startswith("Error")}
            elif match := _PROGRESS.search(line):
                yield RunEvent("progress", done=int(match.group(1)), total=int(match.group(2)))
            elif "Nothing to be done" in line:
                yield RunEvent("nothing", text=line)
            elif "cannot be locked" in line:
                yield RunEvent("locked", text=line)
            else:
                yield RunEvent("line", text=line)
        if block is not None:
            yield close(block)
    return proc.wait()


def run_with_events(command: list[str], log_path: Path, on_event: Callable[[RunEvent], None]) -> int:
    events = run_snakemake(command, log_path)
    while True:
        try:
            on_event(next(events))
        except StopIteration as stop:
            return stop.value


if __name__ == "__main__":
    # python -m matrixrl.snake CONFIGFILE WORKDIR → JSON list of pending jobs on stdout
    print(json.dumps(_dry_run_in_this_process(Path(sys.argv[1]), Path(sys.argv[2]))))


# --- profiles ---------------------------------------------------------------------------


def profile_config(profile: Path) -> dict:
    """A Snakemake profile's config.yaml, read for `plan` (Snakemake itself reads it for `run`)."""
    path = profile / "config.yaml"
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ProfileError(f"--profile {profile}: no config.yaml in it; see profiles/slurm/ for an example")
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: not valid YAML ({getattr(exc, 'problem', exc)}); fix its syntax")
    if not isinstance(raw, dict):
        raise ProfileError(f"{path}: expected a mapping of Snakemake options")
    return raw


def _as_mapping(value, where: str) -> dict:
    """Profile resources come as a mapping or as a list of ``key=value`` strings."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list):
        pairs = {}
        for item in value:
            key, sep, val = str(item).partition("=")
            if not sep:
                raise ProfileError(f"{where}: {item!r} is not key=value")
            pairs[key.strip()] = yaml.safe_load(val)
        return pairs
    raise ProfileError(f"{where}: expected a mapping or a list of key=value")


def rule_resources(profile: Path, rules: list[str]) -> dict[str, dict]:
    """Resources each rule will request under ``profile`` (defaults, then per-rule settings)."""
    raw = profile_config(profile)
    path = profile / "config.yaml"
    defaults = _as_mapping(raw.get("default-resources"), f"{path}: default-resources")
    per_rule = raw.get("set-resources") or {}
    if isinstance(per_rule, list):  # ["train:mem_mb=4000", ...]
        grouped: dict[str, dict] = {}
        for item in per_rule:
            rule, _, pair = str(item).partition(":")
            grouped.setdefault(rule, {}).update(_as_mapping([pair], f"{path}: set-resources"))
        per_rule = grouped
    threads = raw.get("set-threads") or {}
    local = set(LOCAL_RULES)
    table = {}
    for rule in rules:
        if rule in local:
            table[rule] = {"host": "local"}
            continue
        resources = {**defaults, **_as_mapping(per_rule.get(rule), f"{path}: set-resources.{rule}")}
        if rule in threads:
            resources["threads"] = threads[rule]
        table[rule] = resources
    return table
