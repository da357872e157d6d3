"""What `distrl.tree` costs on the env-step path: its per-env operations on a flat observation against the
numpy operations they replace, and on a MiniGrid-shaped Dict (image + direction + action mask).

    python -m bench.tree_cost [--reps 7]

Per call, medians of `--reps` timings of 20,000 calls each (microseconds). A VectorEnv step calls
`assign` twice and `all_finite` once per env; a fragment's buffers call `as_arrays` and `assign` once per
field per step.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from bench.common import ROOT, hardware, write_json
from distrl import tree


def per_call_us(fn, calls: int = 20_000, reps: int = 7) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t) / calls * 1e6)
    return round(statistics.median(times), 3)


def cases(flat_row, flat, dict_row, dicts) -> dict[str, tuple]:
    def raw_assign():
        flat[3] = flat_row

    return {
        "assign (numpy)": (raw_assign,),
        "assign flat": (lambda: tree.assign(flat, 3, flat_row),),
        "assign dict": (lambda: tree.assign(dicts, 3, dict_row),),
        "all_finite (numpy)": (lambda: np.isfinite(flat_row).all(),),
        "all_finite flat": (lambda: tree.all_finite(flat_row),),
        "all_finite dict": (lambda: tree.all_finite(dict_row),),
        "index flat": (lambda: tree.index(flat, 3),),
        "index dict": (lambda: tree.index(dicts, 3),),
        "as_arrays flat": (lambda: tree.as_arrays(flat),),
        "as_arrays dict": (lambda: tree.as_arrays(dicts),),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    flat = np.zeros((16, 4), np.float32)
    dicts = {"image": np.zeros((16, 7, 7, 3), np.uint8), "direction": np.zeros(16, np.int64),
             "action_mask": np.ones((16, 7), np.int8)}
    flat_row, dict_row = flat[0].copy(), tree.copy(tree.index(dicts, 0))
    out = {name: per_call_us(fn, reps=args.reps) for name, (fn,) in cases(flat_row, flat, dict_row, dicts).items()}
    for name, us in out.items():
        print(f"{name:22s} {us:8.3f} us")
    write_json(os.path.join(ROOT, "bench", "results", "tree_cost.json"), {"us_per_call": out, "hardware": hardware()})


if __name__ == "__main__":
    main()
