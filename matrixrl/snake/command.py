"""Snakemake's command line and environment: the config it reads, its dry-runs for `plan`.

Dry-runs run in a fresh subprocess: one process must not evaluate two DAGs (the second comes back stale).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from matrixrl import atomic
from matrixrl.config import Config
from matrixrl.errors import SnakemakeError, disk_error_in_text

SNAKEFILE = Path(__file__).parent.parent / "workflow" / "Snakefile"

def write_configfile(config: Config, path: Path) -> Path:
    # What the file set, not the defaults: the Snakefile's validation then sees what the CLI's
    # saw (a default that follows another key stays a default), and so do extra axes' values.
    atomic.write_text(path, yaml.safe_dump(config.model_dump(mode="json", exclude_unset=True), sort_keys=False))
    return path


def job_environment() -> dict[str, str]:
    """The environment of Snakemake and its jobs: one code version per run (docs/faults.md)."""
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    env.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    env.setdefault("TQDM_DISABLE", "1")
    env["PYTHONSAFEPATH"] = "1"
    root = _code_root()
    if root is not None:
        env["PYTHONPATH"] = os.pathsep.join([root, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    return env


@functools.cache
def _code_root() -> str | None:
    """The folder that makes a child Python import this matrixrl, or None where it does without."""
    here = Path(__file__).resolve().parent.parent  # the matrixrl package this module belongs to
    # A child with a safe path has this process's path less its first entry, the
    # folder of the script or the current folder (unless this one had a safe path too).
    path = [p for p in (sys.path if sys.flags.safe_path else sys.path[1:]) if p]
    found = None
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is None:
            continue
        try:
            spec = find_spec("matrixrl", path)
        except Exception:
            continue
        if spec is not None:
            found = spec.origin
            break
    if found and Path(found).resolve().parent == here:
        return None
    return str(here.parent)


# --- dry-run ----------------------------------------------------------------------------


RERUN_TRIGGERS = ("software-env",)
"""Snakemake's own rerun triggers, as ``matrixrl run`` passes them: none that can fire.

matrixrl.status decides what is stale and the run names it with ``--forcerun``
(docs/architecture.md, "Planning"); ``--rerun-triggers`` needs one.
"""


def pending_jobs(config: Config, workdir: Path, stale: list[str] = ()) -> list[dict]:
    """Jobs a run would execute now, by Snakemake's own dry-run: ``[{"rule": ..., "wildcards": {...}}]``.

    ``stale``: the outputs named with ``--forcerun``; ``workdir`` must exist.
    """
    with tempfile.TemporaryDirectory() as tmp:
        configfile = write_configfile(config, Path(tmp) / "config.yaml")
        proc = subprocess.run(
            [sys.executable, "-m", "matrixrl.snake", str(configfile), str(workdir), *stale],
            capture_output=True,
            text=True,
            env=job_environment(),
        )
    if proc.returncode != 0:
        lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
        reason = next((line for line in reversed(lines) if "Error" in line or "Exception" in line), lines[-1] if lines else "no output")
        if (disk_error := disk_error_in_text(reason)) is not None:
            raise disk_error  # Snakemake writes its metadata in the results folder even for a dry-run
        raise SnakemakeError(f"snakemake's dry-run of {workdir} failed ({reason}); run it by hand for details: snakemake -n --directory {workdir}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def dry_run_in_this_process(configfile: Path, workdir: Path, stale: list[str] = ()) -> list[dict]:
    from snakemake.api import SnakemakeApi
    from snakemake.logging import logger
    from snakemake.settings.enums import RerunTrigger
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
            triggers = frozenset(RerunTrigger.parse_choice(name) for name in RERUN_TRIGGERS)
            dag = DAGSettings(force_incomplete=True, rerun_triggers=triggers, forcerun=frozenset(stale))
            workflow.dag(dag).execute_workflow(executor="local", pseudo_executor="dryrun")
        finally:
            logger.removeHandler(handler)
    return jobs


def snakemake_command(
    config: Config, configfile: Path, cores: int, extra: list[str], gpus: int | None = None, stale: list[str] = ()
) -> list[str]:
    """The Snakemake command line of a run; ``gpus``: the local GPU count (None for a cluster run),
    ``stale``: outputs to recompute."""
    resources = ["--resources", f"gpu={gpus}"] if gpus is not None else []
    return [
        sys.executable,
        "-P",  # the current folder is not on Snakemake's path: a `matrixrl/` there cannot shadow this one
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
        "--rerun-triggers",
        *RERUN_TRIGGERS,
        "--printshellcmds",
        "--nocolor",
        *resources,
        *extra,
        *(["--forcerun", *stale] if stale else []),
    ]
