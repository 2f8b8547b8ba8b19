"""A real single-node SLURM cluster (tests/slurm_cluster.py) runs jobs.

Skipped unless root with slurmctld/slurmd/munge installed; on CI (``CI=true``)
missing pieces fail the tests instead. See slurm_cluster.py for what is
started and how it is cleaned up.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from slurm_cluster import ETC_SLURM, slurm_cluster, unavailable

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm-cluster"), pytest.mark.slow]  # one worker: tests/conftest.py


def alive(pid: int, name: str) -> bool:
    """Whether process ``pid`` still exists and is still ``name``."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return name.encode() in cmdline


def test_sbatch_job_runs_on_the_cluster_and_everything_is_cleaned_up(tmp_path):
    out = tmp_path / "out.txt"
    with slurm_cluster(tmp_path / "slurm", cpus=2, gpus=1) as cluster:
        assert (ETC_SLURM / "slurm.conf").resolve() == cluster.conf.resolve()
        submitted = cluster.run(
            "sbatch",
            "--parsable",
            "--partition", cluster.partition,
            "--gres=gpu:1",
            "-o", out,
            "--wrap", 'hostname; echo $SLURM_JOB_ID; echo "gpus=$CUDA_VISIBLE_DEVICES"',
        )
        job_id = submitted.stdout.strip().split(";")[0]
        assert job_id.isdigit(), submitted.stdout
        state = cluster.wait_for_job(job_id, timeout=60)
        assert state == "COMPLETED", f"{state}\n{cluster.log_tails()}"
        lines = out.read_text().splitlines()
        assert lines[0] == cluster.node
        assert lines[1] == job_id
        assert lines[2] == "gpus=0"  # the fake GPU is handed to the job
        pids = dict(cluster.pids)

    assert set(pids) == {"munged", "slurmctld", "slurmd"}
    for name, pid in pids.items():
        assert not alive(pid, name), f"{name} (pid {pid}) still running"
    assert cluster.etc_after == cluster.etc_before


SNAKEFILE = """\
localrules: all

rule all:
    input: "host.txt", "run.txt"

rule host:
    output: "host.txt"
    shell: "hostname > {output}; echo $SLURM_JOB_ID >> {output}"

rule py:
    output: "run.txt"
    run:
        import os, socket
        with open(output[0], "w") as f:
            f.write(socket.gethostname() + "\\n" + os.environ.get("SLURM_JOB_ID", "") + "\\n")
"""


def test_snakemake_submits_through_the_slurm_plugin(tmp_path):
    try:
        import snakemake_executor_plugin_slurm  # noqa: F401
    except ImportError:
        unavailable("snakemake-executor-plugin-slurm is not installed")

    work = tmp_path / "wf"
    profile = tmp_path / "profile"
    work.mkdir()
    profile.mkdir()
    (work / "Snakefile").write_text(SNAKEFILE)

    with slurm_cluster(tmp_path / "slurm") as cluster:
        (profile / "config.yaml").write_text(
            yaml.safe_dump(
                {
                    "executor": "slurm",
                    "jobs": 4,
                    # accepted, but unused by plugin 2.8.0: it still tries
                    # `sacct` to guess an account, warns, and submits without
                    "slurm-no-account": True,
                    # no accounting, so no sacct; squeue works as long as
                    # MinJobAge (300) >= 3 * init-seconds-before-status-checks
                    "slurm-status-command": "squeue",
                    "slurm-init-seconds-before-status-checks": 2,
                    # snakemake's first poll (default 10 s); the plugin then
                    # adds 10 s per poll that finds nothing finished
                    "seconds-between-status-checks": 5,
                    # keep .snakemake/slurm_logs/rule_<rule>/<slurm id>.log
                    "slurm-keep-successful-logs": True,
                    "default-resources": [
                        f"slurm_partition={cluster.partition}",
                        "runtime=5",
                        "mem_mb=500",
                    ],
                }
            )
        )
        start = time.monotonic()
        result = subprocess.run(
            [
                sys.executable, "-m", "snakemake",
                "--profile", str(profile),
                "--directory", str(work),
                "--snakefile", str(work / "Snakefile"),
            ],
            cwd=work,
            env=cluster.env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        elapsed = time.monotonic() - start
        assert result.returncode == 0, (
            f"snakemake exited {result.returncode} after {elapsed:.0f} s\n"
            f"{result.stdout[-4000:]}\n{result.stderr[-8000:]}\n{cluster.log_tails()}"
        )
        jobs = {job["id"]: job for job in cluster.jobs()}

    logs = work / ".snakemake" / "slurm_logs"
    for rule, output in (("host", "host.txt"), ("py", "run.txt")):
        host, job_id = (work / output).read_text().split()
        assert host == cluster.node
        assert job_id in jobs, f"{rule}: SLURM job {job_id} unknown: {jobs}"
        assert jobs[job_id]["state"] == "COMPLETED"
        # the plugin names each job's log after its SLURM job id
        assert (logs / f"rule_{rule}" / f"{job_id}.log").is_file()
        assert f"with SLURM jobid {job_id}" in result.stderr
    assert cluster.etc_after == cluster.etc_before
