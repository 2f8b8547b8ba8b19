"""Reading Snakemake's log: the events a run's progress display shows, and the time a run has left."""

from __future__ import annotations

import re
from dataclasses import dataclass

@dataclass
class RunEvent:
    """What the run's progress display needs from Snakemake's log."""

    kind: str  # "start" | "finished" | "failed" | "progress" | "nothing" | "locked" | "line"
    rule: str | None = None
    wildcards: str = ""
    log: str = ""
    done: int = 0
    total: int = 0
    text: str = ""
    jobid: str = ""


_PROGRESS = re.compile(r"(\d+) of (\d+) steps \(\d+%\) done")
_BLOCK = re.compile(r"^(?:(?:local)?rule|Error in rule) (\w+):$")
_FIELD = re.compile(r"^\s+(\w+): (.*)$")
_FINISHED = re.compile(r"^Finished jobid: (\d+) \(Rule: (\w+)\)")


class LogParser:
    """Snakemake's log, line by line, as :class:`RunEvent` s; knows which jobs are running."""

    def __init__(self) -> None:
        self.running: dict[str, str] = {}
        """jobid → rule of each job started and not yet finished or failed (``all`` aside)."""
        self._wildcards_of: dict[str, str] = {}
        self._block: dict | None = None

    def feed(self, line: str) -> list[RunEvent]:
        events = []
        if self._block is not None:
            if field := _FIELD.match(line):
                self._block.setdefault(field.group(1), field.group(2).strip())
                return events
            events.append(self._close())
        if match := _BLOCK.match(line):
            self._block = {"rule": match.group(1), "error": line.startswith("Error")}
        elif match := _FINISHED.match(line):
            self.running.pop(match.group(1), None)
            events.append(RunEvent("finished", rule=match.group(2), jobid=match.group(1), text=line))
        elif match := _PROGRESS.search(line):
            events.append(RunEvent("progress", done=int(match.group(1)), total=int(match.group(2))))
        elif "Nothing to be done" in line:
            events.append(RunEvent("nothing", text=line))
        elif "cannot be locked" in line:
            events.append(RunEvent("locked", text=line))
        else:
            events.append(RunEvent("line", text=line))
        return events

    def close(self) -> list[RunEvent]:
        return [self._close()] if self._block is not None else []

    def _close(self) -> RunEvent:
        block, self._block = self._block, None
        jobid = block.get("jobid", "")
        wildcards = block.get("wildcards") or self._wildcards_of.get(jobid, "")
        if block["error"]:
            self.running.pop(jobid, None)
            return RunEvent("failed", rule=block["rule"], wildcards=wildcards, log=block.get("log", "").split(" (")[0], jobid=jobid)
        self._wildcards_of[jobid] = wildcards
        if block["rule"] != "all":
            self.running[jobid] = block["rule"]
        return RunEvent("start", rule=block["rule"], wildcards=wildcards, jobid=jobid)


class TimeLeft:
    """What a run's progress line says: the jobs running, and the time left, from the jobs finished so far."""

    def __init__(self, pending: dict[str, int], cores: int) -> None:
        self.waiting = dict(pending)  # rule → jobs not started yet
        self.cores = max(1, cores)
        self.running: dict[str, tuple[str, float]] = {}  # jobid → (rule, start time)
        self.durations: dict[str, list[float]] = {}

    def started(self, jobid: str, rule: str, now: float) -> None:
        self.running[jobid] = (rule, now)
        if self.waiting.get(rule, 0) > 0:
            self.waiting[rule] -= 1

    def finished(self, jobid: str, now: float) -> None:
        if (job := self.running.pop(jobid, None)) is not None:
            self.durations.setdefault(job[0], []).append(now - job[1])

    def seconds_left(self, now: float) -> float | None:
        every = [d for durations in self.durations.values() for d in durations]
        if not every:
            return None
        overall = sum(every) / len(every)

        def mean(rule: str) -> float:
            durations = self.durations.get(rule)
            return sum(durations) / len(durations) if durations else overall

        work = sum(n * mean(rule) for rule, n in self.waiting.items())
        work += sum(max(mean(rule) - (now - began), 0.0) for rule, began in self.running.values())
        return work / self.cores

    def describe(self, now: float) -> str:
        counts: dict[str, int] = {}
        for rule, _ in self.running.values():
            counts[rule] = counts.get(rule, 0) + 1
        parts = [f"running: {', '.join(f'{rule} ×{n}' if n > 1 else rule for rule, n in counts.items())}"] if counts else []
        left = self.seconds_left(now)
        if left is not None and (counts or any(self.waiting.values())):
            parts.append(f"about {format_duration(left)} left")
        return " · ".join(parts) or "jobs"


def format_duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"
