"""The start-up line: one updating line on a terminal, erased when training's progress line takes over;
plain lines elsewhere; nothing with log.progress off."""
import io
import os
import re
import subprocess
import sys
import time

from distrl.observe.startup import CLEAR, StartupLine

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def say_a_start(line: StartupLine) -> None:
    line.say("starting apex_dqn on CartPole-v1 (async mode); Ray starting")
    line.starting(["learner", "worker 0"])
    line.ready("worker 0")
    line.ready("learner")


def test_on_a_terminal_the_start_is_one_line_rewritten_then_erased():
    stream = Terminal()
    line = StartupLine(time.time() - 2.0, enabled=True, stream=stream)
    say_a_start(line)
    shown = stream.getvalue()
    assert "\n" not in shown  # never a new line: each message overwrites the one before
    messages = shown.split(CLEAR)[1:]
    assert [m.split("s  ", 1)[1] for m in messages] == [
        "starting apex_dqn on CartPole-v1 (async mode); Ray starting", "starting 2 processes: learner, worker 0",
        "1 of 2 ready: worker 0", "2 of 2 ready: learner"]
    assert all(m.startswith("   2.") for m in messages)  # seconds since the command's start, as the progress line
    line.close()
    assert stream.getvalue() == shown + CLEAR  # erased: the progress bar starts on a clean line
    line.close()
    line.ready("worker 1")  # a late answer: the progress bar has the line now
    assert stream.getvalue() == shown + CLEAR  # erased once, nothing said since


def test_off_a_terminal_each_message_is_a_plain_line():
    stream = io.StringIO()
    line = StartupLine(time.time(), enabled=True, stream=stream)
    say_a_start(line)
    line.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 4 and "\r" not in stream.getvalue() and "\x1b" not in stream.getvalue()
    assert lines[-1].endswith("s  2 of 2 ready: learner")


def test_log_progress_off_says_nothing():
    for stream in (Terminal(), io.StringIO()):
        line = StartupLine(time.time(), enabled=False, stream=stream)
        say_a_start(line)
        line.close()
        assert stream.getvalue() == ""


def test_on_a_terminal_a_long_message_is_cut_to_its_width():
    """A line that wrapped would leave its first rows behind when rewritten (80 columns: no real terminal)."""
    stream = Terminal()
    StartupLine(time.time(), enabled=True, stream=stream).starting([f"worker {i}" for i in range(20)])
    assert len(stream.getvalue()) == len(CLEAR) + 79


def seconds_to_import(*modules: str) -> float:
    began = time.time()
    subprocess.run([sys.executable, "-c", f"import {', '.join(modules)}"], check=True, timeout=120)
    return time.time() - began


def test_a_piped_async_run_says_its_start_in_plain_lines_the_first_within_2_s(tmp_path):
    """`make run`'s command, piped, with a budget of one gather: the start is said from before Ray starts
    to every process ready, in plain lines before the progress lines."""
    # The first line needs the config read and checked, which imports torch and ray (~1.6 s of an idle
    # 2-core machine): on a loaded one those imports alone may take longer, and the bound grows with them.
    limit_s = max(2.0, 1.5 * seconds_to_import("torch", "ray") + 0.5)
    began = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "distrl.cli", "train", "configs/apex_dqn_cartpole.yaml",
                             "--run-dir", str(tmp_path / "run"), "--set", "stop.max_env_steps=1",
                             "--set", "log.tensorboard=false",
                             "--set", "fault.role_timeout_s=60"],  # the workers' wait: none is late, however loaded
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    first = proc.stderr.readline()
    first_s = time.time() - began
    out, rest = proc.communicate(timeout=240)
    err = first + rest
    assert proc.returncode == 0, err
    assert first_s < limit_s, (first_s, first)
    assert "\r" not in err and "\x1b" not in err, err  # not a terminal: plain lines
    lines = err.splitlines()
    said = [line.split("s  ", 1)[1] for line in lines if re.match(r" *\d+\.\ds  ", line)]
    labels = ["learner", "replay server", "parameter server", "evaluator", "worker 0", "worker 1"]
    assert said[:3] == ["starting apex_dqn on CartPole-v1 (async mode); Ray starting",
                        said[1], f"starting 6 processes: {', '.join(labels)}"], err
    assert re.fullmatch(r"Ray up in \d+\.\d s", said[1]), err
    ready = said[3:9]
    assert [r.split(": ")[0] for r in ready] == [f"{n} of 6 ready" for n in range(1, 7)], err
    assert sorted(r.split(": ")[1] for r in ready) == sorted(labels), err  # each once, as it answered
    assert said[9].startswith("steps "), err  # then training's own progress lines
    assert "not solved (max_env_steps)" in out
