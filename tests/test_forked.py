"""Jobs forked from the pre-imported server report their own exit codes, from any thread."""

from __future__ import annotations

import threading

from matrixrl.jobs.forked import _FORKSERVER, run_to_end


def succeed() -> None:
    pass


def fail() -> None:
    raise SystemExit(3)


def test_concurrent_jobs_each_get_their_own_exit_code() -> None:
    # Snakemake runs jobs from several threads: one job starting while another ends
    # used to make one of them read end-of-file for a status and report 255.
    codes: dict[str, list[int]] = {"succeed": [], "fail": []}

    def worker(target) -> None:
        for _ in range(25):
            codes[target.__name__].append(run_to_end(_FORKSERVER.Process(target=target)))

    threads = [threading.Thread(target=worker, args=(t,)) for t in (succeed, fail, succeed, fail)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert codes == {"succeed": [0] * 50, "fail": [3] * 50}
