"""What the observe commands need from a run dir, and the one error they raise when it is not there."""
from __future__ import annotations

import os


class RunDataError(Exception):
    """A run dir lacks what a command needs (the CLI prints it as one line, exit 2)."""


def run_file(run_dir: str, name: str, hint: str = "") -> str:
    """Path of `name` in `run_dir`; RunDataError if the run dir or the file is missing."""
    if not os.path.isdir(run_dir):
        raise RunDataError(f"run dir not found: {run_dir}")
    path = os.path.join(run_dir, name)
    if not os.path.isfile(path):
        raise RunDataError(f"{run_dir} has no {name}{hint}")
    return path
