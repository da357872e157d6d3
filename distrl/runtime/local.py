"""`single` mode: rollout, replay and learner in this process; the evaluator in its own.

No Ray here: starting Ray and its actor processes costs seconds, more than half
of what solving CartPole should take, and one process needs no object store.
The evaluator runs in a spawned process (`distrl.runtime.local_eval`), watched
and restarted like every role, so scoring never stalls learning.
"""
from __future__ import annotations

from distrl.config import Config
from distrl.core import Gathered, Restarts, RoleLost, Roles, RunState, TrainStats
from distrl.observe.startup import StartupLine
from distrl.observe.trace import configure, tracer
from distrl.roles.factory import make_algorithm, make_rollout, policy_seed, resolve_device, trace_settings
from distrl.roles.learning import LocalIO
from distrl.runtime.counters import plus, restarts_in
from distrl.runtime.faultlog import FaultLog
from distrl.runtime.local_eval import LocalEvaluator
from distrl.runtime.pacing import experience_spec, learner_loop, make_experience, thread_choice
from distrl.threads import one_compute_thread

SERVER_WAIT_S = 0.05  # with no worker of its own, a gather waits this long for the simulator server's fragment


class LocalRoles(Roles):
    """Every role in this process except the evaluator."""

    def __init__(self, cfg: Config, start_time: float, eval_resume: dict | None = None, run_dir: str | None = None,
                 startup: StartupLine | None = None):
        """`startup`: where the start is said on the console (none: silent)."""
        one_compute_thread(load_torch=True)
        configure("main", None, *trace_settings(cfg.log))
        self.cfg = cfg
        self.restarts_before = Restarts()  # a resumed run's, from its checkpoint
        self.lost: RoleLost | None = None  # the evaluator could not come back
        # First: overlaps its start-up.
        self.evaluator = LocalEvaluator(cfg, start_time, eval_resume, FaultLog(run_dir, start_time))
        startup = startup or StartupLine(start_time, enabled=False)
        startup.starting(["evaluator"])
        self.evaluator.stop_due = lambda: self.stop_due()  # the driver sets `stop_due` later
        algo = make_algorithm(cfg)
        learner = algo.make_learner(resolve_device(cfg.device))
        if cfg.learner.cuda_graph:
            learner.capture_update()
        self.policy = algo.make_policy(0, 1, policy_seed(cfg.seed, 0))
        self.experience = make_experience(experience_spec(cfg), cfg)
        self.loop = learner_loop(learner, cfg.algo, cfg.learner, LocalIO(self.experience, self.policy),
                                 threads=thread_choice(str(learner.device), cfg.learner.threads, cfg.mode, cfg.workers,
                                                      cfg.eval.interval_steps is not None))
        self.loop.publish()
        # An offline run's replay holds its dataset: no env is stepped but the evaluator's; external simulators
        # stand in for the worker unless asked beside it.
        own = not cfg.data.dataset and (cfg.external.with_workers or not cfg.external.enabled)
        self.rollout = make_rollout(cfg, self.policy, cfg.seed, 0) if own else None
        self.timings = {"env_s": 0.0, "inference_s": 0.0, "learner_s": 0.0}
        self.run_dir, self.server, self.server_restarts = run_dir, None, 0
        if cfg.external.enabled:
            self._start_server(cfg.external.port)
        self._say_evaluator(startup)

    def _say_evaluator(self, startup: StartupLine) -> None:
        """Whether the evaluator answered yet: training does not wait for it (the first evaluation does)."""
        self.evaluator.check()
        if self.evaluator.ready:
            startup.ready("evaluator")
        else:
            startup.say("learner ready in this process; the evaluator still starting (training does not wait for it)")

    def get_state(self) -> RunState:
        max_bytes = self.cfg.checkpoint.max_replay_bytes
        return {"learner": self.loop.get_state(), "workers": [self.rollout.get_state()] if self.rollout else [],
                "store": lambda directory: self.experience.write(directory, max_bytes)}

    def set_state(self, state: RunState) -> None:
        if state["store"] is not None:
            self.experience.load(state["store"])
        if self.rollout is not None and state["workers"] and state["workers"][0] is not None:
            self.rollout.set_state(state["workers"][0])
        self.loop.set_state(state["learner"])
        self.restarts_before = restarts_in(state)

    def store_digest(self) -> str | None:
        return self.experience.digest()

    def replay_bytes_per_item(self) -> float | None:
        return self.experience.bytes_per_item

    def gather(self, allow_sampling: bool) -> Gathered:
        if self.lost is not None:
            raise self.lost
        if not allow_sampling:  # the learner is behind (a simulator server holds its clients back meanwhile)
            return Gathered()
        frags = [self.rollout.sample()] if self.rollout is not None else []
        if self.server is not None:
            frags.append(self._take(0.0 if frags else SERVER_WAIT_S))
        for frag in frags:
            if frag.data is not None:  # a server's empty fragment carries only its counts
                self.experience.add(frag.data, frag.priorities, frag.info.fragment_id)
            self.loop.add_statistics(frag.info.statistics)
            for k, v in frag.info.timings.items():
                self.timings[k] += v
        return Gathered([f.info for f in frags], ready=sum(f.data is not None for f in frags))

    # --- the simulator server (external.enabled): a thread of this process ----------------
    def _start_server(self, port: int) -> None:
        from distrl.roles.external_address import identity, publish
        from distrl.roles.external_server import SimulatorServer

        ext = self.cfg.external
        token, port = identity(self.run_dir, ext.host, port) if self.run_dir else ("", port)
        self.server = SimulatorServer(self.cfg, token, port, self._published, worker_index=1)
        if self.run_dir:
            publish(self.run_dir, ext.host, self.server.port, token, self.server.algo.spec)

    def _published(self, version: int):
        weights, newest = self.loop.io.published
        return None if weights is None or newest == version else (newest, weights)

    def _take(self, timeout_s: float):
        """The server's next fragment; a server that failed is started again (counted), as Ray restarts a
        dead role, on its port: its simulators reconnect."""
        try:
            return self.server.take(timeout_s)
        except RuntimeError:
            port = self.server.port
            self.server.close()
            self.server_restarts += 1
            self._start_server(port)
            return self.server.take(0.0)

    def train(self, budget: int, final: bool = False) -> list[TrainStats]:
        if budget <= 0:
            return []
        # Capped as a Ray learner call is, so the driver regains control often enough to log, evaluate and stop.
        stats = self.loop.train(min(budget, 4 * self.cfg.learner.batches_per_call))
        self.timings["learner_s"] += stats.learner_s + stats.wait_s
        return [stats]

    def submit_eval(self, env_steps: int, wait: bool = False) -> bool:
        if not self.evaluator.idle(wait):
            return False
        weights, version = self.loop.io.published  # as a worker acts with them: never non-finite
        self.evaluator.submit(weights, version, env_steps)
        return True

    def poll_eval(self, block: bool = False, timeout: float | None = None) -> list[dict]:
        return self.evaluator.poll(block, timeout)

    def eval_busy(self) -> bool:
        return self.evaluator.busy

    def wind_down(self, deadline: float, watch_hangs: bool = False) -> list[str]:
        """The run has stopped: no wait lasts past `deadline`, nothing is restarted; a process silent now is
        ended (the first time): which ones. This process's roles are the driver's own: only the evaluator,
        which no checkpoint waits on (`watch_hangs` changes nothing here)."""
        return self.evaluator.wind_down(deadline)

    def restarts(self, exact: bool = False) -> Restarts:
        """The evaluator's restarts (this process's roles do not restart: they are the driver). Looks at the
        evaluator's process (the driver asks at every pass); a `RoleLost` found here ends the next gather."""
        try:
            self.evaluator.check(restart=not exact)
        except RoleLost as e:
            self.lost = self.lost or e
        return plus(self.restarts_before, Restarts(evaluator=self.evaluator.restarts, external=self.server_restarts))

    def time_breakdown(self) -> dict[str, float]:
        return dict(self.timings)

    def traces(self) -> list[dict]:
        if not self.cfg.log.trace:
            return []
        evaluator = self.evaluator.drain_trace()
        return [tracer().drain(), *([evaluator] if evaluator else [])]

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        if self.rollout is not None:
            self.rollout.close()
        self.evaluator.close()
