"""Sequence replay: sampling throughput at scale, and what sharing chunks saves in memory.

    python -m bench.sequence_replay [--quick] [--steps N] [--seconds S]

One stream of R2D2-shaped experience (16 envs, obs of 8 float32, LSTM state (2, 64), episodes
ending with probability 1/500 per step) goes through `SequenceAdder` into `SequenceReplay` with
80-step sequences (burn-in 20, 56 trained steps, n-step 4) and chunks of 20 steps, until it
holds ``--steps`` stored steps (1M; 50k with ``--quick``) and has evicted for a while.

(a) Throughput: `sample_many(K, 64)` plus `update_priorities` of the sampled items, in
    batches/s and sampled steps/s (batches/s x 64 x 80), for K = 1 and K = 8 batches per call.
(b) Memory: bytes per stored step (`nbytes` / stored steps) with 50% overlap (period 28), for
    SequenceReplay, for SequenceReplay without overlap (period 56), and for a naive buffer that
    copies each item's full window, filled with the same stream and holding as many items.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

from bench.common import ROOT, hardware, write_json
from distrl.replay.sequence_replay import SequenceReplay
from distrl.replay.sequences import SequenceAdder

ENVS, FRAGMENT, OBS, STATE = 16, 100, 8, (2, 64)
BURN_IN, LENGTH, N_STEP, CHUNK = 20, 56, 4, 20
SEQ = BURN_IN + LENGTH + N_STEP
BATCH = 64


def stream(seed: int):
    """Endless adder inputs: (steps, next_obs, terminated, truncated, states)."""
    rng = np.random.default_rng(seed)
    while True:
        obs = rng.normal(size=(FRAGMENT, ENVS, OBS)).astype(np.float32)
        steps = {"obs": obs, "actions": rng.integers(0, 4, (FRAGMENT, ENVS)),
                 "rewards": rng.normal(size=(FRAGMENT, ENVS)).astype(np.float32)}
        done = rng.random((FRAGMENT, ENVS)) < 1 / 500
        states = rng.normal(size=(FRAGMENT, ENVS, *STATE)).astype(np.float32)
        yield steps, {"obs": obs}, done, np.zeros_like(done), states


class NaiveReplay:
    """Stores every item's full (L, ...) window, as a buffer without shared chunks would."""

    def __init__(self, items: int):
        self.items, self.cursor, self.arrays = items, 0, None
        self._chunks: dict[int, tuple[int, dict]] = {}  # key -> (message number, fields)
        self._messages = 0

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())

    def add(self, msg: dict) -> None:
        self._messages += 1
        fields = [k[6:] for k in msg if k.startswith("chunk/") and k not in ("chunk/key", "chunk/length")]
        for i, key in enumerate(msg["chunk/key"].tolist()):
            self._chunks[key] = (self._messages, {f: msg["chunk/" + f][i] for f in fields})
        if self.arrays is None:
            self.arrays = {f: np.zeros((self.items, SEQ, *msg["chunk/" + f].shape[2:]), msg["chunk/" + f].dtype)
                           for f in fields}
            self.arrays["state"] = np.zeros((self.items, *msg["item/state"].shape[1:]), np.float32)
        for i in range(len(msg["version"])):
            keys = [k for k in msg["item/chunks"][i].tolist() if k != -1]
            off, pad, n = (int(msg[k][i]) for k in ("item/offset", "item/pad_left", "item/length"))
            for f in fields:
                window = np.concatenate([self._chunks[k][1][f] for k in keys])[off:off + n]
                self.arrays[f][self.cursor] = 0
                self.arrays[f][self.cursor, pad:pad + n] = window
            self.arrays["state"][self.cursor] = msg["item/state"][i]
            self.cursor = (self.cursor + 1) % self.items
        # An item references chunks of at most the last few fragments of its env.
        self._chunks = {k: v for k, v in self._chunks.items() if v[0] > self._messages - 4}


def fill(store, period: int, steps: int, seed: int = 0) -> tuple[float, float]:
    """Feed the stream until `steps` env steps went in (evicting past capacity); seconds in the adder and in add()."""
    adder = SequenceAdder(ENVS, SEQ, period, BURN_IN, CHUNK, seed)
    adder_s, add_s, fed = 0.0, 0.0, 0
    rng = np.random.default_rng(seed)
    for version, (steps_, next_obs, term, trunc, states) in enumerate(stream(seed)):
        if fed >= steps:
            return adder_s, add_s
        t0 = time.perf_counter()
        out = adder.add(steps_, next_obs, term, trunc, states, version)
        adder_s += time.perf_counter() - t0
        fed += FRAGMENT * ENVS
        if out is not None:
            t0 = time.perf_counter()
            if isinstance(store, SequenceReplay):
                store.add(out[0], rng.random(len(out[0]["version"])))
            else:
                store.add(out[0])
            add_s += time.perf_counter() - t0


def throughput(buf: SequenceReplay, k: int, seconds: float) -> dict:
    """sample_many(k, 64) + update_priorities, repeated for `seconds`; median of 5 timing windows."""
    rng = np.random.default_rng(1)
    rates = []
    for _ in range(5):
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds / 5:
            batch, idx, _ = buf.sample_many(k, BATCH)
            buf.update_priorities(idx, rng.random(idx.shape), batch["_generation"])
            n += k
        rates.append(n / (time.perf_counter() - t0))
    rate = float(np.median(rates))
    return {"batches_per_call": k, "batches_per_s": rate, "sampled_steps_per_s": rate * BATCH * SEQ}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="50k stored steps and short timings")
    ap.add_argument("--steps", type=int, help="stored steps (default 1M, or 50k with --quick)")
    ap.add_argument("--seconds", type=float, help="timing seconds per row (default 10, or 2 with --quick)")
    args = ap.parse_args()
    capacity = args.steps or (50_000 if args.quick else 1_000_000)
    seconds = args.seconds or (2.0 if args.quick else 10.0)
    fed = int(capacity * 1.2)  # past capacity, so eviction runs in steady state

    overlap = SequenceReplay(capacity, SEQ, seed=0)
    adder_s, add_s = fill(overlap, LENGTH // 2, fed)
    rows = [throughput(overlap, k, seconds) for k in (1, 8)]
    plain = SequenceReplay(capacity, SEQ, seed=0)
    fill(plain, LENGTH, fed)
    naive = NaiveReplay(len(overlap))
    fill(naive, LENGTH // 2, fed)
    memory = {
        "sequence_replay_overlap_50": overlap.nbytes / overlap.stored_steps,
        "sequence_replay_no_overlap": plain.nbytes / plain.stored_steps,
        "naive_copy_overlap_50": naive.nbytes / overlap.stored_steps,
    }
    results = {
        "hardware": hardware(), "quick": args.quick,
        "config": {"stored_steps": overlap.stored_steps, "capacity": capacity, "items": len(overlap),
                   "sequence_length": SEQ, "burn_in": BURN_IN, "length": LENGTH, "n_step": N_STEP,
                   "period": LENGTH // 2, "chunk_length": CHUNK, "batch_size": BATCH, "obs_dim": OBS,
                   "state_shape": list(STATE), "envs": ENVS, "dropped_items": overlap.dropped_items},
        "adder_env_steps_per_s": fed / adder_s, "replay_add_env_steps_per_s": fed / add_s,
        "throughput": rows, "bytes_per_stored_step": memory,
    }
    write_json(os.path.join(ROOT, "bench", "results", "sequence_replay.json"), results)
    print(f"\n{overlap.stored_steps} stored steps, {len(overlap)} items of {SEQ} steps, batch {BATCH}"
          f"{' (quick)' if args.quick else ''}; env steps/s through SequenceAdder.add "
          f"{fed / adder_s:,.0f}, through SequenceReplay.add {fed / add_s:,.0f}\n")
    print("| batches per call | batches/s | sampled steps/s |\n|---|---|---|")
    for r in rows:
        print(f"| {r['batches_per_call']} | {r['batches_per_s']:,.0f} | {r['sampled_steps_per_s']:,.0f} |")
    print("\n| buffer | bytes per stored step | vs SequenceReplay, 50% overlap |\n|---|---|---|")
    for name, v in memory.items():
        print(f"| {name} | {v:.1f} | {v / memory['sequence_replay_overlap_50']:.2f}x |")


if __name__ == "__main__":
    main()
