"""Overhead of the code sandbox per program, against starting a bare interpreter.

Every program is trivial and passes (``def f(): return i`` / ``assert f() == i``,
a different ``i`` each time so the verdict cache never answers), so its time is the
sandbox's own cost: compiling in the host, handing the job to a worker, its fork,
limits and audit hook, verdict, clean-up. Measured in one run, interleaved so
machine load hits every variant alike:

- ``python -c pass``: a bare ``subprocess.run`` of this interpreter (site-packages
  included, as a plain ``python`` starts);
- ``python -I -S -c pass``: the same with the sandbox's interpreter flags, the
  reference: what one fresh interpreter per program costs at the least;
- ``run()``: one sandbox at a time, with the strongest isolation available (``view``:
  a filesystem, mount, PID and network namespaces of its own), in the process's started
  worker (the normal path);
- ``run(entry_point='f')``: the same with the tests in a process of their own, calling
  ``f`` in the program's (what the code tasks run);
- ``run(), no namespaces``: the same with a worker without the launcher (audit hook
  and limits only);
- ``run(), worker start``: a run that first starts its worker (the first of a process);
- ``sandbox directory``: making and removing one program's directory in TMPDIR, part
  of every run without the view (in the view the worker empties its tmpfs scratch);
- ``run_many(workers=W)``: a batch; per-program latency and wall time per program.

Then CPU seconds per program, which machine load inflates far less than wall time:
``python -I -S -c pass`` (the processes' own), and ``run()`` in one worker (the
caller's, plus the worker's and its children's, counted once the worker has ended).

    python bench/sandbox.py [--programs 40] [--workers 2]
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def trivial_job(i: int) -> tuple[str, str]:
    return f"def f():\n    return {i}\n", f"assert f() == {i}\n"


def timed_process(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True)
    return time.perf_counter() - started


def timed_directory() -> float:
    started = time.perf_counter()
    shutil.rmtree(tempfile.mkdtemp(prefix="matrixrl-sandbox-"))
    return time.perf_counter() - started


def cpu_seconds(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def cpu_per_program(programs: int, sandbox, next_job) -> tuple[float, float]:
    """CPU seconds of one ``python -I -S -c pass``, and of one run() in a worker."""
    limits = {"timeout_s": 10.0, "memory_mb": 256}
    sandbox._workers().close()  # the earlier workers' CPU counted before these figures
    children = cpu_seconds(resource.RUSAGE_CHILDREN)
    for _ in range(programs):
        subprocess.run([sys.executable, "-I", "-S", "-c", "pass"], check=True)
    interpreter = (cpu_seconds(resource.RUSAGE_CHILDREN) - children) / programs

    def worker_lifetime(runs: int) -> tuple[float, float]:
        """The caller's CPU over ``runs`` runs after the first (which starts the
        worker), and the worker's whole, counted once it is ended and reaped."""
        children = cpu_seconds(resource.RUSAGE_CHILDREN)
        assert sandbox.run(*next_job(), **limits).passed
        caller = cpu_seconds(resource.RUSAGE_SELF)
        for _ in range(runs):
            assert sandbox.run(*next_job(), **limits).passed
        caller = cpu_seconds(resource.RUSAGE_SELF) - caller
        sandbox._workers().close()
        return caller, cpu_seconds(resource.RUSAGE_CHILDREN) - children

    caller, worker = worker_lifetime(programs)
    _, start_and_end = worker_lifetime(0)  # one program, and the worker's start and end
    return interpreter, (caller + worker - start_and_end) / programs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=40)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    from matrixrl import sandbox

    limits = {"timeout_s": 10.0, "memory_mb": 256}
    mode = sandbox.isolation()  # probed once, outside the timings
    strongest = sandbox.isolation
    jobs = iter(range(10**9))

    def sandboxed(*, namespaces: bool = True, cold: bool = False, apart: bool = False) -> float:
        code, tests = trivial_job(next(jobs))
        sandbox.isolation = strongest if namespaces else (lambda: ("none", ()))
        try:
            if cold:
                sandbox._workers().close(*sandbox.isolation())
            result = sandbox.run(code, tests, **limits, entry_point="f" if apart else None)
        finally:
            sandbox.isolation = strongest
        assert result.passed, result
        return result.seconds

    variants = {
        "python -c pass": lambda: timed_process([sys.executable, "-c", "pass"]),
        "python -I -S -c pass": lambda: timed_process([sys.executable, "-I", "-S", "-c", "pass"]),
        "run()": sandboxed,
        "run(entry_point='f')": lambda: sandboxed(apart=True),
        "run(), no namespaces": lambda: sandboxed(namespaces=False),
        "run(), worker start": lambda: sandboxed(cold=True),
        "sandbox directory": timed_directory,
    }
    samples: dict[str, list[float]] = {name: [] for name in variants}
    sandboxed()  # start both workers (and warm the page cache)
    sandboxed(namespaces=False)
    for _ in range(args.programs):
        for name, measure in variants.items():
            samples[name].append(measure())

    batch = [trivial_job(next(jobs)) for _ in range(args.programs)]
    sandbox.run_many(batch[:args.workers], workers=args.workers, **limits)  # start its workers
    batch = batch[args.workers:]
    started = time.perf_counter()
    results = sandbox.run_many(batch, workers=args.workers, **limits)
    batch_wall = time.perf_counter() - started
    assert all(r.passed for r in results), [r for r in results if not r.passed][:3]
    samples[f"run_many(workers={args.workers}) latency"] = [r.seconds for r in results]

    rows = {name: statistics.median(values) for name, values in samples.items()}
    rows[f"run_many(workers={args.workers}) wall/program"] = batch_wall / len(batch)
    bare, isolated = rows["python -c pass"], rows["python -I -S -c pass"]
    print(f"isolation: {mode[0]}; {args.programs} programs per row; median seconds per program")
    print(f"{'variant':34} {'seconds':>8} {'vs python -c pass':>18} {'vs python -I -S':>16}")
    for name, seconds in rows.items():
        print(f"{name:34} {seconds:8.4f} {seconds / bare:17.2f}x {seconds / isolated:15.2f}x")
    interpreter_cpu, run_cpu = cpu_per_program(
        args.programs, sandbox, lambda: trivial_job(next(jobs))
    )
    print(
        f"CPU per program: python -I -S -c pass {interpreter_cpu * 1000:.1f} ms, "
        f"run() in a worker {run_cpu * 1000:.1f} ms ({run_cpu / interpreter_cpu:.2f}x)"
    )
    print(
        f"run() in a worker: {rows['run()'] * 1000:.1f} ms per program, "
        f"{rows['run()'] / isolated:.2f}x python -I -S -c pass "
        f"({isolated * 1000:.1f} ms); with the entry point {rows['run(entry_point=' + repr('f') + ')'] * 1000:.1f} ms "
        f"({rows['run(entry_point=' + repr('f') + ')'] / isolated:.2f}x)"
    )


if __name__ == "__main__":
    main()
