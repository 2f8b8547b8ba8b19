"""Run a training, evaluation, memory or warm-start job in its own process, forked from a pre-imported server.

Importing torch + transformers (+ TRL's helpers) costs about 12 s per Python process
on a 2-core machine: 15 of the 21 s of a 40-step tiny training job. A ``shell:``
rule pays it once per job; the default grid's 34 such jobs spent ~400 core-seconds
on imports alone (bench/job_launch.py measures it). Here the rules that load a
model (``train``, the evaluations, ``prepare_base``, the memory jobs) instead ask
Python's ``forkserver``: a single-threaded server process, started once per
Snakemake process, imports the job modules once and forks a fresh child per job.
The child is still its own process, exactly as a shell job's:

- its own pid, RNG, torch thread pool and GPU claim (``models.devices.claimed_gpu``),
  so training stays deterministic and a ``kill -9`` leaves the checkpoints to resume from;
- its title reads ``matrixrl.jobs RULE NAME`` in ``ps``/``pgrep -f``;
- its stdout and stderr go to the rule's log, as ``python -m matrixrl.jobs`` would write it;
- it dies with the Snakemake process that asked for it (a thread waits on
  multiprocessing's parent sentinel) and with the server (``PR_SET_PDEATHSIG``), so
  no training outlives its run to write into a cell a later run owns;
- it is in Snakemake's process group, as the server is: a `matrixrl run` stopped by
  a signal sends the group SIGTERM (matrixrl/snake/process.py), which ends a child at once,
  between two atomic writes, so its checkpoints and results are whole or absent.

Why not fork the Snakemake process itself: it runs threads (each job's ``run:``
block, its scheduler), and forking a threaded process can copy a held lock into the
child. The forkserver is started by fork + exec and forks only from its one thread.

The server never starts CUDA: a child forked from a process that has cannot use it,
and a GPU job sets ``CUDA_VISIBLE_DEVICES`` to its claimed GPU only after the fork.
``torch.cuda.is_available()`` starts CUDA (``cuInit``) to count the GPUs unless
``PYTORCH_NVML_BASED_CUDA_CHECK=1`` makes it ask NVML instead, so this module sets
that for the server (tests/test_gpu_claims.py imports the preload with CUDA's start
made to fail).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading

# Before any preload import: torch reads it at each is_available() call, and the server,
# started by fork + exec from this process, inherits this environment. Jobs inherit it too,
# where asking NVML is as good (their CUDA starts once they load a model anyway).
os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"

# What the server imports once; each child finds these modules already loaded.
PRELOAD = [
    "matrixrl.jobs.__main__",
    "matrixrl.dag",
    "matrixrl.jobs.train",
    "matrixrl.jobs.prepare_base",
    "matrixrl.jobs.evaluate",
    "matrixrl.train.trainer",
]
_PR_SET_PDEATHSIG = 1

# One server per process: the context is a singleton, and the preload list is read
# when its first job starts the server.
_FORKSERVER = multiprocessing.get_context("forkserver")
_FORKSERVER.set_forkserver_preload(PRELOAD)


# Jobs start and end in concurrent Snakemake threads, and a child's exit status can be
# read from the server only once: Process.start() polls every other live child
# (multiprocessing's _cleanup), so a start racing another job's join() made one of
# them read end-of-file and report exit code 255 for a job that had succeeded (seen
# once evaluations were forked too). Starts and status reads take turns.
_STATUS_LOCK = threading.Lock()


class JobFailed(RuntimeError):
    """A forked job exited non-zero; its log says why."""


def run_job(argv: list[str], name: str, log_path: str, append: bool = False) -> None:
    """Run ``python -m matrixrl.jobs ARGV...`` in a forked child; raise JobFailed unless it exits 0.

    ``argv`` is the command line a shell rule would pass (``RULE SPEC_JSON PATHS...``);
    ``name`` (a cell id or scale) goes into the process title. The child's output goes
    to ``log_path``, appended to with ``append`` (a resumed training continues its log).
    """
    title = f"matrixrl.jobs {argv[0]} {name}"
    process = _FORKSERVER.Process(target=_child, args=(argv, title, log_path, append), name=title)
    exitcode = run_to_end(process)
    if exitcode != 0:
        how = f"was killed by signal {-exitcode}" if exitcode < 0 else f"exited {exitcode}"
        raise JobFailed(f"{title} {how}; see its log {log_path}")


def run_to_end(process: multiprocessing.Process) -> int:
    """Start ``process``, wait for it to end, return its exit code (safe from any thread)."""
    with _STATUS_LOCK:
        process.start()
    multiprocessing.connection.wait([process.sentinel])  # until it ends, without reading its status
    with _STATUS_LOCK:
        process.join()
    return process.exitcode


def _child(argv: list[str], title: str, log_path: str, append: bool) -> None:
    _die_with_requester()
    from setproctitle import setproctitle

    setproctitle(title)
    os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC), 0o644)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    from matrixrl.jobs.__main__ import run

    run(argv)  # exits 1 with an "Error: ..." line for errors the user can fix


def _die_with_requester() -> None:
    """SIGKILL this child when the Snakemake process that started it, or the server, dies.

    The server cannot do it: each child holds a copy of its liveness pipe, so it
    outlives its requester as long as a child runs. The parent sentinel is the
    requester's end of the child's data pipe: readable once the requester is gone.
    """
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    sentinel = multiprocessing.parent_process().sentinel

    def watch() -> None:
        multiprocessing.connection.wait([sentinel])
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="die-with-requester", daemon=True).start()
