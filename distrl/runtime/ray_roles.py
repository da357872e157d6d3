"""`sync` and `async` modes: every role is a Ray actor; the driver only moves refs.

The two modes differ only in their gather strategy (`SyncGather`, `AsyncGather`):
which fragments the driver takes each iteration and whether it waits for the
learner. Every role may die: Ray restarts it, `RoleWatch` notices the new
process, and the recovery is the role's own (see `_recover`).
"""
from __future__ import annotations

import time

import ray
from ray.exceptions import GetTimeoutError, RayTaskError
from ray.util.placement_group import remove_placement_group

from distrl.config import Config, to_dict
from distrl.core import Gathered, Restarts, RoleLost, RoleRestarted, Roles, RunState, TrainStats
from distrl.observe.trace import TraceStore, tracer
from distrl.roles.experience import newest_store, write_store
from distrl.roles.factory import resolve_device, trace_settings
from distrl.runtime.actors import (Evaluator, GradientWorker, Learner, ParameterServer, ReplayServer, RolloutWorker,
                                   start_tracing)
from distrl.runtime.inference import InferenceServer
from distrl.runtime.ray_setup import (ACTOR_GONE, actor_options, heap_runtime_env, in_bundle, init_ray, next_to,
                                     pack_group, role_count, role_resources, spread_group, user_modules)
from distrl.runtime.watch import RoleWatch
from distrl.runtime.workers import WorkerPool


# Whose calls block on whom: a role silent because one of these hangs is not the one to blame.
WAITS_ON = {"learner": ("replay", "parameter_server"), "evaluator": ("parameter_server",),
            "inference": ("parameter_server",)}


class RayRoles(Roles):
    """ParameterServer, ReplayServer, Learner, Evaluator and N RolloutWorkers as actors."""

    def __init__(self, cfg: Config, run_dir: str, start_time: float, address: str | None = None,
                 eval_resume: dict | None = None):
        init_ray(address, user_modules(cfg))
        start_tracing(trace_settings(cfg), "driver")  # labelled with its Ray node, as the actors are
        self.cfg, self.run_dir = cfg, run_dir
        self.group, self.pool, self.gradient_workers, self.inference = None, None, [], []
        self.learner = self.evaluator = self.replay = self.ps = None
        self.replay_refilled = 0  # items restarted replay servers got back from checkpoints
        self.learner_state = None  # what a restarted learner is restored to (set once the roles are up)
        try:
            self._start(cfg, run_dir, start_time, address, eval_resume)
        except BaseException:  # nothing of a run that failed to start stays on the cluster
            self.close()
            raise
        self.train_calls: dict = {}  # in-flight learner call -> updates asked
        self.rewound: list[TrainStats] = []  # learner restores to report with the next train()
        self.eval_ref = None
        self.trace_kept, self.trace_pulls = TraceStore(), []  # rings pulled at checkpoints, and pulls in flight
        self.timings = {"env_s": 0.0, "inference_s": 0.0, "pull_s": 0.0, "learner_s": 0.0, "learner_wait_s": 0.0}

    def _start(self, cfg: Config, run_dir: str, start_time: float, address: str | None,
               eval_resume: dict | None) -> None:
        d, f, heap_env, device = to_dict(cfg), cfg.fault, heap_runtime_env(), resolve_device(cfg.device)
        wanted = role_resources(cfg, bool(address), device)
        place = {name: actor_options(res) for name, res in wanted.items()}
        role = {"max_restarts": f.max_role_restarts, "max_task_retries": 0}
        # Gradient workers are spread over the nodes (one bundle each of a placement group, one per node
        # where enough nodes fit them): their point is more cores for the learner's arithmetic. A gradient call
        # is pure, so Ray may retry it on a restarted worker.
        grads = role_count(cfg, "gradient_workers")
        self.group = spread_group(wanted["gradient_workers"], grads, f.role_timeout_s) if grads else None
        self.ps = ParameterServer.options(**role, **place["parameter_server"]).remote(trace_settings(cfg))
        # On a cluster an unplaced replay server goes to the learner's node: batches that cross nodes leave
        # the learner waiting for them (bench/RESULTS.md, paper model).
        near = next_to(place["learner"], f.role_timeout_s) if address and not cfg.placement.replay else {}
        self.replay = ReplayServer.options(**role, **place["replay"], **near, runtime_env=heap_env).remote(d)
        self.gradient_workers = [
            GradientWorker.options(**place["gradient_workers"], **in_bundle(self.group, i),
                                   max_restarts=f.max_role_restarts, max_task_retries=3).remote(d, i)
            for i in range(grads)]
        self.learner = Learner.options(**role, **place["learner"], **near, runtime_env=heap_env).remote(
            d, self.ps, self.replay, device, self.gradient_workers)
        self.evaluator = Evaluator.options(**role, **place["evaluator"]).remote(d, self.ps, start_time, eval_resume)
        # Its calls are retried on a restarted server, which pulls the weights again before it answers.
        self.inference = [InferenceServer.options(**place["inference"], max_restarts=f.max_role_restarts,
                                                  max_task_retries=-1).remote(d, self.ps, cfg.workers)
                          for _ in range(role_count(cfg, "inference"))]
        # A dead worker is restarted by Ray with the same constructor args and options (so the same
        # placement) and re-syncs its weights on its first sample; its in-flight fragment is lost and
        # counted by the driver. Spreading uses Ray's SPREAD strategy rather than a placement group: it is
        # one option per actor that Ray applies again on a restart, while a group reserves every bundle up
        # front, has to be re-placed after a node loss, and must be removed at the end.
        self.watch = RoleWatch({"learner": self.learner, "replay": self.replay, "parameter_server": self.ps,
                                "evaluator": self.evaluator, **{"inference": s for s in self.inference}},
                               f.role_timeout_s, waits_on=WAITS_ON)
        if address:  # the roles hold their CPUs before workers ask: a worker on the learner's node could take them
            self._wait_for_roles()
        strategy = cfg.placement.workers_strategy  # pack needs a group: Ray has no per-actor PACK strategy
        self.worker_group = pack_group(wanted["workers"], cfg.workers, f.role_timeout_s) if strategy == "pack" else None
        spread = {"scheduling_strategy": "SPREAD"} if strategy == "spread" else {}
        where = [in_bundle(self.worker_group, i) if self.worker_group else spread for i in range(cfg.workers)]
        workers = [RolloutWorker.options(**place["workers"], **where[i], max_restarts=f.max_worker_restarts + 1,
                                         max_task_retries=0).remote(d, i, cfg.workers, self.ps, *self.inference)
                   for i in range(cfg.workers)]
        self.pool = WorkerPool(workers, cfg)
        if not address:  # embedded, no role reserves a CPU: workers start alongside the roles
            self._wait_for_roles()
        self._get(self.learner.publish.remote(), "learner")  # version 0 exists before any worker acts
        # What a restarted learner is restored to: the newest checkpoint's state, or this one before it.
        self.learner_state = self._get(self.learner.get_state.remote(), "learner")

    def _wait_for_roles(self) -> None:
        for name in self.watch.actors:  # their processes start in parallel; wait once for all
            self.watch.wait_for(name, self.cfg.fault.role_timeout_s)

    @property
    def workers(self) -> list:
        return self.pool.workers if self.pool is not None else []

    # --- workers ------------------------------------------------------------------
    def gather(self, allow_sampling: bool) -> Gathered:
        for name in self.watch.poll():
            self._recover(name)
        pairs, failed, ready, late = self.pool.gather(allow_sampling)
        adds = [self.replay.add.remote(data_ref) for _, data_ref in pairs]
        if self.pool.gatherer.waits_for_learner and adds:
            try:
                self._get(adds, "replay")  # the learner must see this data before it trains
            except RoleRestarted:  # the replay server died under these adds: their fragments are lost
                pairs, failed = [], failed + len(pairs)
        infos = [info for info, _ in pairs]
        for info in infos:
            for k, v in info.timings.items():
                self.timings[k] = self.timings.get(k, 0.0) + v
        if self.pool.all_lost():
            raise RoleLost(f"every rollout worker stayed unreachable for {self.cfg.fault.worker_timeout_s:.0f} s")
        return Gathered(infos, ready=ready, late=late, failed=failed)

    def _get(self, refs, role: str | None = None):
        """ray.get with the fault timeout, so a wait never hangs a run: `role`, whose call it is, is alive but
        hung when it does not answer in time (`RoleLost`). A role that died under the call is waited for and
        put back in the run, and the call raises `RoleRestarted` (its result is lost)."""
        timeout_s = self.cfg.fault.role_timeout_s
        try:
            return ray.get(refs, timeout=timeout_s)
        except GetTimeoutError:
            if role is not None:
                raise self.watch.hung([role], timeout_s) from None
            raise RoleLost(f"a call took longer than fault.role_timeout_s={timeout_s:.0f} s") from None
        except (*ACTOR_GONE, RayTaskError) as e:
            name = self._died(e)
            if name is None:  # not a death: a fault of the code the call ran
                raise
            self._bring_back(name)
            raise RoleRestarted(f"the {name.replace('_', ' ')} died during a call") from None

    def _died(self, err: Exception) -> str | None:
        """The role whose death `err` reports, "unknown" if Ray does not say which, None if not a death.
        A call that failed because another actor died under it is an instance of that death too."""
        if not isinstance(err, ACTOR_GONE):
            return None
        ids = {actor._actor_id.hex(): name for name, actor in self.watch.actors.items()}
        ids.update({w._actor_id.hex(): "gradient_worker" for w in self.gradient_workers})
        return ids.get(getattr(err, "actor_id", None), "unknown")

    def _bring_back(self, name: str) -> None:
        """Wait until the role answers again (`RoleLost` if it does not in time) and put it back in the run."""
        if name == "gradient_worker":  # Ray already retried its calls on restarts: this one is gone for good
            raise RoleLost("a gradient worker died and did not come back")
        for role in (self.watch.actors if name == "unknown" else [name]):
            if self.watch.wait_for(role, self.cfg.fault.role_timeout_s):
                self._recover(role)

    # --- learner ------------------------------------------------------------------
    def train(self, budget: int, final: bool = False) -> list[TrainStats]:
        """Async keeps two calls queued at the learner so it never waits on the driver;
        sync waits for each call (the next round must see the new weights)."""
        done, self.rewound = self.rewound, []
        if self.train_calls:
            ready, _ = ray.wait(list(self.train_calls), num_returns=len(self.train_calls),
                                timeout=self.cfg.fault.role_timeout_s if final else 0)
            done.extend(s for ref in ready for s in self._train_result(ref))
        max_queued = 1 if self.pool.gatherer.waits_for_learner else 2
        while not final and budget > 0 and len(self.train_calls) < max_queued:
            # Cap each call so the driver regains control often enough to log and stop.
            n = min(budget, 4 * self.cfg.learner.batches_per_call)
            ref = self.learner.train.remote(n)
            self.train_calls[ref] = n
            budget -= n
            if self.pool.gatherer.waits_for_learner:
                done.extend(self._train_result(ref))
        for s in done:
            self.timings["learner_s"] += s.learner_s
            self.timings["learner_wait_s"] += s.wait_s
        return done

    def _train_result(self, ref) -> list[TrainStats]:
        """A learner call's stats; after a death under it (the learner's, or the replay server's), the
        role's recovery, and the call's updates are not counted (the learner's state says what stands)."""
        self.train_calls.pop(ref, None)
        try:
            return [self._get(ref, "learner")]
        except RoleRestarted:  # already recovered; a restored learner's rewind is reported instead
            done, self.rewound = self.rewound, []
            return done

    def _recover(self, name: str) -> None:
        """A role came back as a new process: put it back in the run."""
        if name == "learner" and self.learner_state is not None:
            # Its in-flight calls died with it; its state goes back to the newest checkpoint's, and its
            # weights replace those of the updates that were lost.
            self.train_calls.clear()
            version = self._get(self.learner.set_state.remote(self.learner_state), "learner")
            self.rewound.append(TrainStats(rewound_to=int(self.learner_state["state"]["updates"]), version=version))
        elif name == "parameter_server":
            self.learner.publish.remote()  # it came back empty: the learner's newest weights, now
        elif name == "replay":
            # It came back empty: the newest checkpoint's store, read where the replay runs when that is the
            # driver's node (no copy through the object store), else read here and sent.
            on_this_node = self.replay_on_driver_node()
            self.replay_refilled += self._get(self.replay.refill.remote(
                self.run_dir if on_this_node else None, None if on_this_node else newest_store(self.run_dir)), "replay")
        # The evaluator needs nothing; the inference server pulls the weights before it answers (its
        # recurrent states start from zero).

    def updates_in_flight(self) -> int:
        return sum(self.train_calls.values())

    # --- checkpoints ----------------------------------------------------------------
    def get_state(self) -> RunState:
        """Everything a checkpoint needs from the actors (waits for in-flight calls to finish)."""
        self._pull_traces()
        learner = self.learner.get_state.remote()
        workers = [w.get_state.remote() for w in self.workers]
        for name in ("replay", "parameter_server"):  # a restart since the last look: counted and handled
            if self.watch.wait_for(name, self.cfg.fault.role_timeout_s):
                self._recover(name)
        state = {"learner": self._get(learner, "learner"), "store": self._store_writer(),
                 "workers": self._get_workers(workers)}
        if state["learner"] is not None:
            self.learner_state = state["learner"]
        return state

    def _get_workers(self, refs: list) -> list[dict]:
        """Each worker's state; a worker that is down has none (it restarts from a fresh state)."""
        out = []
        for ref in refs:
            try:
                out.append(ray.get(ref, timeout=self.cfg.fault.worker_timeout_s))
            except (*ACTOR_GONE, RayTaskError, GetTimeoutError):
                out.append(None)
        return out

    def replay_on_driver_node(self) -> bool:
        return self._get(self.replay.node_id.remote(), "replay") == ray.get_runtime_context().get_node_id()

    def _store_writer(self):
        max_bytes = self.cfg.checkpoint.max_replay_bytes
        if self.replay_on_driver_node():  # same disk: the server writes its own file
            return lambda directory: self._get(self.replay.write.remote(directory, max_bytes), "replay")
        return lambda directory: write_store(directory, self._get(self.replay.state.remote(max_bytes), "replay"))

    def store_digest(self) -> str | None:
        return self._get(self.replay.digest.remote(), "replay")

    def set_state(self, state: RunState) -> None:
        refs = [w.set_state.remote(s) for w, s in zip(self.workers, state["workers"]) if s is not None]
        if state["store"] is not None:
            refs.append(self.replay.load.remote(state["store"]))
        self._get(refs)
        self._get(self.learner.set_state.remote(state["learner"]), "learner")
        self.learner_state = state["learner"]

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
        ref, self.eval_ref = self.eval_ref, None
        try:
            _, result = ray.get(ref)
        except (*ACTOR_GONE, RayTaskError):
            self.watch.pending.pop("evaluator", None)  # it died in the call: look at its pid now
            return []
        return [result] if result is not None else []

    def eval_busy(self) -> bool:
        return self.eval_ref is not None

    # --- the rest of the contract -----------------------------------------------------
    def restarts(self, exact: bool = False) -> Restarts:
        if exact:
            for name in self.watch.poll():
                self._recover(name)
            for name in self.watch.actors:  # one killed just before the end is counted once it answers again
                try:
                    if self.watch.wait_for(name, min(10.0, self.cfg.fault.role_timeout_s)):
                        self._recover(name)
                except RoleLost:
                    pass  # still down: not counted as restarted
            self.pool.settle(min(10.0, self.cfg.fault.role_timeout_s))
        r = self.watch.restarts
        return Restarts(workers=self.pool.restarts, evaluator=r["evaluator"], replay=r["replay"],
                        learner=r["learner"], parameter_server=r["parameter_server"], workers_lost=len(self.pool.lost),
                        inference=r.get("inference", 0), replay_refilled=self.replay_refilled)

    def time_breakdown(self) -> dict[str, float]:
        return dict(self.timings)

    def _pull_traces(self) -> None:
        """At a checkpoint, move what the actors recorded so far to the driver, so that an actor that dies
        takes with it only the events since. Not waited for: an actor busy in a call answers after it,
        and its answer is kept at the next checkpoint or at the end."""
        if not self.cfg.log.trace:
            return
        ready, self.trace_pulls = ray.wait(self.trace_pulls, num_returns=len(self.trace_pulls), timeout=0) \
            if self.trace_pulls else ([], [])
        self._keep_traces(ready, deadline=0.0)
        self.trace_pulls += [a.drain_trace.remote() for a in self.actors()]

    def _keep_traces(self, refs: list, deadline: float) -> None:
        for ref in refs:
            try:
                self.trace_kept.add(ray.get(ref, timeout=max(0.0, deadline - time.time())))
            except (*ACTOR_GONE, RayTaskError, GetTimeoutError):
                pass  # it died before it answered (its events since the last pull went with it), or hangs

    def traces(self) -> list[dict]:
        """Every actor's recorded events (one that died keeps those pulled at checkpoints before its death)
        and the driver's own."""
        if not self.cfg.log.trace:
            return []
        refs, self.trace_pulls = self.trace_pulls + [a.drain_trace.remote() for a in self.actors()], []
        self._keep_traces(refs, deadline=time.time() + 30)
        self.trace_kept.add(tracer().drain())
        return self.trace_kept.drains()

    def _settle_calls(self) -> None:
        """Read the outcome of learner calls still in flight (a run that ended on a fault), waiting a moment,
        so that Ray does not print one that failed as an unhandled error: a learner call fails once a hung
        replay server it waits on is ended."""
        refs = list(getattr(self, "train_calls", {}))
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=1.0) if refs else ([], [])
        for ref in ready:
            try:
                ray.get(ref)
            except (*ACTOR_GONE, RayTaskError):
                pass

    def actors(self) -> list:
        roles = (self.learner, self.evaluator, self.replay, self.ps)
        return [*self.workers, *(a for a in roles if a is not None), *self.gradient_workers, *self.inference]

    def close(self) -> None:
        self._settle_calls()
        for actor in self.actors():
            ray.kill(actor)
        for group in (self.group, getattr(self, "worker_group", None)):  # _start may have failed before either
            if group is not None:
                remove_placement_group(group)
