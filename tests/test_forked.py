"""Jobs forked from the job server report their own exit codes, from any thread."""

from __future__ import annotations

import json
import subprocess
import sys

# In a Python of its own, whose server (jobs/forked.py's) preloads nothing: the race is in starting
# and reaping children, not in what they import. The job modules' preload would cost ~15 s, and
# its slower forks hid the race more often: with run_to_end's lock taken out, 25 of 50 runs of this
# saw a wrong exit code, against 6 of 50 with the preload.
CONCURRENT_JOBS = """
import json, sys, threading
from matrixrl.jobs.forked import _FORKSERVER, run_to_end

_FORKSERVER.set_forkserver_preload([])
codes = {"succeed": [], "fail": []}

def worker(name, code):
    for _ in range(25):
        codes[name].append(run_to_end(_FORKSERVER.Process(target=sys.exit, args=(code,))))

threads = [threading.Thread(target=worker, args=job) for job in (("succeed", 0), ("fail", 3)) * 2]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(json.dumps(codes))
"""


def test_concurrent_jobs_each_get_their_own_exit_code() -> None:
    # Snakemake runs jobs from several threads: one job starting while another ends
    # used to make one of them read end-of-file for a status and report 255.
    proc = subprocess.run([sys.executable, "-c", CONCURRENT_JOBS], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"succeed": [0] * 50, "fail": [3] * 50}
