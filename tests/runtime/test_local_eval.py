"""The evaluator process of single mode: ending it ends what it started."""
import subprocess
import sys
import time

from bench.procfs import descendants, stat_fields
from distrl.runtime.local_eval import kill_with_children


def test_a_killed_process_takes_its_children_and_theirs_along():
    """As a VizDoom env's game process is its env's child, which outlives a killed parent."""
    code = ("import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, \"-c\", \"import time; time.sleep(60)\"]); time.sleep(60)']); "
            "time.sleep(60)")
    root = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.time() + 30
    while len(descendants(root.pid)) < 2 and time.time() < deadline:
        time.sleep(0.05)
    below = descendants(root.pid)
    assert len(below) == 2, below
    kill_with_children(root.pid)
    root.wait(timeout=10)
    deadline = time.time() + 10
    while any(_alive(p) for p in below) and time.time() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in below)


def _alive(pid: int) -> bool:
    fields = stat_fields(pid)
    return bool(fields) and fields[0] != "Z"  # an orphan's zombie waits for init to reap it
