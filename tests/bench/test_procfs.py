import os
import signal
import subprocess
import sys
import time

from bench.procfs import descendants, parent, started_at, stat_fields


def test_a_child_and_its_child_are_found_below_us_and_told_apart_by_start_time():
    # A shell whose own child sleeps: two generations below this process.
    proc = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    try:
        deadline = time.time() + 10
        while True:
            below = descendants(os.getpid())
            grandchildren = [p for p in below if parent(p) == proc.pid]
            if grandchildren or time.time() > deadline:
                break
            time.sleep(0.01)
        assert proc.pid in below and grandchildren
        assert stat_fields(proc.pid)[1] == str(os.getpid())
        start = started_at(proc.pid)
        assert start is not None and start >= started_at(os.getpid())
        assert started_at(proc.pid) == start  # the same process, the same start
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        for pid in grandchildren:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_gone_process_has_no_fields():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert stat_fields(proc.pid) == [] and started_at(proc.pid) is None and parent(proc.pid) == 0
