"""The run-mode decisions about data: what one gather inserts, how far the rate limiter lets either
side run ahead, how many fragments an on-policy update takes and how often weights are published,
and the experience store and learner loop they shape."""
from __future__ import annotations

from dataclasses import dataclass

from distrl.config import Config
from distrl.config.sections import ExternalConfig, LearnerConfig, ReplayConfig
from distrl.registry import algorithm, on_policy
from distrl.replay.rate_limiter import RateLimiter
from distrl.replay.store import Take, make_store
from distrl.roles.experience import ExperienceServer
from distrl.roles.learning import LearnerLoop
from distrl.threads import ThreadChoice, learner_threads, usable_cpus


def sequence_length(sequence, n_step: int) -> int:
    """Steps of a stored sequence (`sequence` section): burn-in, trained steps, then n-step bootstrap steps."""
    return sequence.burn_in + sequence.length + n_step


@dataclass(frozen=True)
class Pacing:
    """The run-mode decisions about data, made once from the config by `pacing(cfg)`: the driver, its
    rows and the pre-run checks read them here."""

    items_per_gather: int  # items one gather is expected to insert: every worker's fragment in sync mode
    fragments_per_update: int  # on-policy batch size in fragments
    samples_per_insert: float | None  # replay.samples_per_insert (None without a replay)
    min_size: int | None  # replay.min_size (None without a replay)
    error_buffer: float | None  # the rate limiter's buffer (None without a replay)

    def rate_limiter(self, inserts: int = 0, samples: int = 0, exact: bool = False) -> RateLimiter:
        """The run's limiter at these counts; `exact` drops the buffer (for ending a run on the ratio)."""
        buffer = 0.0 if exact else self.error_buffer
        return RateLimiter(self.samples_per_insert, self.min_size, buffer, inserts, samples)


def pacing(cfg: Config) -> Pacing:
    """The run's pacing. A gather inserts every worker's fragment in sync mode and about one otherwise (in
    sequences for sequence replay); the limiter's buffer is the config's, or one gather of inserts plus one
    learner block; an on-policy update takes one fragment per worker unless the config says otherwise (a
    gradient message is applied on its own)."""
    path, lc = algorithm(cfg.algo).data_path, cfg.learner
    gather = cfg.rollout.fragment_length * cfg.env.num_envs
    if path == "sequence":
        gather = -(-gather // cfg.sequence.period)
    sources = fragment_sources(cfg.workers, cfg.external)
    gather *= sources if cfg.mode == "sync" else 1
    if path == "gradients":
        fragments = 1
    else:
        fragments = lc.fragments_per_update or (1 if cfg.mode == "single" else sources)
    r = cfg.replay if path in ("replay", "sequence") else None
    if r is None:
        return Pacing(gather, fragments, None, None, None)
    buffer = r.error_buffer if r.error_buffer is not None else \
        r.samples_per_insert * gather + lc.batch_size * lc.batches_per_call
    return Pacing(gather, fragments, r.samples_per_insert, r.min_size, buffer)


def fragment_sources(workers: int, ext: ExternalConfig) -> int:
    """What sends fragments in the Ray modes: the `workers` rollout workers, a simulator server in their
    stead, or both (external.with_workers)."""
    return (workers if ext.with_workers or not ext.enabled else 0) + int(ext.enabled)


@dataclass(frozen=True)
class ExperienceSpec:
    """What a run's experience store is built from: the parts of its config the store reads (a replay
    server builds it from this alone, without the algorithm's module and so without torch)."""

    data_path: str  # "replay", "sequence", "trajectory" or "gradients"
    replay: ReplayConfig | None  # the replay's settings (replay and sequence data paths)
    queue_capacity: int  # fragments the FIFO holds (on-policy data paths)
    sequence_length: int  # steps per stored sequence (sequence data path)
    seed: int  # the replay's sampling seed
    take: Take  # what the learner takes per request


def experience_spec(cfg: Config) -> ExperienceSpec:
    path = algorithm(cfg.algo).data_path
    replayed = path in ("replay", "sequence")
    lc = cfg.learner
    return ExperienceSpec(path, cfg.replay if replayed else None, 0 if replayed else cfg.queue.capacity,
                          sequence_length(cfg.sequence, cfg.algo_config.n_step) if path == "sequence" else 0, cfg.seed,
                          Take(lc.batch_size, lc.batches_per_call, pacing(cfg).fragments_per_update))


def make_experience(spec: ExperienceSpec, offline: Config | None = None) -> ExperienceServer:
    """The run's experience store, and what its learner takes from it per request; an offline run's
    (`offline`: its config) holds its dataset from the start (a restarted replay server reads it again)."""
    store = make_store(spec.data_path, spec.replay, spec.queue_capacity, spec.sequence_length, spec.seed)
    experience = ExperienceServer(store, spec.take)
    if offline is not None and offline.data.dataset:
        from distrl.data.datasets import read_dataset
        from distrl.roles.factory import make_algorithm

        experience.add(make_algorithm(offline).dataset_items(read_dataset(offline.data.dataset)), None)
    return experience


def learner_loop(learner, algo: str, lc: LearnerConfig, io, continuous: bool = False,
                 threads: ThreadChoice | None = None) -> LearnerLoop:
    """The learner's loop for algorithm `algo` (`lc`: the learner section): on-policy data must come from the
    newest weights, so those algorithms publish after every update and never prefetch; replay algorithms
    publish every learner.publish_interval updates or learner.publish_interval_s seconds. `continuous`:
    the driver does not wait on its calls (async mode). `threads`: how many torch threads it trains with."""
    if on_policy(algo):
        return LearnerLoop(learner, io, publish_interval=1, prefetch=False, threads=threads)
    return LearnerLoop(learner, io, lc.publish_interval, prefetch=True, publish_interval_s=lc.publish_interval_s,
                       continuous=continuous, threads=threads)


def thread_choice(device: str, threads: int, mode: str, workers: int, deterministic: bool) -> ThreadChoice:
    """The learner's torch threads on this machine (`distrl.threads.learner_threads`; `threads`:
    learner.threads, `deterministic`: evaluations by env steps); one on a GPU."""
    if not device.startswith("cpu"):
        return ThreadChoice(1)
    return learner_threads(threads, mode, workers, usable_cpus(), deterministic)
