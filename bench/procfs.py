"""What Linux's /proc says of a process: its state, parent, start time and descendants.

The chaos run and the tests that kill or stop roles tell processes apart by (pid, start time), so a
pid the kernel hands out again later is never taken for the process that had it first.
"""
from __future__ import annotations

from distrl.runtime.local_eval import descendants  # noqa: F401 - the walk the evaluator's kill uses


def stat_fields(pid: int) -> list[str]:
    """/proc/<pid>/stat's fields after the command name (state, ppid, ...), or [] if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def parent(pid: int) -> int:
    fields = stat_fields(pid)
    return int(fields[1]) if len(fields) > 1 else 0


def started_at(pid: int) -> int | None:
    """When the process started, in clock ticks since boot (None if it is gone)."""
    fields = stat_fields(pid)
    return int(fields[19]) if len(fields) > 19 else None
