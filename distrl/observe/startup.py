"""What a run says on the console while it starts, before training's progress line takes over.

Starting Ray and the role processes takes seconds (each role process imports torch) with nothing else to
show, so the start says what it is doing: on a terminal one updating line (carriage return), cleared when
the progress line takes over; plain lines when the console is not a terminal. Same stream and switch as
the progress line (stderr, `log.progress`). Ray-free: the Ray modes feed it from `distrl.runtime`.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import TextIO

CLEAR = "\r\x1b[K"  # back to the line's start and erase it (ANSI: every terminal tqdm draws on)


class StartupLine:
    def __init__(self, start_time: float, enabled: bool, stream: TextIO | None = None):
        """`start_time`: the command's start (elapsed seconds count from it); `enabled`: log.progress."""
        self.start, self.enabled = start_time, enabled
        self.stream = stream if stream is not None else sys.stderr  # looked up now: a caller may swap it
        self.tty = enabled and self.stream.isatty()
        self.shown = False  # an updating line is on the terminal
        self.labels: list[str] = []  # the processes started, as `starting` named them
        self.answered = 0
        self.lock = threading.Lock()  # readiness is reported from a thread of its own

    def say(self, text: str) -> None:
        line = f"{time.time() - self.start:6.1f}s  {text}"  # as the progress line's wall seconds
        with self.lock:
            if not self.enabled:
                return
            # Cut to the terminal's width: a wrapped line would not be rewritten in place, only its last row.
            self.stream.write(CLEAR + line[:self._width() - 1] if self.tty else line + "\n")
            self.stream.flush()
            self.shown = self.tty

    def _width(self) -> int:
        try:
            return os.get_terminal_size(self.stream.fileno()).columns
        except (OSError, ValueError):  # not a real terminal's file (or closed): the usual width
            return 80

    def starting(self, labels: list[str]) -> None:
        """These processes were started: each is counted ready once `ready` names it."""
        if not labels:
            return
        self.labels += labels
        self.say(f"starting {len(labels)} process{'es' if len(labels) > 1 else ''}: {', '.join(labels)}")

    def ready(self, label: str) -> None:
        self.answered += 1
        self.say(f"{self.answered} of {len(self.labels)} ready: {label}")

    def close(self) -> None:
        """The start is over (training's progress line takes over, or an error is printed): the updating
        line is erased so that neither is drawn over its text, and nothing more is said."""
        with self.lock:
            self.enabled = False
            if self.shown:
                self.stream.write(CLEAR)
                self.stream.flush()
                self.shown = False
