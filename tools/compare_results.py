"""Compare two results folders file by file: do two runs of a grid hold the same results?

    python tools/compare_results.py RESULTS_A RESULTS_B [--rtol R] [--ignore FIELD ...] [--exclude FOLDER ...]

Every result file (a base model's summary and evaluations, each cell's training,
evaluations, memory evaluations and retention record, the memory jobs' files and
the summary) is read as JSON and compared field by field, without the fields in
which a job measures itself (``seconds``, ``peak_rss_bytes``, ``peak_gpu_bytes``). The
weights of every checkpoint both folders kept are compared byte for byte (``*.safetensors``). Numbers must be equal, or, with
``--rtol``, within that relative tolerance; ``--ignore diagnostics`` leaves out
whole fields of that name (e.g. when a change is known to reround them); ``--exclude``
leaves out a folder of either (another study's results kept inside this one's).

Prints one line per file that differs (its first differences), then a count, and
exits 1 if any file differs or is present in one folder only. Used to show that a
change of the code left the default grid's results as they were (docs/architecture.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from pathlib import Path

# What a job measures of itself, never the same twice: wall-clock time of a job or step, and
# the peak memory its process held (the cost record's; allocator and page-cache noise).
VOLATILE = {"seconds", "peak_rss_bytes", "peak_gpu_bytes"}


def result_files(root: Path, exclude: tuple[str, ...] = ()) -> list[str]:
    """The result files under ``root`` (but its ``exclude`` folders): JSON outside model and
    checkpoint folders, and checkpoint weights."""
    found = []
    for path in root.rglob("*"):
        if not path.is_file():
            continue
        parts = path.relative_to(root).parts
        if parts[0] in exclude:
            continue
        if parts[0] in (".matrixrl", ".snakemake", "logs") or path.name == "matrixrl.sqlite":
            continue
        inside_model = "model" in parts[:-1] or "checkpoints" in parts[:-1]
        if path.suffix == ".json" and not inside_model:
            found.append(str(path.relative_to(root)))
        elif path.suffix == ".safetensors" and "checkpoints" in parts:
            found.append(str(path.relative_to(root)))
    return sorted(found)


def differences(a, b, rtol: float, ignore: set[str], where: str = "") -> list[str]:
    """Where two JSON values differ (paths like ``metrics[3].loss``), ignoring volatile and ignored keys."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b)):
            if key in VOLATILE or key in ignore:
                continue
            if key not in a or key not in b:
                out.append(f"{where}.{key}: only in {'B' if key not in a else 'A'}")
            else:
                out += differences(a[key], b[key], rtol, ignore, f"{where}.{key}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} items vs {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, rtol, ignore, f"{where}[{i}]")]
    if isinstance(a, float) and isinstance(b, (int, float)) or isinstance(b, float) and isinstance(a, (int, float)):
        if a == b or (rtol > 0 and math.isclose(a, b, rel_tol=rtol, abs_tol=0.0)):
            return []
        return [f"{where}: {a!r} vs {b!r}"]
    return [] if a == b else [f"{where}: {a!r} vs {b!r}"]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def compare(
    first: Path, second: Path, rtol: float = 0.0, ignore: set[str] = frozenset(), exclude: tuple[str, ...] = ()
) -> tuple[int, list[str]]:
    """``(files compared, lines saying what differs)``."""
    a, b = set(result_files(first, exclude)), set(result_files(second, exclude))
    lines = [f"{name}: only in {label}" for label, names in (("A", a - b), ("B", b - a)) for name in sorted(names)]
    both = sorted(a & b)
    for name in both:
        if name.endswith(".safetensors"):
            if digest(first / name) != digest(second / name):
                lines.append(f"{name}: the weights differ")
            continue
        found = differences(json.loads((first / name).read_text()), json.loads((second / name).read_text()), rtol, ignore)
        if found:
            shown = "; ".join(found[:3]) + (f"; and {len(found) - 3} more" if len(found) > 3 else "")
            lines.append(f"{name}: {shown}")
    return len(both), lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    parser.add_argument("--rtol", type=float, default=0.0, help="relative tolerance of numbers (default: equal)")
    parser.add_argument("--ignore", action="append", default=[], help="a field name to leave out wherever it is")
    parser.add_argument("--exclude", action="append", default=[], help="a folder of the results folders to leave out")
    args = parser.parse_args(argv)
    for folder in (args.first, args.second):
        if not folder.is_dir():
            parser.error(f"{folder} is not a folder")
    compared, lines = compare(args.first, args.second, args.rtol, set(args.ignore), tuple(args.exclude))
    for line in lines:
        print(line)
    weights = sum(1 for name in result_files(args.first, tuple(args.exclude)) if name.endswith(".safetensors"))
    print(f"{compared} files compared ({weights} checkpoint weight files): "
          f"{'all equal' if not lines else f'{len(lines)} differ or are in one folder only'}")  # fmt: skip
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
