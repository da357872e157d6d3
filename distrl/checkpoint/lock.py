"""One writer per run dir: an OS file lock held for the run's life (released by the OS if the process dies)."""
from __future__ import annotations

import fcntl
import os

from distrl.config import ConfigError

LOCK = ".lock"


class RunDirBusy(ConfigError):
    """Another live process is writing this run dir."""


class RunDirLock:
    """`RUN_DIR/.lock`, exclusively flock'ed; holds the owner's pid so a refusal can name it."""

    def __init__(self, run_dir: str):
        self.path = os.path.join(run_dir, LOCK)
        self.fd: int | None = None

    def acquire(self) -> "RunDirLock":
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:  # a read-only or foreign directory: the user's choice of run dir
            raise ConfigError(f"run dir {os.path.dirname(self.path)} is not writable: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise RunDirBusy(f"run dir {os.path.dirname(self.path)} is in use by another distrl process "
                             f"(pid {owner})") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the lock
            self.fd = None
