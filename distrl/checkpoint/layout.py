"""The on-disk layout of a whole-run checkpoint (see `distrl.checkpoint.run`): names, hashes, completeness."""
from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any

FORMAT_VERSION = 2
"""2: networks built by the torso factory (parameter names changed) and configs per algorithm."""
DONE = "DONE"
META, STATE, LEARNER = "meta.json", "state.json", "learner.pt"
CKPT_RE = re.compile(r"^ckpt-(\d{8,})$")
TMP_PREFIX = ".tmp-ckpt-"


def fsync_dir(d: str) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse directory fsync; the rename itself is still atomic
    finally:
        os.close(fd)


def json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def one_line(e: BaseException) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
    # torch buries the reason after paragraphs of advice; keep just the reason.
    m = re.search(r"WeightsUnpickler error: ([^\n]*)", text)
    if m:
        text = "refused by weights_only: " + m.group(1).split(" Please ")[0].rstrip(".")
    elif "PytorchStreamReader" in text:
        text = text.split(". ")[0]
    msg = " ".join(f"{type(e).__name__}: {text}".split())
    return msg if len(msg) <= 300 else msg[:297] + "..."


def ckpt_dirs(root: str) -> list[tuple[int, str]]:
    """(number, path) of every ``ckpt-N`` dir under `root`, oldest first."""
    if not os.path.isdir(root):
        return []
    out = []
    for name in os.listdir(root):
        m = CKPT_RE.match(name)
        if m and os.path.isdir(os.path.join(root, name)):
            out.append((int(m.group(1)), os.path.join(root, name)))
    return sorted(out)


def done_problem(path: str) -> str | None:
    """Cheap completeness check (DONE parses, listed files have their sizes); None if fine."""
    done = os.path.join(path, DONE)
    if not os.path.isfile(done):
        return "no DONE marker (interrupted while writing?)"
    try:
        with open(done) as fh:
            files = json.load(fh)["files"]
        for name, info in files.items():
            if os.path.getsize(os.path.join(path, name)) != info["size"]:
                return f"{name} has the wrong size"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"unreadable DONE or missing file ({one_line(e)})"
    return None
