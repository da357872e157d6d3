"""How long each fault of a chaos run (`bench.chaos`) took: to be found (the death noticed, or the hang ended)
and to be resolved (its new process back), from its signal.

distrl writes one line per fault into RUN_DIR/faults.log once it is resolved, e.g. `worker 1 hung (no
answer within 5 s), ended, restarted in 2.1 s`: the moment that line appears is when it was resolved, and
that moment less the seconds it gives is when it was found (to within the 0.5 s at which the driver reads
Ray's actor table). `FaultLines` notes each line's moment as it appears."""
from __future__ import annotations

import os
import statistics
import threading
import time


class FaultLines(threading.Thread):
    """(when it appeared, the text) of each `distrl:` line of RUN_DIR/faults.log, read every 0.1 s."""

    def __init__(self, run_dir: str):
        super().__init__(daemon=True)
        self.path, self.lines, self.done, self.read = os.path.join(run_dir, "faults.log"), [], threading.Event(), 0

    def run(self) -> None:
        while not self.done.wait(0.1):
            self.scan()

    def scan(self) -> None:
        if not os.path.exists(self.path):
            return
        with open(self.path) as fh:
            fh.seek(self.read)
            text = fh.read()
        whole = text[:text.rfind("\n") + 1]  # a line being written is read next time
        self.read += len(whole.encode())
        now = time.time()
        self.lines += [(now, line.split("] distrl: ", 1)[1]) for line in whole.splitlines() if "] distrl: " in line]


def is_line_of(text: str, label: str) -> bool:
    return text.startswith(label) and ", restarted " in text and not (label == "worker " and text.startswith("gradient"))


def restart_took(text: str) -> float:
    """The seconds a line gives its restart: `restarted in 2.1 s`; `restarted within 0.5 s` (back before the
    driver's next read of Ray's table) is taken as none."""
    return float(text.rsplit("restarted in ", 1)[1].split(" s")[0]) if "restarted in " in text else 0.0


def fault_times(faults: list[dict], lines: list[tuple[float, str]], labels: dict[str, str]) -> None:
    """Add "found_s" and "resolved_s" to each fault (a dict with its "role" and the "at" of its signal): a
    role's faults come one at a time (each waits for the one before to be resolved), so its lines are its
    faults', in order."""
    for role, label in labels.items():
        ours = [(seen, text) for seen, text in lines if is_line_of(text, label)]
        for fault, (seen, text) in zip([f for f in faults if f["role"] == role], ours):
            took = restart_took(text)
            fault["found_s"], fault["resolved_s"] = round(seen - took - fault["at"], 2), round(seen - fault["at"], 2)


def summarize(faults: list[dict]) -> dict:
    """Per signal: how many, and the median and max seconds to be found and to be resolved."""
    out = {}
    for action in ("SIGKILL", "SIGSTOP"):
        timed = [f for f in faults if f["action"] == action and "found_s" in f]
        if timed:
            out[action] = {"n": len(timed), **{f"{k}_{stat}": round(fn([f[f"{k}_s"] for f in timed]), 1)
                                                for k in ("found", "resolved")
                                                for stat, fn in (("median", statistics.median), ("max", max))}}
    return out
