"""Cost of ``matrixrl report --html`` the first time: no figure of the page in the store yet.

Times the whole command (``python -m matrixrl report -c CONFIG --html FILE``, a fresh
interpreter each time) on a finished study, in the same run and interleaved, so that
a noisy machine moves them all alike:

- ``again``: the page with nothing new, every figure cached (the reference);
- ``first``: the page after the store's figure cache is emptied (``DELETE FROM figures``);
- ``first, savefig``: the same, with each PNG made as before (``savefig``, then decoded
  again to be quantized), as a reference in the same run;
- with ``--before TREE``: ``first`` and ``again`` with the package of another source
  tree (e.g. ``git archive COMMIT matrixrl | tar -x -C /tmp/before``) first on ``PYTHONPATH``.

It prints the median wall time of each (and the CPU time of the command and of any
process it forked), the ratios first / again, savefig / first (and before / first), and
whether every page is the same (the same PNG bytes embedded).

The study folder is used in place: only its figure cache is emptied (the last page
leaves it filled). For the default study: ``git clone -q REPO study && cd study &&
python -m matrixrl run --cores 2``, then

    python bench/report_html.py -c study/experiments.yaml [--repeats 5] [--before /tmp/before]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

FORMER = r'''
import io, runpy, sys
import matrixrl.report.plots as plots

def png_bytes(fig, dpi=plots.PNG_DPI):  # as before: savefig (a figure with a layout engine walked twice), decoded again
    from PIL import Image
    rendered = io.BytesIO()
    fig.savefig(rendered, format="png", dpi=dpi, facecolor="white")
    rendered.seek(0)
    image = Image.open(rendered).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    out = io.BytesIO()
    image.save(out, format="png", optimize=True)
    return out.getvalue()

plots.png_bytes = png_bytes
sys.argv = ["matrixrl", *sys.argv[1:]]
runpy.run_module("matrixrl", run_name="__main__")
'''


def store_of(config: Path) -> Path:
    sys.path.insert(0, str(REPO))
    from matrixrl.config import load_config
    from matrixrl.layout import store_path

    return Path(store_path(load_config(config).results_dir))


def empty_figure_cache(store: Path) -> int:
    with sqlite3.connect(store) as db:
        return db.execute("DELETE FROM figures").rowcount


def command(config: Path, page: Path, how: str, before: Path | None) -> tuple[list[str], dict]:
    env = dict(os.environ)
    args = ["report", "-c", str(config), "--html", str(page)]
    if how == "former":
        return [sys.executable, "-c", FORMER, *args], env
    if how == "before":
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(before), env.get("PYTHONPATH")) if p)
    return [sys.executable, "-m", "matrixrl", *args], env


def timed(argv: list[str], env: dict, cwd: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the command and the processes it forked). ``cwd``: not the
    repository, whose matrixrl would come before ``PYTHONPATH``'s (``python -m`` and ``-c`` put
    the current folder first)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, cwd=cwd)
    wall = time.perf_counter() - began
    now = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (now.ru_utime - used.ru_utime) + (now.ru_stime - used.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--config", type=Path, required=True, help="experiments.yaml of a finished study")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--before", type=Path, help="a source tree whose matrixrl package is timed too")
    args = parser.parse_args()
    config = args.config.resolve()
    store = store_of(config)

    kinds = [("first", "new", True), ("again", "new", False), ("first, savefig", "former", True)]
    if args.before:
        kinds += [("before: first", "before", True), ("before: again", "before", False)]
    times: dict[str, list[tuple[float, float]]] = {name: [] for name, _, _ in kinds}
    pages: dict[str, set[str]] = {name: set() for name, _, _ in kinds}
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "report.html"
        timed(*command(config, page, "new", None), cwd=Path(tmp))  # ingest, summaries
        for repeat in range(args.repeats):
            for name, how, first in kinds:
                emptied = empty_figure_cache(store) if first else 0
                assert not first or emptied, f"{store}: no figure cached to empty"
                times[name].append(timed(*command(config, page, how, args.before), cwd=Path(tmp)))
                pages[name].add(hashlib.sha256(page.read_bytes()).hexdigest())
    print(f"report --html of {config} ({store.stat().st_size / 1e6:.0f} MB store), {args.repeats} runs each, interleaved")
    median = {name: statistics.median(w for w, _ in runs) for name, runs in times.items()}
    for name, runs in times.items():
        cpu = statistics.median(c for _, c in runs)
        spread = ", ".join(f"{w:.2f}" for w, _ in runs)
        print(f"{name:20s} {median[name]:6.2f} s  (cpu {cpu:5.2f} s; runs: {spread})")
    print(f"ratio first / again: {median['first'] / median['again']:.2f}x")
    print(f"ratio first, savefig / first: {median['first, savefig'] / median['first']:.2f}x")
    if args.before:
        print(f"ratio before: first / first: {median['before: first'] / median['first']:.2f}x")
    same = pages["first"] | pages["again"] | pages["first, savefig"]
    print(f"pages: {'all the same' if len(same) == 1 else f'{len(same)} different'}"
          + ("" if not args.before else f"; before's: {len(pages['before: first'] | pages['before: again'])} distinct"))  # fmt: skip


if __name__ == "__main__":
    main()
