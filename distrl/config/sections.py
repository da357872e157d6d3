"""The run-level sections of a config: env, rollout, replay, learner, evaluation, stops, faults, logging, placement."""
from __future__ import annotations

from dataclasses import dataclass, field

from distrl.config.fields import WEEK_S, YEAR_S, ConfigError, f


ENV_PRESETS = ("none", "atari")


@dataclass
class NormalizeConfig:
    """Running statistics every worker updates from its own steps, merged by the learner and sent back with
    the weights (`distrl.envs.normalize`); the evaluator uses them frozen."""

    obs: bool = f(False, "normalize observations to zero mean and unit variance (training and evaluation envs; "
                  "a Dict or Tuple observation's float Box leaves each by their own statistics)")
    reward: bool = f(False, "divide training rewards by the standard deviation of the discounted return "
                     "(the evaluator scores the env's own rewards)")
    clip: float | None = f(10.0, "clip normalized observations and rewards to [-clip, clip] (null = no clip)",
                           lo=0.0, lo_open=True)
    gamma: float = f(0.99, "discount of the return whose spread scales rewards (the algorithm's gamma)",
                     lo=0.0, hi=1.0)


@dataclass
class EnvConfig:
    """The env: the base env from `id` and `kwargs`, then the preset's wrappers, then `wrappers` in order.

    Rollout workers' envs get every wrapper; the evaluator's (and `distrl eval`'s) leave out the
    train-only ones, so they score the game as it is (e.g. full Atari games, unclipped rewards).
    """

    id: str = f("CartPole-v1", "gymnasium environment id (ALE/Breakout-v5 and MinAtar/Breakout-v1 need no import)")
    num_envs: int = f(16, "environments each rollout worker steps with one batched forward pass", lo=1, hi=4096)
    kwargs: dict = f({}, "keyword arguments passed to gymnasium.make (e.g. continuous: true)")
    wrappers: list = f([], "gymnasium wrappers applied in order after the preset's: a name from gymnasium.wrappers "
                       "or package.module:Class, bare (TimeLimit) or with kwargs ({FrameStackObservation: "
                       "{stack_size: 4}}); train_only: true beside the name applies it to rollout workers' envs "
                       "only ({ClipReward: {min_reward: -1, max_reward: 1}, train_only: true})")
    preset: str = f("none", "standard preprocessing: none | atari (no-op starts, frame skip 4 with max-pool, 84x84 "
                    "grayscale, 4 frames stacked; rewards clipped to [-1, 1] and a lost life ending the episode for "
                    "training only; sticky actions stay the game's own)", choices=ENV_PRESETS)
    obs_keys: list | None = f(None, "the keys of a Dict observation to keep, dropping the rest (e.g. [image, direction] "
                              "drops MiniGrid's text mission); null: every key")
    action_mask: str = f("auto", "where legal actions come from: obs (the Dict observation's action_mask key), info "
                         "(info['action_mask']), auto (the first the env gives) or none; masked actions are never "
                         "taken", choices=("auto", "info", "obs", "none"))
    normalize: NormalizeConfig = field(default_factory=NormalizeConfig, metadata={
        "doc": "observation and reward normalization shared by every worker (after every other wrapper)"})


@dataclass
class ExternalConfig:
    """Simulators that own their loop: the run starts a server they connect to with `distrl.client` or the
    protocol (docs/reference/protocol.md), and their experience goes where rollout workers' goes."""

    enabled: bool = f(False, "start the simulator server: experience comes from clients that connect with the run's "
                      "token (RUN_DIR/external.json); own rollout workers run only with with_workers")
    host: str = f("127.0.0.1", "address the server listens on (0.0.0.0: every interface, for simulators on other "
                  "machines); it runs on the driver's machine")
    port: int = f(0, "TCP port (0: a free one, chosen at the start, kept across the server's restarts and written "
                  "to RUN_DIR/external.json)", lo=0, hi=65535)
    observation_space: dict | None = f(None, "what simulators observe: {type: box, shape: [4], dtype: float32, "
                                       "low: -.inf, high: .inf}, or a {type: dict, spaces: {name: ...}} or {type: "
                                       "tuple, spaces: [...]} of box, discrete, multi_discrete and multi_binary "
                                       "leaves, an action_mask among them (null: env.id's)")
    action_space: dict | None = f(None, "what simulators take: {type: discrete, n: 2}, {type: box, shape: [1], "
                                  "low: -2, high: 2}, {type: multi_discrete, nvec: [3, 4]} or {type: multi_binary, "
                                  "n: 4} (null: env.id's)")
    with_workers: bool = f(False, "also run `workers` rollout workers on env.id beside the simulators")
    max_clients: int = f(16, "simulators connected at once; each takes an exploration slot (Ape-X's per-worker "
                         "epsilon over max_clients slots)", lo=1, hi=4096)
    max_message_bytes: int = f(16 * 2**20, "largest message a client may send; a larger one is refused and its "
                               "connection closed", lo=1024, hi=2**31 - 1)


@dataclass
class RolloutConfig:
    fragment_length: int = f(16, "steps per environment in one fragment sent by a worker", lo=1, hi=100_000)
    inference: str = f("local", "where the workers' network runs: local (in each worker) | central (one "
                       "InferenceServer batching every worker's observations; sync and async)", choices=("local", "central"))
    recurrence: int | None = f(None, "on-policy learners with a recurrent core (model.core): steps per trained "
                               "sequence, the truncated backprop-through-time length; it divides fragment_length "
                               "(null = the whole fragment)", lo=1)
    batch_timeout_ms: float = f(2.0, "central inference: how long the server waits for more workers' requests "
                                "before it runs a batch (it runs at once when every worker's is in)", lo=0.0, hi=10_000.0)


@dataclass
class ReplayConfig:
    capacity: int = f(100_000, "transitions (steps, for sequence replay) kept; the oldest are dropped", lo=1)
    prioritized: bool = f(True, "proportional prioritized replay; false = uniform")
    alpha: float = f(0.6, "priority exponent (0 = uniform)", lo=0.0, hi=1.0)
    beta0: float = f(0.4, "initial importance-sampling exponent, annealed to 1", lo=0.0, hi=1.0)
    beta_steps: int = f(20_000, "sampled batches over which beta reaches 1", lo=1)
    min_size: int = f(1000, "items stored before the learner samples", lo=1)
    samples_per_insert: float = f(2.0, "rate limiter: times each stored item is sampled, on average (learner side and worker side both block to hold it)", lo=0.0, lo_open=True, hi=10_000.0)
    error_buffer: float | None = f(None, "rate limiter: sampled items either side may run ahead of the ratio before it blocks (null = one gather of inserts plus one learner block)", lo=0.0, lo_open=True, hi=1e12)


@dataclass
class SequenceConfig:
    """How recurrent algorithms cut each env's episode into overlapping stored sequences.

    Sequence k of an episode covers episode steps [k*period - burn_in, k*period - burn_in + burn_in +
    length + n_step): the burn-in prefix comes first (padded before the episode start), then the
    trained steps, then n_step steps that only supply bootstrap targets.
    """

    burn_in: int = f(8, "steps unrolled without gradient from the stored state before the trained ones", lo=0)
    length: int = f(16, "trained steps per sequence", lo=1)
    period: int = f(8, "steps between the starts of consecutive sequences (length / 2 = 50% overlap)", lo=1)
    chunk_length: int = f(8, "steps per stored chunk: overlapping sequences share their chunks", lo=1)


@dataclass
class QueueConfig:
    capacity: int = f(8, "fragments the trajectory FIFO holds before workers are held back", lo=1)


@dataclass
class LearnerConfig:
    batch_size: int = f(256, "items (transitions or sequences) per gradient update", lo=1)
    batches_per_call: int = f(8, "batches fetched from the replay server per round trip", lo=1, hi=1024)
    publish_interval: int = f(8, "updates between weight publications to the parameter server", lo=1)
    publish_interval_s: float | None = f(0.25, "replay algorithms: also publish once this many seconds passed "
                                         "since the last publication, whatever the updates (null = by updates "
                                         "only); weights are copied out and sent on a thread of their own",
                                         lo=0.0, lo_open=True, hi=WEEK_S)
    threads: int = f(0, "torch threads a learner on the CPU trains with (0 = measured: one, or the cores nothing "
                     "else uses while it trains, whichever updates faster; a deterministic run, eval.interval_steps, "
                     "keeps one)", lo=0, hi=1024)
    cuda_graph: bool = f(True, "a replay learner on a CUDA device runs each update (forward, backward, optimizer "
                         "step) as one recorded CUDA graph (apex_dqn, r2d2, dhc, sac, cql); off: op by op. "
                         "Nothing changes on the CPU")
    fragments_per_update: int = f(0, "on-policy: fragments per update (0 = one per fragment source: each worker, and a "
                                   "simulator server; one in single mode)", lo=0)
    num_gradient_workers: int = f(1, "processes that each compute the gradient of a share of every step's rows "
                                  "for the learner's one optimizer step (1 = the learner alone; sync and async "
                                  "modes; apex_dqn, impala, ppo, bc, and cql on discrete actions)", lo=1, hi=256)


@dataclass
class EvalConfig:
    target_return: float | None = f(None, "mean greedy return that ends the run as solved (null = never)")
    target_success: float | None = f(None, "multi-agent: success rate (all agents on goal) that ends the run as solved (null = never)", lo=0.0, hi=1.0)
    episodes: int = f(20, "greedy episodes per evaluation", lo=1, hi=10_000)
    epsilon: float = f(0.0, "probability of a uniform random action instead of the greedy one at each evaluation "
                            "step (Atari's protocols use 0.05 or 0.001: a greedy agent that never serves stalls a "
                            "game until its time limit); single-agent envs", lo=0.0, hi=1.0)
    interval_s: float = f(1.0, "seconds between evaluations", lo=0.0, hi=WEEK_S)
    interval_steps: int | None = f(None, "evaluate every this many env steps instead, waiting for the result (deterministic runs)", lo=1)
    video_every_s: float | None = f(None, "record one greedy episode of an evaluation at most this often (0 = every evaluation), to "
                                    "RUN_DIR/videos/ (mp4) and TensorBoard (GIF); needs an env with rgb_array "
                                    "rendering (null = never)", lo=0.0, hi=WEEK_S)


@dataclass
class StopConfig:
    max_seconds: float = f(600.0, "wall seconds before the run stops; it has ended 10 s later at most, whatever its roles do (a last evaluation or checkpoint that does not fit is skipped, and summary.json's skipped_at_stop says so)", lo=0.0, lo_open=True, hi=YEAR_S)
    max_env_steps: int | None = f(None, "env steps before the run stops (null = no limit)", lo=1)
    max_updates: int | None = f(None, "learner updates before the run stops (null = no limit)", lo=1)


@dataclass
class AsyncConfig:
    window_s: float = f(0.02, "seconds each async gather waits for ready workers", lo=0.0, hi=WEEK_S)


@dataclass
class FaultConfig:
    max_worker_restarts: int = f(10, "rollout-worker process restarts before the run stops", lo=0)
    max_env_errors: int = f(1000, "env exceptions or non-finite env outputs (each ends its episode and is counted) before the run stops", lo=0)
    max_role_restarts: int = f(10, "restarts of the learner, replay server, parameter server or evaluator (each) before the run stops", lo=0)
    worker_timeout_s: float = f(120.0, "a dead worker not back after this long is dropped from the run (workers_lost); a worker that keeps its heartbeat but delivers no fragment for this long plus role_timeout_s and start_timeout_s (a role it calls may be found hung and restarted meanwhile) is restarted", lo=1.0, hi=WEEK_S)
    role_timeout_s: float = f(5.0, "heartbeats: every role's process (rollout workers, learner, replay, parameter and inference servers, evaluator, gradient workers; single mode's evaluator) answers the driver on a thread of its own about every second, so a long evaluation, checkpoint or env step never counts; one silent this long (stopped, frozen, or on a node Ray has not yet declared lost) is hung: it is ended and restarted, or at a run's stop ended and not waited for", lo=1.0, hi=WEEK_S)
    start_timeout_s: float = f(120.0, "a role not started, or not back after a death or hang, within this long ends the run (a start imports torch: tens of seconds on a loaded machine); also how long a cluster placement waits for room", lo=1.0, hi=WEEK_S)
    max_nonfinite_updates: int = f(100, "updates in a row skipped for a NaN or inf loss or gradient before the run stops", lo=1)


@dataclass
class CheckpointConfig:
    interval_s: float = f(60.0, "seconds between whole-run checkpoints (one is also taken at every stop and on SIGTERM/SIGINT)", lo=0.0, lo_open=True, hi=WEEK_S)
    keep: int = f(3, "newest complete checkpoints kept", lo=1)
    max_replay_bytes: int = f(2_000_000_000, "replay larger than this is left out of checkpoints; a resumed run then refills it from the workers", lo=0)
    at_stop_s: float = f(600.0, "the longest the checkpoint at a run's stop waits for its healthy roles, past the wind-down (a role that hangs meanwhile is ended within fault.role_timeout_s; a second interrupt cuts it short)", lo=0.0, hi=WEEK_S)


# What log.wandb and log.mlflow take: key -> the types its value may have.
TRACKER_KEYS = {
    "wandb": {"project": (str,), "mode": (str,), "entity": (str,), "group": (str,), "name": (str,),
              "tags": (list,)},
    "mlflow": {"tracking_uri": (str,), "experiment": (str,), "run_name": (str,)},
}
WANDB_MODES = ("offline", "online", "disabled")


def _tracker_problem(name: str, settings: dict | None) -> str | None:
    """What is wrong with log.<name>'s settings (a key it does not take, a value of the wrong type), or None."""
    if settings is None:
        return None
    known = TRACKER_KEYS[name]
    for key, value in settings.items():
        if key not in known:
            return f"unknown config key 'log.{name}.{key}' (known: {', '.join(known)})"
        if not isinstance(value, known[key]) or (key == "tags" and not all(isinstance(t, str) for t in value)):
            what = "a list of names" if key == "tags" else "a string"
            return f"config key 'log.{name}.{key}': expected {what}, got {value!r}"
    mode = settings.get("mode") if name == "wandb" else None
    if mode is not None and mode not in WANDB_MODES:
        return f"config key 'log.wandb.mode': must be one of {', '.join(WANDB_MODES)}, got {mode!r}"
    return None


@dataclass
class LogConfig:
    interval_s: float = f(1.0, "seconds between metrics.csv rows and progress updates", lo=0.01, hi=WEEK_S)
    interval_steps: int | None = f(None, "write a row every this many env steps instead (deterministic runs)", lo=1)
    progress: bool = f(True, "print a console progress line while training")
    tensorboard: bool = f(True, "write TensorBoard event files into the run dir")
    trace: bool = f(False, "record what every process does into RUN_DIR/trace.json (distrl timeline / report)")
    trace_events: int = f(200_000, "events each process keeps for the trace (a ring: the newest are kept)", lo=1, hi=10_000_000)
    dataset: str | None = f(None, "write every episode the rollout workers play into this Minari dataset (a "
                            "directory named like name-vN; null = none): the offline literature's replay-buffer dataset")
    wandb: dict | None = f(None, "log to Weights & Biases (pip install -e .[wandb]): {project: distrl, mode: "
                           "offline | online, entity, group, name, tags: [...]}; config, metrics rows, learner "
                           "diagnostics, summary and the best checkpoint (null = off)")
    mlflow: dict | None = f(None, "log to MLflow (pip install -e .[mlflow]): {tracking_uri: file:./mlruns | "
                            "sqlite:///mlflow.db | http://..., experiment: distrl, run_name}; what log.wandb logs "
                            "(null = off)")

    def __post_init__(self):
        problem = _tracker_problem("wandb", self.wandb) or _tracker_problem("mlflow", self.mlflow)
        if problem:
            raise ConfigError(problem)


@dataclass
class DataConfig:
    dataset: str | None = f(None, "train from this Minari dataset (a directory, or an id under MINARI_DATASETS_PATH) "
                            "instead of rollout workers: the replay is filled from it once, the evaluator still plays "
                            "the env (offline algorithms: bc, cql)")


@dataclass
class PlacementConfig:
    """Where the Ray roles run (sync and async modes; single mode starts no Ray and ignores this section).

    Each role's mapping names Ray resources every one of its actors asks for, on top of what it always
    asks (on a cluster: a CPU per worker and for the learner, a GPU for a cuda learner): a custom
    resource a node was started with (`ray start --resources '{"learner_node": 1}'`), CPU, GPU or memory.
    A placement no node of the cluster can meet is refused before any actor starts.
    """

    learner: dict = f({}, "Ray resources the learner asks for, e.g. {GPU: 1} or {learner_node: 1} (ignored in single mode)")
    workers: dict = f({}, "Ray resources each rollout worker asks for, e.g. {worker_node: 1} (ignored in single mode)")
    replay: dict = f({}, "Ray resources the replay server asks for (ignored in single mode)")
    evaluator: dict = f({}, "Ray resources the evaluator asks for (ignored in single mode)")
    parameter_server: dict = f({}, "Ray resources the parameter server asks for (ignored in single mode)")
    gradient_workers: dict = f({}, "Ray resources each gradient worker asks for (ignored in single mode)")
    inference: dict = f({}, "Ray resources the inference server asks for (rollout.inference: central)")
    workers_strategy: str = f("default", "how Ray places the workers: default (Ray's own: fill a node up to half its "
                              "resources, then the next) | spread (Ray's SPREAD: round-robin over the nodes) | "
                              "pack (one placement group bundle each, on as few nodes as hold them)",
                              choices=("default", "spread", "pack"))


TORSOS = ("auto", "mlp", "minatar", "nature", "impala", "conv3x3")
ACTIVATIONS = ("relu", "tanh", "elu", "gelu", "silu")
# The widest layer (and conv channels) a config may ask for: far past any RL network's, short of one whose
# learner (weights, gradients, Adam's moments, a target copy) alone would not fit a machine's memory.
WIDEST, WIDEST_CONV = 8192, 2048


@dataclass
class ModelConfig:
    """The network's torso, from the torso factory (`distrl.models`); the heads are the algorithm's.

    Each algorithm sets its own defaults (an actor-critic's MLP uses tanh, SAC's is 256 wide).
    """

    torso: str = f("auto", "auto (an MLP for vectors, a CNN for images) | mlp | minatar (Young & Tian's CNN, "
                   "10x10 inputs) | nature (the DQN Nature CNN, 84x84) | impala (IMPALA's ResNet) | conv3x3 "
                   "(padded 3x3 convs, for small fields of view) | module:Factory (your own: "
                   "Factory(observation_space, model_cfg) returns an nn.Module with an int out_features)")
    hidden: list = f([64, 64], "layer sizes of the MLP torso ([] = the flattened observation)", item_lo=1,
                     hi=WIDEST, min_items=0)
    activation: str = f("relu", "activation of the MLP torso: relu | tanh | elu | gelu | silu", choices=ACTIVATIONS)
    conv_channels: list = f([32, 32], "the conv3x3 torso's channels, one padded 3x3 conv + ReLU each "
                            "([] = the flattened image)", item_lo=1, hi=WIDEST_CONV, min_items=0)
    features: int | None = f(None, "width of an image torso's last linear layer (null = the architecture's "
                             "own: minatar 128, nature 512, impala 256)", lo=1, hi=WIDEST)
    channels: str = f("auto", "where an image observation keeps its channels: auto | first (C, H, W) | last "
                      "(H, W, C)", choices=("auto", "first", "last"))
    encoders: dict = f({}, "a structured observation's encoder per leaf, by its key (e.g. {screen: nature}): one of the "
                       "image torsos for an image leaf (auto: chosen as for a plain image), flat (its entries, uint8 "
                       "scaled to [0, 1]) or codes (its entries as they are: a symbolic grid's codes, MiniGrid's) "
                       "for any Box leaf")
    kwargs: dict = f({}, "settings for your own torso factory (model.torso: module:Factory reads them)")


@dataclass
class OptionalCoreModelConfig(ModelConfig):
    """A torso, optionally followed by a recurrent core that both heads read (PPO, A2C, A3C, IMPALA)."""

    core: str = f("none", "recurrent core after the torso: none | lstm | gru", choices=("none", "lstm", "gru"))
    core_size: int = f(64, "recurrent state size (with a core)", lo=1, hi=WIDEST)


@dataclass
class RecurrentModelConfig(ModelConfig):
    """A torso followed by a recurrent core (R2D2, DHC)."""

    core: str = f("lstm", "recurrent core: lstm | gru", choices=("lstm", "gru"))
    core_size: int = f(64, "recurrent state size", lo=1, hi=WIDEST)
