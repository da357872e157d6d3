"""The roles of distrl as small interfaces, and the data that moves between them.

An algorithm (`Algorithm`) is a `Policy` (acting, in every rollout worker and the evaluator) and a
`Learner` (the only optimizer.step()) on one torch network. A run drives them through a `Roles`
object; whatever the mode, the driver's loop is::

    while not stopped:
        gathered = roles.gather(sampling_allowed)   # workers: env steps + batched inference -> replay
        for stats in roles.train(budget):           # learner: blocks of updates, publishes weights
            count(stats)
        roles.submit_eval(env_steps); roles.poll_eval()   # evaluator: greedy episodes, best checkpoint
        every checkpoint.interval_s: write(roles.get_state())

`single` mode implements `Roles` with the jobs in one process (the evaluator in a second); `sync` and
`async` with one Ray actor per role. The jobs are in `distrl.roles`; only `distrl.runtime` imports ray.
"""
from __future__ import annotations

import abc
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from distrl.acting import Inference, LocalInference

Weights = dict[str, np.ndarray]
"""A network's parameters as numpy arrays: cheap to pickle, zero-copy in Ray's store."""

Batch = dict[str, np.ndarray]
"""Named arrays sharing a leading batch dimension."""


@dataclass
class EnvSpec:
    """What an algorithm knows of an env to build its networks: one agent's spaces, how many agents act at once."""

    observation_space: Any
    action_space: Any
    num_agents: int = 1
    frame_stack: int = 0
    """Observations are stacks of this many frames on their first axis, each step's the previous one shifted by a
    frame (gymnasium's FrameStackObservation); 0: they are not. Replay then stores each frame once."""
    state_space: Any = None
    """A multi-agent env's global state (`MAStep.state`, what a central critic may read); None: it has none."""


@dataclass
class Trajectory:
    """Time-major arrays (T, E, ...) from one worker's vector of E envs over T steps.

    `next_obs[t]` is the true next observation: on an episode end it is the
    final observation, not the one after reset. `extras` holds what the policy
    returned while acting (Q-values, log-probs, ...).
    """

    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    next_obs: np.ndarray
    extras: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class FragmentInfo:
    """The small part of a fragment the driver reads: counters and episode stats."""

    worker: int
    version: int
    env_steps: int
    episode_returns: np.ndarray
    episode_lengths: np.ndarray
    timings: dict[str, float] = field(default_factory=dict)
    env_errors: int = 0
    pid: int = 0  # the worker's process id: a change means the worker was restarted
    items: int = 0  # items the fragment stores (transitions, sequences): what the rate limiter counts
    fragment_id: int = 0  # unique per fragment: links its transfer to the replay server in traces
    episodes: list = field(default_factory=list)  # whole episodes that ended, when the run records them (log.dataset)
    statistics: dict | None = None  # env.normalize: RunningStats of the raw rows recorded for this fragment
    counts: dict = field(default_factory=dict)  # a simulator server's events since its last fragment (clients: a gauge)


@dataclass
class Fragment:
    """One worker call's experience, ready for replay: flat arrays plus priorities."""

    data: Batch
    priorities: np.ndarray | None
    info: FragmentInfo


class Policy(abc.ABC):
    """The acting half of an algorithm: lives in rollout workers and the evaluator.

    A policy that can act through a central `InferenceServer` splits acting in two: `forward`, the weights'
    arithmetic (row-wise, no randomness: the part a server batches over every worker), and `act`, which explores
    on its outputs with the worker's own RNG and schedule. It reaches `forward` through `self.inference` (`infer`
    while acting, `evaluate` for what postprocessing needs): a `LocalInference` unless it was given a server.
    """

    version: int = -1
    inference: Inference | None = None
    statistics: Weights = {}  # env.normalize statistics that came with the newest weights: its envs use them
    global_state: bool = False  # its postprocess reads a multi-agent env's global state: workers send it

    @abc.abstractmethod
    def set_weights(self, weights: Weights, version: int) -> None:
        """Load published learner weights (and keep their normalization statistics in `statistics`)."""

    @abc.abstractmethod
    def act(self, obs: np.ndarray, explore: bool) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Actions for a batch of observations, plus extras to keep in the trajectory."""

    def forward(self, obs: np.ndarray, state: np.ndarray | None) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
        """(outputs, next state) of the network on a batch of rows, from `state` (None when feedforward)."""
        raise NotImplementedError(f"{type(self).__name__} does not act through central inference")

    def initial_state(self, rows: int) -> np.ndarray | None:
        """The recurrent state of `rows` envs at an episode start; None for a feedforward policy."""
        return None

    def acting_rule(self) -> Any:
        """How `act` picks actions from `forward`'s outputs (a `distrl.sampling.ActingRule`, with this policy's
        exploration as it stands now), for whatever runs the network outside this process (a simulator acting
        locally, an exported file); None when acting needs more than one `forward` of the observation (a state)."""
        return None

    def place(self, device: str) -> None:
        """Run `forward` on `device` (a torch device name), inputs and outputs still numpy."""
        if device != "cpu":
            raise NotImplementedError(f"{type(self).__name__} runs on the CPU only")

    def _inference(self) -> Inference:
        if self.inference is None:
            self.inference = LocalInference(self)
        return self.inference

    def infer(self, obs: np.ndarray) -> dict[str, np.ndarray]:
        """`forward` on this worker's envs, advancing each env's state ('state' in the outputs: the one before)."""
        return self._inference().step(obs)

    def evaluate(self, obs: np.ndarray, state: np.ndarray | None = None) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
        """`forward` on rows outside the envs' flow (bootstrap values), touching no env's state."""
        return self._inference().forward(obs, state)

    def observe_steps(self, env_steps: int) -> None:
        """Told how many env steps this worker has taken (for exploration schedules)."""

    def episodes_ended(self, done: np.ndarray) -> None:
        """Told which envs of the batch ended an episode: the next observation starts one (a state is reset)."""
        self._inference().reset(done)

    @abc.abstractmethod
    def postprocess(self, traj: Trajectory) -> tuple[Batch, np.ndarray | None]:
        """Turn a trajectory into stored items and their initial priorities (or None)."""


class Learner(abc.ABC):
    """The learning half of an algorithm: the only place optimizer.step() runs."""

    updates: int = 0

    @abc.abstractmethod
    def update(self, batch: Batch) -> dict[str, Any]:
        """One gradient update: scalars to log, 'priorities' per item, 'nonfinite' (no step: a NaN or inf loss
        or gradient). Values may be tensors on the learner's device, read back once per block (`learn_block`);
        an update whose 'nonfinite' is a tensor is counted in `updates` until `uncount` says otherwise."""

    def capture_update(self) -> None:
        """Run `update`'s device work as a CUDA graph where it can (`distrl.algos.capture`)."""

    def uncount(self, skipped: int) -> None:  # read back: `skipped` counted updates took no step
        self.updates -= skipped

    @abc.abstractmethod
    def weight_tensors(self) -> dict[str, Any]:
        """The acting network's state_dict, live on the learner's device: what policies load."""

    def get_weights(self) -> Weights:  # numpy copies: waits for the device
        return {k: v.detach().cpu().numpy().copy() for k, v in self.weight_tensors().items()}

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume learning (networks, optimizer, counters)."""

    @abc.abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""


class Algorithm(abc.ABC):
    """An algorithm as it declares itself (class attributes: the registry, config and runtime read them),
    and what it builds from the config parts it holds: its section, `model` and, for sequences, `sequence`."""

    name: str = ""
    config: type = object
    """Its config section's dataclass (YAML key `name`)."""
    model_config: type = object
    """The `model` section's dataclass (`ModelConfig`, or `RecurrentModelConfig` with a core)."""
    model_defaults: dict = {}
    """Its defaults for the `model` section (e.g. a tanh MLP)."""
    modes: tuple[str, ...] = ("single", "sync", "async")
    actions: tuple[str, ...] = ("discrete",)
    """Action spaces it takes: "discrete", "box" (a flat, bounded Box), "multi_discrete", "multi_binary"."""
    data_path: str = "replay"
    """"replay" (transitions, sampled), "sequence" (sequences in shared chunks, sampled), "trajectory"
    (a FIFO, each fragment used once) or "gradients" (a FIFO of worker-computed gradients)."""
    multi_agent: bool = False
    """Acts for every agent of a multi-agent env at once (`distrl.envs.multiagent`)."""
    central_inference: bool = True
    """Its policy acts through `Policy.forward`, so an InferenceServer can run it for every worker."""
    gradient_workers: bool = False
    """Its learner can share each step's gradient with gradient workers (`distrl.algos.sharding`)."""
    image_torso: str = "auto"
    """The torso `model.torso: auto` picks for image observations (auto: by image size)."""
    offline: bool = False
    """Learns from a dataset only (`data.dataset`), with no rollout workers (`Algorithm.dataset_items`)."""
    external: bool = False
    """Learns from simulators that own their loop (`external.enabled`): a stateless policy, experience sent."""

    def __init__(self, spec: EnvSpec, cfg: Any, model: Any, seed: int = 0, sequence: Any = None):
        self.spec, self.cfg, self.model, self.seed, self.sequence = spec, cfg, model, seed, sequence

    @classmethod
    def check_spec(cls, spec: EnvSpec) -> str | None:
        """Why this algorithm can't run on `spec`, or None if it can."""
        return None

    def check_config(self) -> str | None:
        """Why its config section can't run on its env (`self.spec`), one line naming the key, or None if it can."""
        return None

    def torso_spaces(self) -> list:
        """The spaces its torsos are built for (checked before a run starts)."""
        return [self.spec.observation_space]

    @abc.abstractmethod
    def build_network(self) -> Any:
        """The network policies act with (an `nn.Module`): the same for the learner, every worker,
        the evaluator and the inference server."""

    @abc.abstractmethod
    def make_learner(self, device: str) -> Learner:
        """The learner, on `device`."""

    @abc.abstractmethod
    def make_policy(self, worker_index: int, num_workers: int, seed: int) -> Policy:
        """The acting half for worker `worker_index` (-1: the evaluator or an inference server)."""


# --- what moves between the roles and the driver ----------------------------------
# Already metrics.csv columns, or running totals whose per-interval mean means nothing.
NOT_LOGGED = {"loss", "dropped", "dropped_total", "policy_lag", "optimizer_steps", "nonfinite"}
NONFINITE = "nonfinite/"  # learner.jsonl key prefix: how many values of a stat were NaN or inf (a count, not a mean)


def add_to_sums(sums: dict[str, list[float]], name: str, total: float, count: int) -> None:
    """sums[name] = [sum, count], accumulated: means taken later need both."""
    acc = sums.setdefault(name, [0.0, 0])
    acc[0] += total
    acc[1] += count


@dataclass
class TrainStats:
    """What one call of learner updates reports to the driver."""

    updates: int = 0   # optimizer updates that happened
    consumed: int = 0  # batches handed to the learner (> updates when A3C drops stale gradients)
    dropped: int = 0
    loss_sum: float = 0.0
    lags: list[float] = field(default_factory=list)
    learner_s: float = 0.0
    wait_s: float = 0.0
    version: int = 0
    starved: bool = False  # the store had nothing to give
    scalars: dict[str, list[float]] = field(default_factory=dict)  # name -> [sum, count] of learner stats
    nonfinite: int = 0       # updates skipped because their loss or gradient was NaN or inf
    nonfinite_tail: int = 0  # of those, how many came after the call's last good update
    poisoned: bool = False   # the learner's weights hold a NaN or inf: they were not published
    rewound_to: int | None = None  # a restarted learner was restored to this update count

    def add_scalars(self, out: dict) -> None:
        """Sum the learner's scalar diagnostics (alpha, entropy, KL, ...) for the driver's log;
        a NaN or inf is counted under NONFINITE + name instead of being averaged in."""
        for k, v in out.items():
            if k not in NOT_LOGGED and isinstance(v, (float, int, np.floating, np.integer)) and not isinstance(v, bool):
                if math.isfinite(v):
                    add_to_sums(self.scalars, k, float(v), 1)
                else:
                    add_to_sums(self.scalars, NONFINITE + k, 1.0, 1)


@dataclass
class Gathered:
    """One gather: the fragments that arrived (already stored) and how the workers fared."""

    infos: list[FragmentInfo] = field(default_factory=list)
    ready: int = 0    # workers that delivered in this gather
    late: int = 0     # workers still busy when the async window closed
    failed: int = 0   # calls lost to a dead or failing worker (their fragments are dropped)


@dataclass
class Restarts:
    """Role processes restarted after a death, per role."""

    workers: int = 0
    evaluator: int = 0
    replay: int = 0
    learner: int = 0
    parameter_server: int = 0
    workers_lost: int = 0  # workers unreachable for longer than fault.worker_timeout_s
    inference: int = 0     # the inference server (rollout.inference: central)
    gradient_workers: int = 0  # learner.num_gradient_workers' actors
    replay_refilled: int = 0  # items restarted replay servers got back from the newest checkpoint
    external: int = 0  # the simulator server (external.enabled)


RunState = dict[str, Any]  # a checkpoint's: {"learner": ..., "store": data, None or a writer, "workers": [...]}
StoreWriter = Callable[[str], Any]  # writes the store into a checkpoint directory being built (checkpoint.run)


class RoleLost(RuntimeError):
    """A role did not come back (or start) within its time: the run cannot go on."""


class RoleRestarted(RuntimeError):
    """A role died during a call and is back as a new process: that call's result is lost; try again."""


class Stopping(Exception):
    """A wait on a role cut short by the run's stop, or by its wind-down's deadline (`Roles.wind_down`)."""


class Roles(abc.ABC):
    """What the driver needs from the processes of a run: the contract every mode implements."""

    # Set by the driver: waits on roles end at the run's stop; `wind_down(deadline)` once it has stopped.
    stop_due: Callable[[], bool] = staticmethod(lambda: False)

    @abc.abstractmethod
    def gather(self, allow_sampling: bool) -> Gathered:
        """Fragments that finished (now in replay); `allow_sampling` False holds workers back."""

    @abc.abstractmethod
    def train(self, budget: int, final: bool = False) -> list[TrainStats]:
        """Finished learner calls, after starting new ones worth up to `budget` updates;
        `final` waits for every call in flight and starts none."""

    def updates_in_flight(self) -> int:
        """Updates asked of the learner whose stats have not come back yet."""
        return 0

    @abc.abstractmethod
    def submit_eval(self, env_steps: int, wait: bool = False) -> bool:
        """Score the newest weights; False if the evaluator is still busy (`wait`: until it is ready)."""

    @abc.abstractmethod
    def poll_eval(self, block: bool = False, timeout: float | None = None) -> list[dict]:
        """Evaluation results that have arrived."""

    @abc.abstractmethod
    def eval_busy(self) -> bool:
        """An evaluation is in flight."""

    def restarts(self, exact: bool = False) -> Restarts:
        """Role restarts so far (`exact`: ask the processes now rather than use the last count)."""
        return Restarts()

    @abc.abstractmethod
    def time_breakdown(self) -> dict[str, float]:
        """Seconds spent per kind of work, summed over processes."""

    @abc.abstractmethod
    def get_state(self) -> RunState:
        """Everything a checkpoint needs from the roles (`RoleRestarted`: a role died meanwhile)."""

    @abc.abstractmethod
    def set_state(self, state: RunState) -> None:
        """Restore what `get_state` captured (read back from a checkpoint)."""

    @abc.abstractmethod
    def store_digest(self) -> str | None:
        """sha256 of the experience store's contents."""

    def replay_bytes_per_item(self) -> float | None:
        """Real bytes the replay holds per stored item (None: an on-policy FIFO, or no replay)."""
        return None

    def traces(self) -> list[dict]:
        """What every process of the roles recorded (`distrl.observe.trace`), drained; [] when not tracing."""
        return []

    @abc.abstractmethod
    def close(self) -> None:
        """Stop every process this object started."""
