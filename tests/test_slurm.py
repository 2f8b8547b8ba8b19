"""`matrixrl run --profile` on a real single-node SLURM cluster started by the test.

Skipped unless root with Debian's slurm packages and the slurm executor plugin;
on CI (CI=true, where .ci/run installs them) a missing piece fails instead.
"""

from __future__ import annotations

import importlib.util
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from slurm_cluster import slurm_cluster, unavailable
from test_e2e import CELL0, jobs_started, small_experiment

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm-cluster"), pytest.mark.slow]  # one worker: tests/conftest.py


def write_profile(folder: Path, partition: str) -> Path:
    """The shipped profile's shape, with the keys a cluster without accounting needs."""
    profile = {
        "executor": "slurm",
        "jobs": 4,
        "latency-wait": 30,
        "slurm-no-account": True,
        "slurm-status-command": "squeue",
        "slurm-init-seconds-before-status-checks": 2,
        "slurm-keep-successful-logs": True,
        "seconds-between-status-checks": 5,
        "default-resources": {"slurm_partition": partition, "runtime": 10, "mem_mb": 2000, "cpus_per_task": 1},
        # The training job asks for the node's (fake) GPU through the plugin's resources.
        "set-resources": {"train": {"mem_mb": 3000, "gpu": 1}},
    }
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(profile))
    return folder


def matrixrl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "matrixrl", *args], capture_output=True, text=True, timeout=900)


def test_grid_runs_as_slurm_jobs_and_reruns_nothing(tmp_path):
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        unavailable('snakemake-executor-plugin-slurm is not installed (pip install "matrixrl[slurm]")')
    config = small_experiment(tmp_path / "grid")
    results = tmp_path / "grid" / "results"
    with slurm_cluster(tmp_path / "slurm", cpus=2, gpus=1) as cluster:
        profile = write_profile(tmp_path / "profile", cluster.partition)

        planned = matrixrl("plan", "-c", str(config), "--profile", str(profile), "--format", "json")
        assert planned.returncode == 0, planned.stderr
        train_job = next(j for j in yaml.safe_load(planned.stdout) if j["rule"] == "train")
        assert train_job["resources"] == {
            "slurm_partition": cluster.partition, "runtime": 10, "mem_mb": 3000, "cpus_per_task": 1, "gpu": 1,
        }  # fmt: skip

        began = time.monotonic()
        first = matrixrl("run", "-c", str(config), "--profile", str(profile), "--cores", "2")
        elapsed = time.monotonic() - began
        assert first.returncode == 0, f"{first.stdout}\n{first.stderr}\n{cluster.log_tails()}"

        # Every job but the local copy_base_eval, retain and analyse ran as a SLURM job with its own SLURM log.
        slurm_logs = sorted(p.relative_to(results / ".snakemake" / "slurm_logs") for p in (results / ".snakemake" / "slurm_logs").rglob("*.log"))
        by_rule = {}
        for log in slurm_logs:
            by_rule.setdefault(log.parts[0], []).append(log)
        assert {rule: len(logs) for rule, logs in by_rule.items()} == {
            "rule_prepare_base": 1,
            "rule_evaluate_base": 1,  # step 0, the base model's evaluation
            "rule_train": 1,
            "rule_evaluate": 2,
        }, slurm_logs
        slurm_ids = {log.stem for log in slurm_logs}
        assert all(i.isdigit() for i in slurm_ids) and len(slurm_ids) == 5
        (train_id,) = [log.stem for log in by_rule["rule_train"]]
        train_record = cluster.run("scontrol", "show", "job", train_id).stdout
        assert "gpu:1" in train_record or "gpu=1" in train_record, train_record
        (eval_id, *_) = [log.stem for log in by_rule["rule_evaluate"]]
        assert "gpu" not in cluster.run("scontrol", "show", "job", eval_id).stdout
        snakemake_log = next((results / "logs" / "snakemake").glob("*.log")).read_text()
        for job_id in slurm_ids:
            assert f"SLURM jobid {job_id}" in snakemake_log

        with sqlite3.connect(results / "matrixrl.sqlite") as db:
            steps = [s for (s,) in db.execute(f"select step from evaluations where cell = '{CELL0}' order by step")]
        assert steps == [0, 2, 4]

        second = matrixrl("run", "-c", str(config), "--profile", str(profile), "--cores", "2")
        assert second.returncode == 0, second.stderr
        assert jobs_started(second) == []
        assert "Nothing to run" in second.stdout
        assert sorted((results / ".snakemake" / "slurm_logs").rglob("*.log")) == sorted(
            results / ".snakemake" / "slurm_logs" / p for p in slurm_logs
        )

        # Retention ran on the submitting host, over the files the cluster jobs wrote: the final checkpoint stays.
        assert (results / "cells" / CELL0 / "retained.json").exists()
        assert (results / "cells" / CELL0 / "checkpoints" / "step_4" / "COMPLETE").exists()

        # A job that fails on the cluster is named with its cell and log.
        import shutil

        shutil.rmtree(results / "cells" / CELL0 / "checkpoints" / "step_4")
        (results / "cells" / CELL0 / "eval" / "step_4.json").unlink()
        failed = matrixrl("run", "-c", str(config), "--profile", str(profile), "--cores", "2")
        print(failed.stderr)
        assert failed.returncode == 1
        log = results / "logs" / "evaluate" / CELL0 / "step_4.log"
        assert f"✗ job evaluate (cell={CELL0}, step=4) failed: the checkpoint of step 4 is missing" in failed.stderr
        assert f"; log: {log}" in failed.stderr
    print(f"\nSLURM grid: first run {elapsed:.0f} s")
