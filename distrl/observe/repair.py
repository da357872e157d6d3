"""Cutting a run's logs back to a checkpoint, so a resumed run does not repeat rows.

A run that died after its last checkpoint left rows for steps that the resumed run does again
(and perhaps a half-written last line): keep only complete rows up to the checkpoint's wall time.
"""
from __future__ import annotations

import csv
import io
import json
import os

from distrl.checkpoint.files import atomic_write


def _keep_csv(text: str, wall_s: float) -> tuple[str, int]:
    lines = text.splitlines(keepends=True)
    if not lines:
        return text, 0
    header, kept = lines[0], [lines[0]]
    width = len(next(csv.reader([header])))
    for line in lines[1:]:
        row = next(csv.reader([line]), [])
        complete = line.endswith("\n") and len(row) == width
        if complete and _float(row[0]) is not None and _float(row[0]) <= wall_s:
            kept.append(line)
    return "".join(kept), len(lines) - len(kept)


def _keep_jsonl(text: str, wall_s: float) -> tuple[str, int]:
    lines = text.splitlines(keepends=True)
    kept = []
    for line in lines:
        try:
            row = json.loads(line) if line.endswith("\n") else None
        except ValueError:
            row = None
        if isinstance(row, dict) and isinstance(row.get("wall_s"), (int, float)) and row["wall_s"] <= wall_s:
            kept.append(line)
    return "".join(kept), len(lines) - len(kept)


def _float(x: str) -> float | None:
    try:
        return float(x)
    except ValueError:
        return None


def repair_logs(run_dir: str, wall_s: float) -> dict[str, int]:
    """Cut metrics.csv and learner.jsonl to complete rows with wall_s <= `wall_s`; rows removed per file."""
    cut = {}
    for name, keep in (("metrics.csv", _keep_csv), ("learner.jsonl", _keep_jsonl)):
        path = os.path.join(run_dir, name)
        if not os.path.isfile(path):
            continue
        with open(path, newline="") as fh:
            text, removed = keep(fh.read(), wall_s + 1e-6)
        if removed:
            def write(tmp: str, text=text) -> None:
                with io.open(tmp, "w", newline="") as out:
                    out.write(text)
            atomic_write(path, write)
        cut[name] = removed
    return cut
