"""What a fragment costs to move between processes through Ray: a real fragment of each config (one `sample()`
of a rollout worker with the config's envs and fragment length, untrained weights) handed from one actor to
another, as a worker's fragment reaches the replay server. Per config: the fragment's bytes, and the median
time of the hand-over less that of an empty payload's (the two actor calls themselves).

    python -m bench.fragments [--configs CONFIG ...] [--repeats 40]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import ray

from bench.common import ROOT, hardware, write_json
from distrl.config import load_config
from distrl.roles.factory import acting_policy, make_algorithm, make_rollout

CONFIGS = ["configs/apex_dqn_cartpole.yaml", "configs/apex_dqn_minatar_breakout.yaml",
           "configs/apex_dqn_atari_breakout.yaml", "bench/configs/impala_minatar_breakout.yaml"]


def real_fragment(config: str) -> tuple:
    """(data, priorities, fragment id) of one fragment, as a worker sends it to the replay server."""
    cfg = load_config(os.path.join(ROOT, config), ["workers=1"])
    policy = acting_policy(cfg, 0, 1)
    policy.set_weights(make_algorithm(cfg).make_learner("cpu").get_weights(), 0)
    rollout = make_rollout(cfg, policy, seed=0, worker_index=0)
    rollout.sample()  # past the first reset: a fragment from the middle of a run
    frag = rollout.sample()
    return frag.data, frag.priorities, frag.info.fragment_id


def payload_bytes(payload: tuple) -> int:
    data, priorities, _ = payload
    arrays = [v for v in data.values() if isinstance(v, np.ndarray)]
    return sum(a.nbytes for a in arrays) + (priorities.nbytes if priorities is not None else 0)


@ray.remote(num_cpus=0)
class Source:
    """Holds payloads and returns one per call: its result goes through Ray's object store."""

    def __init__(self):
        self.payloads: dict = {}

    def hold(self, name: str, payload) -> None:
        self.payloads[name] = payload

    def give(self, name: str):
        return self.payloads[name]


@ray.remote(num_cpus=0)
class Sink:
    def take(self, payload) -> int:
        data, _, _ = payload
        return sum(int(np.asarray(v).ravel()[:1].size) for v in data.values())  # every array mapped in


def hand_over_ms(source, sink, name: str, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        ray.get(sink.take.remote(source.give.remote(name)))
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", nargs="+", default=CONFIGS)
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "fragments.json"))
    args = ap.parse_args()
    from distrl.runtime.ray_setup import init_ray

    init_ray(None)
    source, sink = Source.remote(), Sink.remote()
    ray.get(source.hold.remote("empty", ({"x": np.zeros(1, np.uint8)}, None, 0)))
    hand_over_ms(source, sink, "empty", 10)  # warm both processes
    rows = []
    for config in args.configs:
        payload = real_fragment(config)
        ray.get(source.hold.remote(config, payload))
        hand_over_ms(source, sink, config, 5)
        empty = hand_over_ms(source, sink, "empty", args.repeats)
        full = hand_over_ms(source, sink, config, args.repeats)
        data = payload[0]
        row = {"config": config, "env_steps": int(data["rewards"].size), "bytes": payload_bytes(payload),
               "dtypes": {k: str(v.dtype) for k, v in data.items() if isinstance(v, np.ndarray)},
               "hand_over_ms": full, "empty_ms": empty, "transfer_ms": max(full - empty, 0.0)}
        row["mb_per_s"] = row["bytes"] / 1e6 / (row["transfer_ms"] / 1e3) if row["transfer_ms"] > 0 else None
        rows.append(row)
        print(f"{config}: {row['env_steps']} env steps, {row['bytes'] / 1e3:.1f} KB, hand-over {full:.2f} ms "
              f"(empty {empty:.2f} ms): {row['transfer_ms']:.2f} ms per fragment", flush=True)
    write_json(args.out, {"hardware": hardware(), "repeats": args.repeats, "fragments": rows})


if __name__ == "__main__":
    main()
