"""The run-mode decisions about data (distrl/runtime/pacing.py): what a gather inserts, the rate limiter's
buffer, what an update takes, and the store and learner loop they shape. No Ray: plain functions of a config."""
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from distrl.config import load_config
from distrl.replay import ReplayBuffer
from distrl.replay.fifo import FragmentQueue
from distrl.replay.rate_limiter import RateLimiter
from distrl.replay.sequence_replay import SequenceReplay
from distrl.roles.factory import make_algorithm
from distrl.roles.learning import LocalIO
from distrl.runtime.pacing import experience_spec, learner_loop, make_experience, pacing, sequence_length

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def config(name: str, *overrides: str):
    return load_config(os.path.join(ROOT, "configs", name), list(overrides))


def experience(name: str, *overrides: str):
    return make_experience(experience_spec(config(name, *overrides)))


def test_the_default_buffer_is_one_gather_of_inserts_plus_one_learner_block_and_deadlock_free():
    cfg = config("apex_dqn_cartpole.yaml", "mode=sync", "workers=3")
    assert pacing(cfg).items_per_gather == 3 * 16 * 16
    e = pacing(cfg).error_buffer
    assert e == 16 * 3 * 256 + 512 * 8
    assert RateLimiter.deadlock_free(16, e, cfg.learner.batch_size)
    assert pacing(cfg).rate_limiter(exact=True).error_buffer == 0.0
    assert pacing(config("apex_dqn_cartpole.yaml", "replay.error_buffer=123")).error_buffer == 123


@pytest.mark.parametrize("mode", ["single", "async"])
def test_one_fragment_per_gather_outside_sync(mode):
    cfg = config("sac_lunarlander_continuous.yaml", f"mode={mode}")
    assert pacing(cfg).items_per_gather == cfg.rollout.fragment_length * cfg.env.num_envs


def test_a_sequence_gather_counts_sequences_and_a_sequence_is_burn_in_trained_and_bootstrap_steps():
    cfg = config("r2d2_repeat_previous.yaml", "mode=sync", "workers=2", "rollout.fragment_length=20",
                 "env.num_envs=3", "sequence.period=8", "sequence.burn_in=4", "sequence.length=10", "r2d2.n_step=5")
    assert pacing(cfg).items_per_gather == 2 * -(-20 * 3 // 8)  # one sequence starts every `period` steps, rounded up
    assert sequence_length(cfg.sequence, cfg.algo_config.n_step) == 4 + 10 + 5


def test_a_limiter_resumes_from_its_counts():
    cfg = config("apex_dqn_cartpole.yaml")
    lim = pacing(cfg).rate_limiter(inserts=5000, samples=700)
    assert (lim.inserts, lim.samples, lim.min_size) == (5000, 700, cfg.replay.min_size)
    assert lim.samples_per_insert == cfg.replay.samples_per_insert and lim.error_buffer == pacing(cfg).error_buffer


@pytest.mark.parametrize("name, overrides, fragments", [
    ("ppo_cartpole.yaml", ["mode=sync", "workers=3"], 3),     # one per worker
    ("ppo_cartpole.yaml", ["mode=single", "workers=3"], 1),   # single mode runs one worker
    ("ppo_cartpole.yaml", ["mode=sync", "learner.fragments_per_update=5"], 5),
    ("a3c_cartpole.yaml", ["mode=async", "workers=3", "learner.fragments_per_update=5"], 1),  # a gradient each
])
def test_an_on_policy_update_takes_a_fragment_per_worker_unless_told(name, overrides, fragments):
    assert pacing(config(name, *overrides)).fragments_per_update == fragments


def test_each_data_path_gets_its_store_sized_by_its_sections():
    replay = experience("apex_dqn_cartpole.yaml", "replay.capacity=1234", "learner.batch_size=32")
    assert type(replay.store) is ReplayBuffer and replay.store.capacity == 1234
    assert (replay.take.batch_size, replay.take.batches_per_call) == (32, 8)
    r2d2 = config("r2d2_repeat_previous.yaml")
    seq = make_experience(experience_spec(r2d2))
    assert type(seq.store) is SequenceReplay and seq.store.sequence_length == sequence_length(r2d2.sequence, r2d2.algo_config.n_step)
    fifo = experience("ppo_cartpole.yaml", "mode=sync", "workers=2", "queue.capacity=3")
    assert type(fifo.store) is FragmentQueue and fifo.store.capacity == 3 and fifo.take.fragments == 2


def test_an_on_policy_update_takes_whole_fragments_from_the_fifo():
    fifo = experience("ppo_cartpole.yaml", "mode=sync", "workers=2")
    assert fifo.next_block(8) is None  # nothing until every worker's fragment is in
    for i in range(2):
        fifo.add({"obs": np.full((4, 3, 1), i, np.float32)}, None)
    batches, indices, weights = fifo.next_block(8)
    assert batches["obs"].shape == (1, 4, 6, 1) and indices is None and weights is None  # one update, envs side by side
    assert len(fifo) == 0


@pytest.mark.parametrize("name", ["apex_dqn_cartpole.yaml", "r2d2_repeat_previous.yaml", "ppo_cartpole.yaml"])
def test_a_store_is_built_from_its_spec_without_torch(name):
    """The replay server's process builds its store from the spec alone: torch (1.2 s and ~190 MB a process)
    is never imported there."""
    code = ("import pickle, sys; from distrl.runtime.pacing import make_experience; "
            "e = make_experience(pickle.loads(sys.stdin.buffer.read())); "
            "print(type(e.store).__name__, 'torch' in sys.modules)")
    spec = experience_spec(config(name))
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(spec), capture_output=True, check=True)
    assert out.stdout.decode().split() == [type(make_experience(spec).store).__name__, "False"]


@pytest.mark.parametrize("name, publish_interval, prefetch", [
    ("apex_dqn_cartpole.yaml", 8, True), ("r2d2_repeat_previous.yaml", None, True),
    ("ppo_cartpole.yaml", 1, False), ("a3c_cartpole.yaml", 1, False), ("impala_cartpole.yaml", 1, False)])
def test_on_policy_learners_publish_every_update_and_never_prefetch(name, publish_interval, prefetch):
    cfg = config(name)
    loop = learner_loop(make_algorithm(cfg).make_learner("cpu"), cfg.algo, cfg.learner, LocalIO(None, None))
    assert loop.publish_interval == (publish_interval or cfg.learner.publish_interval)
    assert loop.prefetch is prefetch
