"""The five roles as Ray actors. Each wraps a ray-free object from the rest of distrl.

Torch-heavy imports happen inside the actors that need torch, so the parameter
server and replay server processes start in a fraction of a second.
"""
from __future__ import annotations

import os
import time
import warnings

import ray

from distrl.config import from_dict
from distrl.learning import TrainStats, store_nbytes
from distrl.threads import one_compute_thread


class HeapTrimmer:
    """Hands freed heap pages back to the OS at most every `interval_s` (glibc only).

    After a large free glibc raises its mmap threshold, so the learner's per-block
    arrays then live on the heap, and the pages they free stay resident: the
    learner's RSS grew ~20 MB a minute in the soak. malloc_trim releases them for
    ~1 ms; a fixed low mmap threshold also worked but made SAC updates 1.5x slower.
    The fallback for when jemalloc is not preloaded (see `heap_runtime_env`).
    """

    def __init__(self, interval_s: float = 5.0):
        import ctypes

        try:
            self._trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to do
            self._trim = None
        if "jemalloc" in os.environ.get("LD_PRELOAD", ""):  # glibc's heap is not in use
            self._trim = None
        self.interval_s, self.last = interval_s, time.monotonic()

    def maybe_trim(self) -> None:
        if self._trim is not None and time.monotonic() - self.last >= self.interval_s:
            self._trim(0)
            self.last = time.monotonic()


# Every actor is created with enable_task_events=False: Ray would otherwise record and ship to
# the GCS a status event per call (hundreds per second here) for the dashboard we never start.


def _algorithm(cfg_dict: dict):
    from distrl.runtime.local import build_algorithm

    cfg = from_dict(cfg_dict)
    return cfg, build_algorithm(cfg)


@ray.remote(num_cpus=0, enable_task_events=False)
class ParameterServer:
    """Newest weights and their version. Holds an ObjectRef, so weights are serialised once."""

    def __init__(self):
        self.version = -1
        self.ref = None  # [ObjectRef]: wrapped in a list so Ray passes the ref, not the value
        self.starts: dict[int, int] = {}

    def push(self, version: int, ref_box: list) -> None:
        if version > self.version:
            self.version, self.ref = version, ref_box

    def pull_if_newer(self, version: int):
        """(version, [ref]) when newer than `version`, else None."""
        if self.version > version:
            return self.version, self.ref
        return None

    def get_version(self) -> int:
        return self.version

    def register_worker(self, worker_index: int) -> None:
        """Called by every RolloutWorker start: a second start of the same index is a restart."""
        self.starts[worker_index] = self.starts.get(worker_index, 0) + 1

    def worker_restarts(self) -> int:
        return sum(n - 1 for n in self.starts.values())

    def save(self, path: str) -> None:
        from distrl.checkpoint import save_weights

        if self.ref is not None:
            save_weights(path, ray.get(self.ref[0]), {"version": self.version})

    def load(self, path: str) -> int:
        from distrl.checkpoint import load_weights

        weights, meta = load_weights(path)
        self.version, self.ref = int(meta.get("version", 0)), [ray.put(weights)]
        return self.version


@ray.remote(num_cpus=0, enable_task_events=False)
class ReplayServer:
    """Experience store: prioritized/uniform replay, or the on-policy trajectory FIFO."""

    def __init__(self, cfg_dict: dict, run_dir: str):
        from distrl.learning import make_store

        self.cfg = from_dict(cfg_dict)
        self.store = make_store(self.cfg)
        self.trimmer = HeapTrimmer()
        with warnings.catch_warnings():  # Ray's own property trips its deprecated actor_id
            warnings.simplefilter("ignore")
            reconstructed = ray.get_runtime_context().was_current_actor_reconstructed
        if reconstructed:
            self._refill(run_dir)

    def _refill(self, run_dir: str) -> None:
        """After a crash Ray restarts us empty: reload the newest checkpoint's store, if any."""
        from distrl.checkpoint import CheckpointError
        from distrl.runtime import persist

        try:
            _, state = persist.load_latest(run_dir)
        except CheckpointError:
            return  # nothing saved yet: the workers refill the store
        if state["store"] is not None:
            self.store.load_state_dict(state["store"])

    def add(self, payload) -> int:
        data, priorities = payload
        self.store.add(data, priorities)
        self.trimmer.maybe_trim()
        return len(self.store)

    def next_block(self, max_updates: int):
        from distrl.learning import next_block

        return next_block(self.store, self.cfg, max_updates)

    def update_priorities(self, indices, priorities, generations) -> None:
        self.store.update_priorities(indices, priorities, generations)

    def size(self) -> int:
        return len(self.store)

    def pid(self) -> int:
        return os.getpid()

    def get_state(self, max_bytes: int):
        """The store's contents, or None when larger than `max_bytes`."""
        return self.store.state_dict() if store_nbytes(self.store) <= max_bytes else None

    def write_store(self, directory: str, max_bytes: int):
        """Write the contents into a checkpoint being built; (skeleton, digest), or None when too big.

        Writing here rather than returning the arrays keeps a replay snapshot out
        of Ray's shared-memory object store, whose pages every process that
        touches them keeps resident (this server's RSS grew 5-7% in a soak from that).
        """
        from distrl.store_file import save_store
        from distrl.runtime.persist import store_digest

        if store_nbytes(self.store) > max_bytes:
            return None
        state = self.store.state_dict()
        return save_store(directory, state), store_digest(state)

    def digest(self) -> str:
        from distrl.runtime.persist import store_digest

        return store_digest(self.store.state_dict())

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def set_state(self, state) -> None:
        self.store.load_state_dict(state)


@ray.remote(enable_task_events=False)
class RolloutWorker:
    """Steps `env.num_envs` envs with batched inference; one fragment per `sample` call."""

    def __init__(self, cfg_dict: dict, worker_index: int, num_workers: int, ps):
        ps.register_worker.remote(worker_index)  # first thing: a restart is counted even if we die in start-up
        from distrl.rollout import Rollout
        from distrl.runtime.local import acting_policy

        cfg = from_dict(cfg_dict)
        self.policy = acting_policy(cfg, worker_index, num_workers)
        self.rollout = Rollout(self.policy, cfg.env.id, cfg.env.num_envs, cfg.rollout.fragment_length,
                               cfg.seed + worker_index, worker_index, cfg.env.kwargs)
        self.ps = ps
        self.pending = None  # an in-flight pull, overlapped with stepping
        self.pull_s = 0.0
        self.last_return = None  # when the previous fragment left: the gap is idle + transfer

    def _pull(self, blocking: bool) -> None:
        """Load newer weights; blocking in sync mode, overlapped with stepping in async."""
        t0 = time.perf_counter()
        if self.pending is None:
            self.pending = self.ps.pull_if_newer.remote(self.policy.version)
        if not blocking:
            ready, _ = ray.wait([self.pending], timeout=0)
            if not ready:
                return
        got, self.pending = ray.get(self.pending), None
        if got is not None:
            version, (ref,) = got
            self.policy.set_weights(ray.get(ref), version)
        if not blocking:
            self.pending = self.ps.pull_if_newer.remote(self.policy.version)
        self.pull_s += time.perf_counter() - t0

    @ray.method(num_returns=2)
    def sample(self, blocking_pull: bool):
        start = time.perf_counter()
        self._pull(blocking_pull or self.policy.version < 0)
        frag = self.rollout.sample()
        frag.info.timings["pull_s"], self.pull_s = self.pull_s, 0.0
        if self.last_return is not None:
            frag.info.timings["worker_idle_s"] = start - self.last_return
        self.last_return = time.perf_counter()
        return frag.info, (frag.data, frag.priorities)

    def pid(self) -> int:
        return os.getpid()

    def get_state(self) -> dict:
        return self.rollout.get_state()

    def set_state(self, state: dict) -> None:
        self.rollout.set_state(state)


@ray.remote(enable_task_events=False)
class Learner:
    """The only optimizer.step(). Prefetches its next block of batches while it trains."""

    def __init__(self, cfg_dict: dict, ps, replay, device: str):
        one_compute_thread(load_torch=True)
        cfg, algo = _algorithm(cfg_dict)
        self.cfg = cfg
        self.learner = algo.make_learner(device)
        self.ps, self.replay = ps, replay
        self.prefetch = None
        self.prio_ref = self.push_ref = None
        self.version = -1
        from distrl.algos import data_path

        # On-policy data must come from the newest policy: publish after every update.
        self.on_policy = data_path(cfg.algo) != "replay"
        self.publish_interval = 1 if self.on_policy else cfg.learner.publish_interval
        self.trimmer = HeapTrimmer()

    def pid(self) -> int:
        return os.getpid()

    def publish(self) -> int:
        self.version = self.learner.updates
        self.push_ref = self.ps.push.remote(self.version, [ray.put(self.learner.get_weights())])
        return self.version

    def publish_now(self) -> int:
        version = self.publish()
        ray.get(self.push_ref)
        return version

    def get_state(self) -> dict:
        import torch

        return {"state": self.learner.state_dict(), "torch_rng": torch.get_rng_state(), "version": self.version}

    def set_state(self, state: dict) -> int:
        import torch

        self.learner.load_state_dict(state["state"])
        torch.set_rng_state(state["torch_rng"])
        self.prefetch = None
        return self.publish_now()

    def _fetch(self, max_updates: int):
        return self.replay.next_block.remote(max_updates)

    def train(self, num_updates: int) -> TrainStats:
        """Up to `num_updates` updates; stops early when the store has nothing to give."""
        from distrl.learning import learn_block

        stats = TrainStats()
        t_start = time.perf_counter()
        while stats.consumed < num_updates:
            t0 = time.perf_counter()
            ref = self.prefetch if self.prefetch is not None else self._fetch(num_updates - stats.consumed)
            self.prefetch = None  # consumed (or lost with a dead replay server) either way
            block = ray.get(ref)
            stats.wait_s += time.perf_counter() - t0
            if block is None:
                stats.starved = True  # the driver lets workers sample even if updates lag
                break
            k = next(iter(block[0].values())).shape[0]
            left = num_updates - stats.consumed - k
            if left > 0 and not self.on_policy:
                self.prefetch = self._fetch(left)  # the next block travels while this one trains
            prios = learn_block(self.learner, block, stats)
            if prios is not None:
                batches, idx, _ = block
                self.prio_ref = self.replay.update_priorities.remote(
                    idx.ravel(), prios.ravel(), batches["_generation"].ravel())
            if self.learner.updates - self.version >= self.publish_interval:
                self.publish()
        if self.learner.updates != self.version:
            self.publish()
        # The newest weights and priorities land before this call returns, so a sync round's
        # broadcast pull and the driver's next add see them (and sync runs are deterministic).
        ray.get([r for r in (self.prio_ref, self.push_ref) if r is not None])
        self.prio_ref = self.push_ref = None
        stats.version = self.version
        stats.learner_s = time.perf_counter() - t_start - stats.wait_s
        self.trimmer.maybe_trim()
        return stats


@ray.remote(num_cpus=0, enable_task_events=False)
class Evaluator:
    """Plays greedy episodes with the newest published weights; keeps the best checkpoint."""

    def __init__(self, cfg_dict: dict, ps, run_dir: str, start_time: float, resume: dict | None = None):
        from distrl.evaluation import Evaluation
        from distrl.runtime.local import acting_policy

        cfg = from_dict(cfg_dict)
        self.evaluation = Evaluation(acting_policy(cfg, -1, 1), cfg, run_dir, start_time, **(resume or {}))
        self.ps = ps
        self.version = -1
        self.weights = None

    def evaluate(self, env_steps: int) -> tuple[int, dict | None]:
        """(this process's id, the result): a new id tells the driver the actor was restarted."""
        got = ray.get(self.ps.pull_if_newer.remote(self.version))
        if got is not None:
            self.version, (ref,) = got
            self.weights = ray.get(ref)
        if self.weights is None:
            return os.getpid(), None
        return os.getpid(), self.evaluation.evaluate(self.weights, self.version, env_steps)

    def ping(self) -> bool:
        return True

    def pid(self) -> int:
        return os.getpid()
