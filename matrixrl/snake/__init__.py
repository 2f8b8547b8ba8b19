"""Talking to Snakemake: its command line, its log, its process, its profiles (one module each).

For now every name of the former matrixrl/snake.py is re-exported here, so that callers
keep working while they move to the modules that define them.
"""

from matrixrl.snake.command import (
    LOCAL_RULES, RERUN_TRIGGERS, RULES, SNAKEFILE, _code_root, _dry_run_in_this_process, job_environment,
    pending_jobs, planned_jobs, snakemake_command, write_configfile,
)
from matrixrl.snake.events import RunEvent, TimeLeft, _duration, _LogParser
from matrixrl.snake.process import (
    GRACE_S, RUN_LOG_ENV, RUN_PID_ENV, STOP_SIGNALS, RunStopped, _alive, _default_stop_signals, _Guard, _kill,
    _killpg, _lock_files, _option, _output_to, _process_start, _remove_new_locks, _stop_group, _write_record,
    follow_run, live_runs, run_with_events, stop_on_signals,
)
from matrixrl.snake.profiles import _as_mapping, _cluster_profile, profile_config, rule_resources
