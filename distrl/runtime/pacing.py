"""The run-mode decisions about data: what one gather inserts, how far the rate limiter lets either
side run ahead, how many fragments an on-policy update takes and how often weights are published,
and the experience store and learner loop they shape."""
from __future__ import annotations

from dataclasses import dataclass

from distrl.config import Config
from distrl.config.sections import ReplayConfig
from distrl.registry import algorithm, on_policy
from distrl.replay.rate_limiter import RateLimiter
from distrl.replay.store import Take, make_store
from distrl.roles.experience import ExperienceServer
from distrl.roles.learning import LearnerLoop


def sequence_length(sequence, n_step: int) -> int:
    """Steps of a stored sequence (`sequence` section): burn-in, trained steps, then n-step bootstrap steps."""
    return sequence.burn_in + sequence.length + n_step


def items_per_gather(cfg: Config) -> int:
    """Items one gather is expected to insert: every worker's fragment in sync mode, about one otherwise."""
    frag = cfg.rollout.fragment_length * cfg.env.num_envs
    if algorithm(cfg.algo).data_path == "sequence":
        frag = -(-frag // cfg.sequence.period)
    return frag * (cfg.workers if cfg.mode == "sync" else 1)


def error_buffer(cfg: Config) -> float:
    """The rate limiter's buffer: the config's, or one gather of inserts plus one learner block."""
    if cfg.replay.error_buffer is not None:
        return cfg.replay.error_buffer
    lc = cfg.learner
    return cfg.replay.samples_per_insert * items_per_gather(cfg) + lc.batch_size * lc.batches_per_call


def make_rate_limiter(cfg: Config, inserts: int = 0, samples: int = 0, exact: bool = False) -> RateLimiter:
    """The run's limiter at these counts; `exact` drops the buffer (for ending a run on the ratio)."""
    r = cfg.replay
    return RateLimiter(r.samples_per_insert, r.min_size, 0.0 if exact else error_buffer(cfg), inserts, samples)


def fragments_per_update(cfg: Config) -> int:
    """On-policy batch size in fragments: one per worker unless the config says otherwise."""
    if algorithm(cfg.algo).data_path == "gradients":
        return 1  # each gradient message is applied on its own
    if cfg.learner.fragments_per_update:
        return cfg.learner.fragments_per_update
    return 1 if cfg.mode == "single" else cfg.workers


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
                          Take(lc.batch_size, lc.batches_per_call, fragments_per_update(cfg)))


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


def learner_loop(learner, algo: str, publish_interval: int, io) -> LearnerLoop:
    """The learner's loop for algorithm `algo`: on-policy data must come from the newest weights, so those
    algorithms publish after every update and never prefetch; replay algorithms publish every
    `publish_interval` (learner.publish_interval) updates."""
    if on_policy(algo):
        return LearnerLoop(learner, io, publish_interval=1, prefetch=False)
    return LearnerLoop(learner, io, publish_interval, prefetch=True)
