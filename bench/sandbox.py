"""Overhead of the code sandbox per program, against starting a bare interpreter.

Every program is trivial and passes (``def f(): return i`` / ``assert f() == i``,
a different ``i`` each time so the verdict cache never answers), so its time is the
sandbox's own cost: compiling in the host, the launcher (namespaces, uid drop),
interpreter start, limits and audit hook, verdict, clean-up. Measured in one run,
interleaved so machine load hits every variant alike:

- ``python -c pass``: the reference, a bare ``subprocess.run`` of this interpreter
  (site-packages included, as a plain ``python`` starts);
- ``python -I -S -c pass``: the same, with the sandbox's interpreter flags;
- ``run()``: one sandbox at a time, with the strongest isolation available;
- ``run(), no namespaces``: the same without the launcher (audit hook and limits only);
- ``run_many(workers=W)``: a batch; per-program latency and wall time per program.

    python bench/sandbox.py [--programs 40] [--workers 2]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def trivial_job(i: int) -> tuple[str, str]:
    return f"def f():\n    return {i}\n", f"assert f() == {i}\n"


def timed_process(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=40)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    from matrixrl import sandbox

    limits = {"timeout_s": 10.0, "memory_mb": 256}
    mode = sandbox.isolation()  # probed once, outside the timings
    strongest = sandbox.isolation

    def sandboxed(i: int, *, namespaces: bool) -> float:
        sandbox.isolation = strongest if namespaces else (lambda: ("none", ()))
        try:
            result = sandbox.run(*trivial_job(i), **limits)
        finally:
            sandbox.isolation = strongest
        assert result.passed, result
        return result.seconds

    samples: dict[str, list[float]] = {
        "python -c pass": [], "python -I -S -c pass": [], "run()": [], "run(), no namespaces": [],
    }
    sandboxed(-1, namespaces=True)  # warm the page cache
    for i in range(args.programs):
        samples["python -c pass"].append(timed_process([sys.executable, "-c", "pass"]))
        samples["python -I -S -c pass"].append(timed_process([sys.executable, "-I", "-S", "-c", "pass"]))
        samples["run()"].append(sandboxed(i, namespaces=True))
        samples["run(), no namespaces"].append(sandboxed(args.programs + i, namespaces=False))

    batch = [trivial_job(2 * args.programs + i) for i in range(args.programs)]
    started = time.perf_counter()
    results = sandbox.run_many(batch, workers=args.workers, **limits)
    batch_wall = time.perf_counter() - started
    assert all(r.passed for r in results), [r for r in results if not r.passed][:3]
    samples[f"run_many(workers={args.workers}) latency"] = [r.seconds for r in results]

    rows = {name: statistics.median(values) for name, values in samples.items()}
    rows[f"run_many(workers={args.workers}) wall/program"] = batch_wall / args.programs
    bare, isolated = rows["python -c pass"], rows["python -I -S -c pass"]
    print(f"isolation: {mode[0]}; {args.programs} programs per row; median seconds per program")
    print(f"{'variant':34} {'seconds':>8} {'vs python -c pass':>18} {'vs python -I -S':>16}")
    for name, seconds in rows.items():
        print(f"{name:34} {seconds:8.4f} {seconds / bare:17.2f}x {seconds / isolated:15.2f}x")


if __name__ == "__main__":
    main()
