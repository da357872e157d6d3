"""`sync` and `async` modes: every role is a Ray actor; the driver only moves refs.

The two modes differ only in their gather strategy (`SyncGather`,
`AsyncGather`): which fragments the driver takes each iteration and whether it
waits for the learner. Everything else is the same code.
"""
from __future__ import annotations

import time

import ray
from ray.exceptions import RayTaskError

from distrl.config import Config, to_dict
from distrl.core import Gathered, Restarts, Roles, RunState, TrainStats
from distrl.roles.experience import write_store
from distrl.observe.trace import configure, tracer
from distrl.roles.factory import resolve_device, trace_settings
from distrl.runtime.actors import Evaluator, Learner, ParameterServer, ReplayServer, RolloutWorker
from distrl.runtime.gather import AsyncGather, SyncGather
from distrl.runtime.ray_setup import ACTOR_GONE, heap_runtime_env, init_ray


class RayRoles(Roles):
    """ParameterServer, ReplayServer, Learner, Evaluator and N RolloutWorkers as actors."""

    def __init__(self, cfg: Config, run_dir: str, start_time: float, address: str | None = None,
                 eval_resume: dict | None = None):
        init_ray(address)
        configure("driver", None, *trace_settings(cfg))
        self.cfg, self.run_dir = cfg, run_dir
        d = to_dict(cfg)
        device = resolve_device(cfg.device)
        heap_env = heap_runtime_env()
        # On a cluster each worker and the learner reserve a CPU, so Ray spreads them over nodes;
        # embedded on one machine, reservations would only cap the worker count.
        cpus = 1 if address else 0
        self.ps = ParameterServer.remote(trace_settings(cfg))
        self.replay = ReplayServer.options(max_restarts=-1, max_task_retries=0, runtime_env=heap_env).remote(d, run_dir)
        self.learner = Learner.options(num_cpus=cpus, num_gpus=1 if device.startswith("cuda") else 0,
                                       runtime_env=heap_env).remote(d, self.ps, self.replay, device)
        self.evaluator = Evaluator.options(max_restarts=-1, max_task_retries=0).remote(
            d, self.ps, run_dir, start_time, eval_resume)
        # A dead worker process is restarted by Ray (same constructor args): it re-syncs its weights
        # on its first sample. Its in-flight fragment is lost and counted by the driver.
        self.workers = [RolloutWorker.options(num_cpus=cpus, max_restarts=cfg.fault.max_worker_restarts + 1,
                                              max_task_retries=0).remote(d, i, cfg.workers, self.ps)
                        for i in range(cfg.workers)]
        # Waited for only once every actor is created: their processes start in parallel.
        self.replay_pid = ray.get(self.replay.pid.remote())
        ray.get(self.learner.publish.remote())  # version 0 exists before any worker acts
        self.gatherer = SyncGather(self.workers) if cfg.mode == "sync" else AsyncGather(self.workers, cfg.async_.window_s)
        self.train_calls: dict = {}  # in-flight learner call -> updates asked
        self.eval_ref = None
        self.eval_pid: int | None = None
        self.restarting: dict[int, ray.ObjectRef] = {}  # worker index -> health-check ref
        self.counts = Restarts()
        self.restarts_ref = None
        self.timings = {"env_s": 0.0, "inference_s": 0.0, "pull_s": 0.0, "learner_s": 0.0, "learner_wait_s": 0.0}

    # --- workers ------------------------------------------------------------------
    def gather(self, allow_sampling: bool) -> Gathered:
        self._release_restarted()
        pairs, failed, ready, late = self.gatherer.gather(allow_sampling)
        for i, err in dict(failed).items():  # one restart per worker, however many calls failed
            if i in self.restarting:
                continue
            if not isinstance(err, ACTOR_GONE):
                # An exception in the worker leaves the process alive but suspect: restart it fresh.
                ray.kill(self.workers[i], no_restart=False)
            self.restarting[i] = self.workers[i].pid.remote()
        self._poll_worker_restarts()
        adds = [self.replay.add.remote(data_ref) for _, data_ref in pairs]
        if self.gatherer.waits_for_learner and adds:
            ray.get(adds)  # the learner must see this data before it trains
        infos = [info for info, _ in pairs]
        for info in infos:
            for k, v in info.timings.items():
                self.timings[k] = self.timings.get(k, 0.0) + v
        return Gathered(infos, ready=ready, late=late, failed=len(failed))

    def _poll_worker_restarts(self) -> None:
        """Worker restarts, as counted by the parameter server (every worker start registers)."""
        if self.restarts_ref is not None and ray.wait([self.restarts_ref], timeout=0)[0]:
            self.counts.workers = ray.get(self.restarts_ref)
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

    # --- learner ------------------------------------------------------------------
    def train(self, budget: int, final: bool = False) -> list[TrainStats]:
        """Async keeps two calls queued at the learner so it never waits on the driver;
        sync waits for each call (the next round must see the new weights)."""
        done = []
        if self.train_calls:
            ready, _ = ray.wait(list(self.train_calls), num_returns=len(self.train_calls),
                                timeout=None if final else 0)
            done.extend(s for ref in ready for s in self._train_result(ref))
        max_queued = 1 if self.gatherer.waits_for_learner else 2
        while not final and budget > 0 and len(self.train_calls) < max_queued:
            # Cap each call so the driver regains control often enough to log and stop.
            n = min(budget, 4 * self.cfg.learner.batches_per_call)
            ref = self.learner.train.remote(n)
            self.train_calls[ref] = n
            budget -= n
            if self.gatherer.waits_for_learner:
                done.extend(self._train_result(ref))
        for s in done:
            self.timings["learner_s"] += s.learner_s
            self.timings["learner_wait_s"] += s.wait_s
        return done

    def _train_result(self, ref) -> list[TrainStats]:
        """A learner call's stats; if the replay server died under it, wait for its restart."""
        self.train_calls.pop(ref)
        try:
            return [ray.get(ref)]
        except RayTaskError as e:
            if not isinstance(e.cause, ACTOR_GONE):
                raise
            # The call's remaining updates are lost; the driver's budget issues them again.
            self._check_replay()
            return []

    def updates_in_flight(self) -> int:
        return sum(self.train_calls.values())

    # --- replay server --------------------------------------------------------------
    def _check_replay(self) -> None:
        """Wait for the replay server; if it is a new process, count it (it refilled itself)."""
        deadline = time.time() + 60
        while True:
            try:
                pid = ray.get(self.replay.pid.remote(), timeout=60)
                break
            except (*ACTOR_GONE, RayTaskError):
                if time.time() > deadline:
                    raise
                time.sleep(0.5)
        if pid != self.replay_pid:
            self.replay_pid = pid
            self.counts.replay += 1

    def store_digest(self) -> str | None:
        return ray.get(self.replay.digest.remote())

    # --- checkpoints ----------------------------------------------------------------
    def get_state(self) -> RunState:
        """Everything a checkpoint needs from the actors (waits for in-flight calls to finish)."""
        learner = self.learner.get_state.remote()
        workers = [w.get_state.remote() for w in self.workers]
        self._check_replay()  # a restart since the last look is counted (and the server refilled)
        return {"learner": ray.get(learner), "store": self._store_writer(), "workers": ray.get(workers)}

    def replay_on_driver_node(self) -> bool:
        return ray.get(self.replay.node_id.remote()) == ray.get_runtime_context().get_node_id()

    def _store_writer(self):
        max_bytes = self.cfg.checkpoint.max_replay_bytes
        if self.replay_on_driver_node():  # same disk: the server writes its own file
            return lambda directory: ray.get(self.replay.write.remote(directory, max_bytes))
        return lambda directory: write_store(directory, ray.get(self.replay.state.remote(max_bytes)))

    def set_state(self, state: RunState) -> None:
        refs = [w.set_state.remote(s) for w, s in zip(self.workers, state["workers"])]
        if state["store"] is not None:
            refs.append(self.replay.load.remote(state["store"]))
        ray.get(refs)
        ray.get(self.learner.set_state.remote(state["learner"]))

    # --- evaluator ------------------------------------------------------------------
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
            self.counts.evaluator += 1  # Ray restarts the actor; the next submit goes to the new one
            self.eval_pid, result = None, None
        else:
            # A death between two evaluations fails no call: the new process id shows it.
            if self.eval_pid is not None and pid != self.eval_pid:
                self.counts.evaluator += 1
            self.eval_pid = pid
        self.eval_ref = None
        return [result] if result is not None else []

    def eval_busy(self) -> bool:
        return self.eval_ref is not None

    # --- the rest of the contract -----------------------------------------------------
    def restarts(self, exact: bool = False) -> Restarts:
        if exact:
            self.counts.workers = ray.get(self.ps.worker_restarts.remote())
        return Restarts(self.counts.workers, self.counts.evaluator, self.counts.replay)

    def time_breakdown(self) -> dict[str, float]:
        return dict(self.timings)

    def traces(self) -> list[dict]:
        """Every actor's recorded events (a dead actor's are lost with it) and the driver's own."""
        if not self.cfg.log.trace:
            return []
        refs = [a.drain_trace.remote() for a in [*self.workers, self.learner, self.evaluator, self.replay, self.ps]]
        drained = [tracer().drain()]
        for ref in refs:
            try:
                drained.append(ray.get(ref, timeout=30))
            except (*ACTOR_GONE, RayTaskError, ray.exceptions.GetTimeoutError):
                pass
        return drained

    def worker_pids(self) -> list[int]:
        return ray.get([w.pid.remote() for w in self.workers])

    def close(self) -> None:
        for actor in [*self.workers, self.learner, self.evaluator, self.replay, self.ps]:
            ray.kill(actor)
