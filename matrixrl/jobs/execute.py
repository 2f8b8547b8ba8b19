"""Running one job of the graph (matrixrl.dag): forked from the job server, or in this process."""

from __future__ import annotations

from matrixrl.dag import Job


def execute(job: Job, log_path: str) -> None:
    """Run ``job`` as its kind says: forked from the job server, or here (a local rule),
    its log written to ``log_path`` either way."""
    kind = job.kind
    if kind.forked:
        from matrixrl.jobs.forked import run_job

        run_job(job.argv(), job.title or kind.name, log_path, append=kind.append_log)
        return
    from matrixrl.dag import call
    from matrixrl.jobs.logfile import file_logger, logged_failures

    log = file_logger(log_path)
    with logged_failures(log):
        call(job.argv(), log)
