"""The five roles as Ray actors. Each hosts a ray-free job from `distrl.roles`.

An actor is given its peers by name (`peer`): Ray re-creates a dead actor from its
constructor arguments, and names are plain data that always travel with them
(`distrl.runtime.ray_start`).

Every actor is made with `role_actor`: its heartbeat answered on a thread of its own,
and no per-call task events.
"""
from __future__ import annotations

import os
import time
import warnings

import numpy as np
import ray
from ray.exceptions import RayTaskError

from distrl.config import from_dict
from distrl.core import TrainStats, Weights
from distrl.observe.trace import tracer
from distrl.roles.factory import trace_settings
from distrl.roles.learning import LearnerIO
from distrl.runtime.actor_base import Traced, peer, role_actor, start_tracing
from distrl.runtime.inference import RemoteInference
from distrl.runtime.pacing import learner_loop, thread_choice
from distrl.runtime.ray_setup import ACTOR_GONE, HeapTrimmer


@role_actor(num_cpus=0)
class ParameterServer(Traced):
    """Newest weights and their version, held and handed out by value.

    Not as an ObjectRef that the learner owns and workers borrow: with Ray 2.60 every such
    ref, once held here and dropped, leaves memory behind in its owner, so the learner's RSS
    grew with the number of publications (bench/RESULTS.md, soak). A pull copies the weights
    out instead, which is cheap at the sizes workers act with.
    """

    def __init__(self, trace: tuple[bool, int] = (False, 1)):
        start_tracing(trace, "parameter_server")
        self.version = -1
        self.weights: Weights | None = None

    def push(self, version: int, weights: Weights, restored: bool = False) -> None:
        """Newer weights replace older ones; a restored learner's replace them whatever their version
        (it went back to a checkpoint: the updates after it are gone, and so are their weights)."""
        if version > self.version or restored:
            with tracer().span("push", "transfer", version=version):
                # Copied: the arrays Ray hands in may be views of the argument's object-store buffer.
                self.version, self.weights = version, {k: np.array(v) for k, v in weights.items()}

    def pull_if_changed(self, version: int):
        """(version, weights) when the weights held are not those of `version`, else None."""
        if self.version >= 0 and self.version != version:
            return self.version, self.weights
        return None



@role_actor(num_cpus=0)
class ReplayServer(Traced):
    """Hosts the run's `ExperienceServer`: replay, or the on-policy trajectory FIFO."""

    def __init__(self, spec, trace: tuple[bool, int], offline: dict | None = None):
        # The spec alone builds the store (no torch in this process); an offline run's config also reads its
        # dataset through the algorithm.
        from distrl.runtime.pacing import make_experience

        start_tracing(trace, "replay")
        self.experience = make_experience(spec, from_dict(offline) if offline is not None else None)
        self.trimmer = HeapTrimmer()
        with warnings.catch_warnings():  # Ray's own property trips its deprecated actor_id
            warnings.simplefilter("ignore")
            reconstructed = ray.get_runtime_context().was_current_actor_reconstructed
        # Ray restarted us empty after a crash: until the driver's `refill`, fragments wait here and the
        # learner gets nothing (a block from a store about to be replaced would be lost with it).
        self.held: list | None = [] if reconstructed else None

    def add(self, payload) -> None:
        if self.held is not None:
            self.held.append(payload)
            return
        data, priorities, fragment_id = payload
        self.experience.add(data, priorities, fragment_id)
        self.trimmer.maybe_trim()

    def next_block(self, max_updates: int):
        return None if self.held is not None else self.experience.next_block(max_updates)

    def refill(self, run_dir: str | None, store: dict | None) -> int:
        """After a restart: the newest checkpoint's store (read from `run_dir` when it is on this node's disk,
        else `store` as the driver sent it), then the fragments that arrived meanwhile; the items restored."""
        from distrl.roles.experience import newest_store

        if run_dir is not None:
            store = newest_store(run_dir)
        if store is not None:
            self.experience.load(store)
        restored = len(self.experience)
        held, self.held = self.held or [], None
        for payload in held:
            self.add(payload)
        return restored

    def update_priorities(self, indices, priorities, generations) -> None:
        self.experience.update_priorities(indices, priorities, generations)


    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def state(self, max_bytes: int):
        """The store's contents, or None when larger than `max_bytes` (for a driver on another node)."""
        return self.experience.state(max_bytes)

    def write(self, directory: str, max_bytes: int):
        """Write the store into a checkpoint being built on this node: (skeleton or None, meta).

        Writing here rather than returning the arrays keeps a replay snapshot out of
        Ray's shared-memory object store, whose pages stay resident in every process
        that touches them.
        """
        return self.experience.write(directory, max_bytes)

    def digest(self) -> str | None:
        return self.experience.digest()

    def bytes_per_item(self) -> float | None:
        return self.experience.bytes_per_item

    def load(self, state) -> None:
        self.experience.load(state)


@role_actor()
class RolloutWorker(Traced):
    """Steps `env.num_envs` envs with batched inference; one fragment per `sample` call."""

    def __init__(self, cfg_dict: dict, worker_index: int, num_workers: int, ps, inference=None):
        from distrl.roles.factory import acting_policy, make_rollout

        cfg = from_dict(cfg_dict)
        start_tracing(trace_settings(cfg.log), "worker", worker_index)
        self.policy = acting_policy(cfg, worker_index, num_workers)
        self.remote = None  # central inference: the network runs on the InferenceServer
        if inference is not None:
            self.policy.inference = self.remote = RemoteInference(peer(inference), worker_index, self.policy)
        self.rollout = make_rollout(cfg, self.policy, cfg.seed + worker_index, worker_index)
        self.ps = peer(ps)
        self.pending = None  # an in-flight pull, overlapped with stepping
        self.pull_s = 0.0
        self.last_return = None  # when the previous fragment left: the gap is idle + transfer

    def _pull(self, blocking: bool) -> None:
        """Load newer weights; blocking in sync mode, overlapped with stepping in async. A parameter
        server that is down (being restarted) costs this call its pull, not the worker its fragment."""
        t0 = time.perf_counter()
        if self.pending is None:
            self.pending = self.ps.pull_if_changed.remote(self.policy.version)
        if not blocking:
            ready, _ = ray.wait([self.pending], timeout=0)
            if not ready:
                return
        try:
            got = ray.get(self.pending)
        except (*ACTOR_GONE, RayTaskError):
            got = None
        self.pending = None
        if got is not None:
            version, weights = got
            with tracer().span("pull_weights", "transfer", version=version):
                tracer().flow_in("weights", version)
                self.policy.set_weights(weights, version)
        if not blocking:
            self.pending = self.ps.pull_if_changed.remote(self.policy.version)
        self.pull_s += time.perf_counter() - t0

    @ray.method(num_returns=2)
    def sample(self, blocking_pull: bool):
        start = time.time()
        if self.last_return is not None:  # between two calls: waiting for the driver, and the transfer
            tracer().complete("idle", "wait", self.last_return, start - self.last_return)
        if self.remote is not None:  # the server pulls the weights
            self.remote.refresh(blocking_pull)
        else:
            self._pull(blocking_pull or self.policy.version < 0)
        frag = self.rollout.sample()
        frag.info.timings["pull_s"], self.pull_s = self.pull_s, 0.0
        if self.last_return is not None:
            frag.info.timings["worker_idle_s"] = start - self.last_return
        self.last_return = time.time()
        return frag.info, (frag.data, frag.priorities, frag.info.fragment_id)


    def get_state(self) -> dict:
        return self.rollout.get_state()

    def set_state(self, state: dict) -> None:
        self.rollout.set_state(state)

    def close(self) -> None:
        """Close the envs before the actor is killed: a game in a process of its own would outlive it."""
        self.rollout.close()


class RayIO(LearnerIO):
    """The Learner actor's data path: blocks from the ReplayServer, weights to the ParameterServer."""

    overlaps = True

    def __init__(self, ps, replay):
        self.ps, self.replay = ps, replay
        self.outstanding: list = []  # priority writes and pushes not yet confirmed

    def request(self, max_updates: int):
        return self.replay.next_block.remote(max_updates)

    def receive(self, handle):
        return ray.get(handle)

    def write_priorities(self, indices, priorities, generations) -> None:
        self.outstanding.append(self.replay.update_priorities.remote(indices, priorities, generations))

    def publish(self, version: int, weights: Weights, restored: bool = False) -> None:
        self.outstanding.append(self.ps.push.remote(version, weights, restored))

    def flush(self, wait: bool = True) -> None:
        """Wait for the priority writes and pushes; one lost to a dead replay or parameter server is
        dropped (priorities go with the replay; the next publication reaches the restarted server)."""
        refs, self.outstanding = self.outstanding, []
        if not wait and refs:  # read those that landed (their errors too), keep the rest for later
            refs, pending = ray.wait(refs, num_returns=len(refs), timeout=0)
            self.outstanding = pending + self.outstanding
        for ref in refs:
            try:
                ray.get(ref)
            except (*ACTOR_GONE, RayTaskError):
                pass


@role_actor()
class Learner(Traced):
    """Hosts the `LearnerLoop`: the only optimizer.step(), prefetching its next block while it trains."""

    def __init__(self, cfg_dict: dict, ps, replay, device: str, gradient_workers: list | None = None):
        """`ps`, `replay`, `gradient_workers`: the peers' names (or handles)."""
        from distrl.roles.factory import make_algorithm
        from distrl.threads import one_compute_thread

        one_compute_thread(load_torch=True)
        cfg = from_dict(cfg_dict)
        start_tracing(trace_settings(cfg.log), "learner")
        learner = make_algorithm(cfg).make_learner(device)
        if cfg.learner.cuda_graph:
            learner.capture_update()
        if gradient_workers:
            # A shard's worker may be found hung and restarted before it answers.
            learner.use_gradient_workers(ray_gradient_fn([peer(g) for g in gradient_workers],
                                                         cfg.fault.role_timeout_s + cfg.fault.start_timeout_s),
                                         len(gradient_workers))
        threads = thread_choice(device, cfg.learner.threads, cfg.mode, cfg.workers, cfg.eval.interval_steps is not None)
        self.loop = learner_loop(learner, cfg.algo, cfg.learner, RayIO(peer(ps), peer(replay)),
                                 continuous=cfg.mode == "async", threads=threads)
        self.trimmer = HeapTrimmer()


    def publish(self) -> int:
        version = self.loop.publish()
        self.loop.flush()
        return version

    def train(self, num_updates: int, statistics: dict | None = None) -> TrainStats:
        """`statistics`: env.normalize statistics from the fragments gathered since the last call."""
        self.loop.add_statistics(statistics)
        stats = self.loop.train(num_updates)
        self.trimmer.maybe_trim()
        return stats

    def get_state(self) -> dict:
        return self.loop.get_state()

    def set_state(self, state: dict) -> int:
        return self.loop.set_state(state)


@role_actor(num_cpus=0)
class Evaluator(Traced):
    """Plays greedy episodes with the newest published weights; a new best comes back with its weights."""

    def __init__(self, cfg_dict: dict, ps, start_time: float, resume: dict | None = None):
        from distrl.roles.evaluation import make_evaluation

        cfg = from_dict(cfg_dict)
        start_tracing(trace_settings(cfg.log), "evaluator")
        self.evaluation = make_evaluation(cfg, start_time, resume)
        self.ps = peer(ps)
        self.version = -1
        self.weights = None

    def resume(self, evaluations: int, best: tuple) -> None:
        """After a restart: the run's evaluations and best so far (its constructor had the run's start)."""
        self.evaluation.evaluations, self.evaluation.best = evaluations, tuple(best)

    def evaluate(self, env_steps: int) -> tuple[int, dict | None]:
        """(this process's id, the result): a new id tells the driver the actor was restarted."""
        try:
            got = ray.get(self.ps.pull_if_changed.remote(self.version))
        except (*ACTOR_GONE, RayTaskError):
            got = None  # the parameter server is being restarted: score the weights held
        if got is not None:
            with tracer().span("pull_weights", "transfer", version=got[0]):
                tracer().flow_in("weights", got[0])
                self.version, self.weights = got
        if self.weights is None:
            return os.getpid(), None
        return os.getpid(), self.evaluation.evaluate(self.weights, self.version, env_steps)



@role_actor(num_cpus=0)
class GradientWorker(Traced):
    """A replica of the learner's network and loss that computes the gradient of one shard of each
    learner step (`distrl.algos.sharding`); it never steps an optimizer. A call is a pure function of
    its arguments, so Ray may retry it on a restarted worker."""

    def __init__(self, cfg_dict: dict, index: int):
        from distrl.roles.factory import make_algorithm
        from distrl.threads import one_compute_thread

        one_compute_thread(load_torch=True)
        cfg = from_dict(cfg_dict)
        start_tracing(trace_settings(cfg.log), "gradient_worker", index)
        self.replica = make_algorithm(cfg).make_learner("cpu")


    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def gradients(self, weights: Weights, shard: dict):
        from distrl.algos.sharding import shard_gradient

        with tracer().span("shard_gradient", "learning", rows=len(next(iter(shard.values())))):
            return shard_gradient(self.replica, weights, shard)


class GradientTimeout(RuntimeError):
    """Gradient workers sent no gradient within the time it takes to find one hung and restart it."""


def ray_gradient_fn(workers: list, timeout_s: float, retries: int = 3):
    """Shard i goes to gradient worker i; the weights travel once through the object store. A shard whose
    worker died (and whose call Ray's own retries did not save) goes again to its restarted process. A shard
    not back within `timeout_s` (fault.role_timeout_s + fault.start_timeout_s: the driver ends a hung worker,
    and Ray restarts it and runs the shard again) is `GradientTimeout`."""
    def run(weights: Weights, shards: list[dict]) -> list:
        ref = ray.put(weights)
        calls = {i: w.gradients.remote(ref, s) for i, (w, s) in enumerate(zip(workers, shards))}
        out, tries, deadline = {}, dict.fromkeys(calls, 0), time.time() + timeout_s
        while calls:
            ready, _ = ray.wait(list(calls.values()), num_returns=len(calls), timeout=1.0)
            for i, call in list(calls.items()):
                if call not in ready:
                    continue
                try:
                    out[i] = ray.get(call)
                    del calls[i]
                except ACTOR_GONE:
                    tries[i] += 1
                    if tries[i] > retries:
                        raise
                    calls[i] = workers[i].gradients.remote(ref, shards[i])
            if calls and time.time() > deadline:
                raise GradientTimeout(f"gradient workers {sorted(calls)} sent no gradient within {timeout_s:g} s")
        return [out[i] for i in range(len(shards))]
    return run
