"""`sync` and `async` modes: every role is a Ray actor; the driver only moves refs.

The two modes differ only in their gather strategy (`SyncGather`,
`AsyncGather`): which fragments the driver takes each iteration and whether it
waits for the learner. Everything else is the same code.
"""
from __future__ import annotations

import os
import time

import ray
from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError

ACTOR_GONE = (RayActorError, ActorUnavailableError)  # dead, or being restarted by Ray

from distrl.config import Config, to_dict
from distrl.core import FragmentInfo
from distrl.learning import TrainStats
from distrl.runtime.actors import Evaluator, Learner, ParameterServer, ReplayServer, RolloutWorker
from distrl.runtime.local import resolve_device


def init_ray(address: str | None, workers: int) -> None:
    """Join `address`, or start Ray embedded: loopback only, no dashboard."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if address:
        ray.init(address=address, log_to_driver=True)
    else:
        # Embedded, we place every actor ourselves (they ask for no CPUs: see RayRoles), so one
        # Ray instance serves runs of any worker count.
        ray.init(address="local", num_cpus=os.cpu_count() or 1, include_dashboard=False,
                 _node_ip_address="127.0.0.1", log_to_driver=True,
                 configure_logging=False)


def heap_runtime_env() -> dict:
    """Run an actor on jemalloc (bundled with Ray on Linux) instead of glibc malloc.

    The learner and replay server free many mid-sized arrays that Ray allocated
    on other threads; under glibc their RSS crept up ~19% in a 30-minute soak even
    with malloc_trim. Skipped when the user sets LD_PRELOAD or DISTRL_JEMALLOC=0.
    """
    lib = os.path.join(os.path.dirname(ray.__file__), "core", "libjemalloc.so")
    if os.environ.get("LD_PRELOAD") or os.environ.get("DISTRL_JEMALLOC") == "0" or not os.path.exists(lib):
        return {}
    return {"env_vars": {"LD_PRELOAD": lib}}


def _collect(refs: list) -> tuple[list, list]:
    """ray.get each ref; a failed worker call is reported, not raised."""
    ok, failed = [], []
    for ref in refs:
        try:
            ok.append((ref, ray.get(ref)))
        except (*ACTOR_GONE, RayTaskError) as e:
            failed.append((ref, e))
    return ok, failed


class SyncGather:
    """All workers sample at once; the driver waits for every fragment and the learner."""

    waits_for_learner = True

    def __init__(self, workers):
        self.workers = workers
        self.held: set[int] = set()  # restarting workers: skipped until healthy

    def release(self, i: int) -> None:
        self.held.discard(i)

    def gather(self, allow_sampling: bool):
        calls = {}
        for i, w in enumerate(self.workers):
            if i not in self.held:
                info_ref, data_ref = w.sample.remote(True)
                calls[info_ref] = (i, data_ref)
        ok, failed = _collect(list(calls))
        out = [(info, calls[ref][1]) for ref, info in ok]
        failed_workers = [(calls[ref][0], e) for ref, e in failed]
        self.held.update(i for i, _ in failed_workers)
        return out, failed_workers, {"ready": len(ok), "late": 0}


class AsyncGather:
    """Workers run freely; take what finished within `window_s`, leave the rest running.

    Each worker has `depth` sample calls queued, so it starts its next fragment the
    moment it returns one instead of idling until the driver's next gather.
    """

    waits_for_learner = False

    def __init__(self, workers, window_s: float, depth: int = 2):
        self.workers = workers
        self.window_s = window_s
        self.depth = depth
        self.inflight: dict = {}  # info ref -> (worker index, data ref)
        self.free = [depth] * len(workers)  # call slots each worker has open
        self.held: set[int] = set()  # restarting workers get no calls until released

    def release(self, i: int) -> None:
        self.held.discard(i)
        self.free[i] = self.depth - sum(1 for j, _ in self.inflight.values() if j == i)

    def gather(self, allow_sampling: bool):
        if allow_sampling:  # workers back off while the learner catches up (update-to-data ratio)
            for i in range(len(self.workers)):
                while self.free[i] > 0 and i not in self.held:
                    info_ref, data_ref = self.workers[i].sample.remote(False)
                    self.inflight[info_ref] = (i, data_ref)
                    self.free[i] -= 1
        if not self.inflight:
            time.sleep(self.window_s)
            return [], [], {"ready": 0, "late": 0}
        ready, _ = ray.wait(list(self.inflight), num_returns=len(self.inflight), timeout=self.window_s)
        ok, failed = _collect(ready)
        out = []
        for ref, info in ok:
            i, data_ref = self.inflight.pop(ref)
            self.free[i] += 1
            out.append((info, data_ref))
        failed_calls = [(self.inflight.pop(ref)[0], e) for ref, e in failed]
        self.held.update(i for i, _ in failed_calls)
        busy = {i for i, _ in self.inflight.values()}
        done = {info.worker for _, info in ok}
        return out, failed_calls, {"ready": len(done), "late": len(busy - done)}


class RayRoles:
    """ParameterServer, ReplayServer, Learner, Evaluator and N RolloutWorkers as actors."""

    def __init__(self, cfg: Config, run_dir: str, start_time: float, address: str | None = None,
                 eval_resume: dict | None = None):
        init_ray(address, cfg.workers)
        self.cfg = cfg
        d = to_dict(cfg)
        device = resolve_device(cfg.device)
        self.ps = ParameterServer.options(name=None).remote()
        heap_env = heap_runtime_env()
        self.replay = ReplayServer.options(max_restarts=-1, max_task_retries=0,
                                           runtime_env=heap_env).remote(d, run_dir)
        self.run_dir = run_dir
        self.replay_restarts = 0
        gpus = 1 if device.startswith("cuda") else 0
        # On a cluster each worker and the learner reserve a CPU, so Ray spreads them over nodes;
        # embedded on one machine, reservations would only cap the worker count.
        cpus = 1 if address else 0
        self.learner = Learner.options(num_cpus=cpus, num_gpus=gpus,
                                       runtime_env=heap_env).remote(d, self.ps, self.replay, device)
        self.evaluator = Evaluator.options(max_restarts=-1, max_task_retries=0).remote(d, self.ps, run_dir, start_time, eval_resume)
        # A dead worker process is restarted by Ray (same constructor args): it re-syncs its weights
        # on its first sample. Its in-flight fragment is lost and counted by the driver.
        self.workers = [RolloutWorker.options(num_cpus=cpus, max_restarts=cfg.fault.max_worker_restarts + 1,
                                              max_task_retries=0).remote(d, i, cfg.workers, self.ps)
                        for i in range(cfg.workers)]
        # Waited for only once every actor is created: their processes start in parallel.
        self.replay_pid = ray.get(self.replay.pid.remote())
        ray.get(self.learner.publish_now.remote())  # version 0 exists before any worker acts
        if cfg.mode == "sync":
            self.gatherer = SyncGather(self.workers)
        else:
            self.gatherer = AsyncGather(self.workers, cfg.async_.window_s)
        self.train_refs: list = []
        self.train_sizes: dict = {}
        self.eval_ref = None
        self.evaluator_restarts = 0
        self.eval_pid: int | None = None
        self.restarting: dict[int, ray.ObjectRef] = {}  # worker index -> health-check ref
        self.restarts = 0
        self.restarts_ref = None
        self.timings = {"env_s": 0.0, "inference_s": 0.0, "pull_s": 0.0, "learner_s": 0.0,
                        "learner_wait_s": 0.0}

    def gather(self, allow_sampling: bool) -> tuple[list[FragmentInfo], dict]:
        self._release_restarted()
        pairs, failed, counts = self.gatherer.gather(allow_sampling)
        for i, err in dict(failed).items():  # one restart per worker, however many calls failed
            if i in self.restarting:
                continue
            if not isinstance(err, ACTOR_GONE):
                # An exception in the worker leaves the process alive but suspect: restart it fresh.
                ray.kill(self.workers[i], no_restart=False)
            self.restarting[i] = self.workers[i].pid.remote()
        counts["failed"] = len(failed)
        self._poll_restarts()
        adds = [self.replay.add.remote(data_ref) for _, data_ref in pairs]
        if self.gatherer.waits_for_learner and adds:
            ray.get(adds)  # the learner must see this data before it trains
        infos = [info for info, _ in pairs]
        for info in infos:
            for k, v in info.timings.items():
                self.timings[k] = self.timings.get(k, 0.0) + v
        return infos, counts

    def train(self, budget: int, final: bool = False) -> list[TrainStats]:
        """Collect finished learner calls; issue new ones within `budget` updates.

        Async keeps two calls queued at the learner so it never waits on the driver.
        """
        done = []
        if self.train_refs:
            ready, _ = ray.wait(self.train_refs, num_returns=len(self.train_refs),
                                timeout=None if final else 0)
            for ref in ready:
                self.train_refs.remove(ref)
                self.train_sizes.pop(ref)
                done.extend(self._train_result(ref))
        max_queued = 1 if self.gatherer.waits_for_learner else 2
        while not final and budget > 0 and len(self.train_refs) < max_queued:
            # Cap each call so the driver regains control often enough to log and stop.
            n = min(budget, 4 * self.cfg.learner.batches_per_call)
            ref = self.learner.train.remote(n)
            self.train_refs.append(ref)
            self.train_sizes[ref] = n
            budget -= n
            if self.gatherer.waits_for_learner:
                done.extend(self._train_result(ref))
                self.train_refs.remove(ref)
                self.train_sizes.pop(ref)
        for s in done:
            self.timings["learner_s"] += s.learner_s
            self.timings["learner_wait_s"] += s.wait_s
        return done

    def _train_result(self, ref) -> list[TrainStats]:
        """A learner call's stats; if the replay server died under it, restart and refill it."""
        try:
            return [ray.get(ref)]
        except RayTaskError as e:
            if not isinstance(e.cause, ACTOR_GONE):
                raise
            # The replay server went away under the learner (a queued call may notice after the
            # restart was already handled). Its remaining updates are lost; the budget re-issues them.
            self._check_replay()
            return []

    def _check_replay(self) -> None:
        """Wait for the replay server; if it is a new process, count it and refill it."""
        deadline = time.time() + 60
        while True:
            try:
                pid = ray.get(self.replay.pid.remote(), timeout=60)
                break
            except (*ACTOR_GONE, RayTaskError):
                if time.time() > deadline:
                    raise
                time.sleep(0.5)
        if pid != self.replay_pid:  # a restarted server refills itself from the newest checkpoint
            self.replay_pid = pid
            self.replay_restarts += 1

    def updates_in_flight(self) -> int:
        return sum(self.train_sizes.values())

    def get_state(self) -> dict:
        """Everything a checkpoint needs from the actors (waits for in-flight calls to finish)."""
        learner = self.learner.get_state.remote()
        workers = [w.get_state.remote() for w in self.workers]
        self._check_replay()  # a restart since the last look is counted (and the server refilled)
        max_bytes = self.cfg.checkpoint.max_replay_bytes
        if self.replay_on_driver_node():
            store = self._store_writer(max_bytes)  # same disk: the server writes its own file
        else:
            store = ray.get(self.replay.get_state.remote(max_bytes))
        return {"learner": ray.get(learner), "store": store, "workers": ray.get(workers)}

    def replay_on_driver_node(self) -> bool:
        return ray.get(self.replay.node_id.remote()) == ray.get_runtime_context().get_node_id()

    def _store_writer(self, max_bytes: int):
        def write(directory: str):
            written = ray.get(self.replay.write_store.remote(directory, max_bytes))
            if written is None:
                return None, {"store_sha256": None, "store_saved": False}
            skeleton, digest = written
            return skeleton, {"store_sha256": digest, "store_saved": True}
        return write

    def store_digest(self) -> str:
        return ray.get(self.replay.digest.remote())

    def set_state(self, state: dict) -> None:
        refs = [w.set_state.remote(s) for w, s in zip(self.workers, state["workers"])]
        if state["store"] is not None:
            refs.append(self.replay.set_state.remote(state["store"]))
        ray.get(refs)
        ray.get(self.learner.set_state.remote(state["learner"]))

    def sync_counters(self) -> None:
        """Final, exact counts (called once at the end of a run)."""
        self.restarts = ray.get(self.ps.worker_restarts.remote())

    def _poll_restarts(self) -> None:
        """Worker restarts, as counted by the parameter server (every worker start registers)."""
        if self.restarts_ref is not None and ray.wait([self.restarts_ref], timeout=0)[0]:
            self.restarts = ray.get(self.restarts_ref)
            self.restarts_ref = None
        if self.restarts_ref is None:
            self.restarts_ref = self.ps.worker_restarts.remote()

    def _release_restarted(self) -> None:
        """Hand workers back to the gatherer once their restarted process answers."""
        if not self.restarting:
            return
        ready, _ = ray.wait(list(self.restarting.values()), num_returns=len(self.restarting), timeout=0)
        for i, ref in list(self.restarting.items()):
            if ref in ready:
                try:
                    ray.get(ref)
                    del self.restarting[i]
                    self.gatherer.release(i)
                except (*ACTOR_GONE, RayTaskError):
                    self.restarting[i] = self.workers[i].pid.remote()  # still coming back: ask again

    def submit_eval(self, env_steps: int, wait: bool = False) -> bool:
        if self.eval_ref is not None:
            return False
        self.eval_ref = self.evaluator.evaluate.remote(env_steps)
        return True

    def poll_eval(self, block: bool = False, timeout: float | None = None) -> list[dict]:
        if self.eval_ref is None:
            return []
        ready, _ = ray.wait([self.eval_ref], timeout=timeout if block else 0)
        if not ready:
            return []
        try:
            pid, result = ray.get(self.eval_ref)
        except (*ACTOR_GONE, RayTaskError):
            self.evaluator_restarts += 1  # Ray restarts the actor; the next submit goes to the new one
            self.eval_pid, result = None, None
        else:
            # A death between two evaluations fails no call: the new process id shows it.
            if self.eval_pid is not None and pid != self.eval_pid:
                self.evaluator_restarts += 1
            self.eval_pid = pid
        self.eval_ref = None
        return [result] if result is not None else []

    def eval_busy(self) -> bool:
        return self.eval_ref is not None

    def time_breakdown(self) -> dict:
        return dict(self.timings)

    def worker_pids(self) -> list[int]:
        return ray.get([w.pid.remote() for w in self.workers])

    def close(self) -> None:
        for actor in [*self.workers, self.learner, self.evaluator, self.replay, self.ps]:
            ray.kill(actor)
