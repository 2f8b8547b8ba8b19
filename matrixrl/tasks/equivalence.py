"""Mathematical equivalence of a model's answer and a reference, by math-verify (docs/tasks.md)."""

from __future__ import annotations

import json
import logging
import select
import subprocess
import sys
import threading
from collections.abc import Sequence
from functools import lru_cache

# math-verify warns on every timeout and on disabled timeouts; a score of 0 says enough.
logging.getLogger("math_verify").setLevel(logging.ERROR)


def parse_answer(text: str, timeout_s: int | None):
    """math-verify's parse of ``text`` (a list of SymPy objects and strings; empty if none)."""
    from math_verify import parse

    text = text.strip()
    if not text:
        return []
    math_mode = f"${text}$"
    for attempt in (math_mode, text) if "\\" in text else (text, math_mode):
        parsed = parse(attempt, parsing_timeout=timeout_s)
        if parsed:
            return parsed
    return []


@lru_cache(maxsize=65536)
def _parsed_reference(reference: str, timeout_s: int | None):
    # A reference is parsed once per process however often it is scored.
    return parse_answer(reference, timeout_s)


def equivalent(reference: str, answer: str, timeout_s: int | None) -> bool:
    """Whether ``answer`` is mathematically equal to ``reference`` (in this thread)."""
    from math_verify import verify

    gold = _parsed_reference(reference, timeout_s)
    candidate = parse_answer(answer, timeout_s)
    if not gold or not candidate:
        return False
    return bool(verify(gold, candidate, timeout_seconds=timeout_s))


def equivalent_batch(pairs: Sequence[tuple[str, str]], timeout_s: int) -> list[bool]:
    """``equivalent`` for (reference, answer) pairs, each bounded by about ``timeout_s`` per step.

    In the main thread math-verify's own alarms bound the work; elsewhere the pairs
    go to the helper process.
    """
    if threading.current_thread() is threading.main_thread():
        return [equivalent(reference, answer, timeout_s) for reference, answer in pairs]
    return _helper().check(pairs, timeout_s)


class _Helper:
    """A long-lived ``python -m matrixrl.tasks.equivalence`` answering one pair per line."""

    # A pair may take a parse of each side plus a few comparisons, each bounded by
    # timeout_s inside the helper; past this many timeouts it is stuck and is killed.
    STEPS_PER_PAIR = 6
    STARTUP_S = 30.0  # importing sympy and math-verify in a fresh process

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._fresh = False

    def _start(self) -> subprocess.Popen:
        if self._process is None or self._process.poll() is not None:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "matrixrl.tasks.equivalence"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                bufsize=1,
            )
            self._fresh = True
        return self._process

    def _kill(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None

    def _ask(self, reference: str, answer: str, timeout_s: int) -> bool:
        process = self._start()
        limit = timeout_s * self.STEPS_PER_PAIR + (self.STARTUP_S if self._fresh else 1.0)
        try:
            process.stdin.write(json.dumps([reference, answer, timeout_s]) + "\n")
            process.stdin.flush()
            ready, _, _ = select.select([process.stdout], [], [], limit)
            line = process.stdout.readline() if ready else ""
        except (BrokenPipeError, OSError):
            line = ""
        if not line:  # overran or died: no answer for this pair, a fresh helper for the next
            self._kill()
            return False
        self._fresh = False
        return bool(json.loads(line))

    def check(self, pairs: Sequence[tuple[str, str]], timeout_s: int) -> list[bool]:
        with self._lock:
            return [self._ask(reference, answer, timeout_s) for reference, answer in pairs]


_HELPER: _Helper | None = None
_HELPER_LOCK = threading.Lock()


def _helper() -> _Helper:
    global _HELPER
    with _HELPER_LOCK:
        if _HELPER is None:
            _HELPER = _Helper()
        return _HELPER


def _serve() -> None:
    """The helper process: read ``[reference, answer, timeout_s]`` lines, write ``true``/``false``."""
    for line in sys.stdin:
        reference, answer, timeout_s = json.loads(line)
        try:
            result = equivalent(reference, answer, timeout_s)
        except Exception:  # a parse or comparison that fails is not a match
            result = False
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _serve()
