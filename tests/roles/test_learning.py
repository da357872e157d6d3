"""The learner loop: when it publishes, that poisoned weights never leave it, and its state and RNG
round trip. A real learner from a shipped config, its replay filled by a real rollout, in one process."""
import copy
import os

import numpy as np
import pytest
import torch

from distrl.config import load_config
from distrl.roles.factory import make_algorithm, make_rollout, policy_seed
from distrl.core import TrainStats
from distrl.roles.learning import LearnerLoop, LocalIO, learn_block
from distrl.runtime.pacing import experience_spec, learner_loop, make_experience

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "..", "configs")
APEX = ["learner.batch_size=32", "learner.batches_per_call=2", "learner.publish_interval=3", "learner.publish_interval_s=null"]


class RecordingIO(LocalIO):
    """Single mode's IO, keeping every publication and counting priority writes."""

    def __init__(self, experience, policy):
        super().__init__(experience, policy)
        self.sent: list[tuple[int, dict]] = []
        self.restored: list[bool] = []
        self.priority_writes = 0

    def publish(self, version, weights, restored=False):
        self.sent.append((version, weights))
        self.restored.append(restored)
        super().publish(version, weights, restored)

    def write_priorities(self, *args):
        self.priority_writes += 1
        super().write_priorities(*args)

    def versions(self) -> list[int]:
        return [v for v, _ in self.sent]


def wired(config: str, overrides: list[str], fragments: int) -> LearnerLoop:
    """A learner loop as single mode builds it, its first weights published, `fragments` sampled into its store."""
    cfg = load_config(os.path.join(CONFIGS, config), ["workers=1", *overrides])
    algo = make_algorithm(cfg)
    policy = algo.make_policy(0, 1, policy_seed(cfg.seed, 0))
    experience = make_experience(experience_spec(cfg))
    loop = learner_loop(algo.make_learner("cpu"), cfg.algo, cfg.learner, RecordingIO(experience, policy))
    loop.publish()
    rollout = make_rollout(cfg, policy, cfg.seed, 0)
    for _ in range(fragments):
        frag = rollout.sample()
        experience.add(frag.data, frag.priorities)
    return loop


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_a_replay_learner_publishes_every_publish_interval_and_at_the_end():
    loop = wired("apex_dqn_cartpole.yaml", APEX, 1)
    stats = loop.train(10)
    # Blocks of 2 updates; publish once 3 or more updates are unpublished (after 4 and 8), and the last.
    assert loop.io.versions() == [0, 4, 8, 10]
    assert (stats.updates, stats.version, loop.learner.updates, loop.io.policy.version) == (10, 10, 10, 10)
    assert loop.io.priority_writes == 5  # one per block: prioritized replay hears back every update
    assert_same_weights(loop.io.sent[-1][1], loop.learner.get_weights())
    first, later = loop.io.sent[1][1], loop.io.sent[-1][1]
    assert any(not np.array_equal(first[k], later[k]) for k in first)  # snapshots, not live views


def test_an_on_policy_learner_publishes_after_every_update_whatever_the_interval():
    loop = wired("ppo_cartpole.yaml", ["learner.publish_interval=100"], 3)
    stats = loop.train(5)
    assert loop.io.versions() == [0, 1, 2, 3]  # each fragment trained on by the weights that came before it
    assert stats.updates == 3 and stats.starved  # only 3 fragments to train on
    assert_same_weights(loop.io.sent[-1][1], loop.learner.get_weights())
    stats = loop.train(1)
    assert stats.starved and stats.updates == 0 and loop.io.versions() == [0, 1, 2, 3]  # nothing new to send


def test_weights_with_a_nan_are_never_published_nor_checkpointed():
    loop = wired("apex_dqn_cartpole.yaml", APEX, 1)
    loop.train(2)
    sent = loop.io.versions()
    with torch.no_grad():
        next(loop.learner.q.parameters())[0, 0] = float("nan")
    assert loop.publish() == 2 and loop.poisoned
    assert loop.get_state() is None
    stats = loop.train(2)
    assert stats.poisoned and stats.version == 2 and stats.nonfinite == 2 and stats.updates == 0
    assert loop.io.versions() == sent == [0, 2]
    assert all(np.isfinite(w).all() for _, weights in loop.io.sent for w in weights.values())
    assert np.isfinite(loop.io.policy.forward(np.zeros((1, 4), np.float32), None)[0]["q"]).all()


@pytest.mark.parametrize("config", ["apex_dqn_cartpole.yaml", "sac_pendulum.yaml"])
def test_a_nonfinite_update_inside_a_block_is_skipped_on_the_device_and_uncounted_when_read_back(config):
    """Updates hand back tensors (no wait for the device per update): the one whose reward is NaN takes no
    step (weights and optimizer state unchanged by it), and once the block is read the learner's count, the
    stats and the priorities (a NaN row) say so."""
    loop = wired(config, [*APEX, "learner.batches_per_call=3"], 2)
    learner = loop.learner
    block = loop.io.experience.next_block(3)
    batches, indices, weights = block
    batches = {k: v.copy() for k, v in batches.items()}
    batches["rewards"][1, 0] = np.nan
    outs = [learner.update({k: v[0] for k, v in batches.items()} | ({"weights": weights[0]} if weights is not None else {}))]
    assert all(torch.is_tensor(v) for v in outs[0].values())  # nothing read back yet
    before = copy.deepcopy(learner.state_dict())
    middle = {k: v[1] for k, v in batches.items()} | ({"weights": weights[1]} if weights is not None else {})
    learner.update(middle)
    after = learner.state_dict()
    for name in ("q", "actor", "critic"):
        if name in before:
            for key in before[name]:
                assert torch.equal(before[name][key], after[name][key]), (name, key)
    opt_before, opt_after = before["opt"]["state"], after["opt"]["state"]
    for i in opt_before:
        for key in opt_before[i]:
            assert torch.equal(torch.as_tensor(opt_before[i][key]), torch.as_tensor(opt_after[i][key])), (i, key)
    assert learner.updates == 2  # counted until read back

    fresh = wired(config, [*APEX, "learner.batches_per_call=3"], 0)
    stats = TrainStats()
    priorities = learn_block(fresh.learner, ({k: v for k, v in batches.items()}, indices, weights), stats)
    assert (stats.consumed, stats.updates, stats.nonfinite, fresh.learner.updates) == (3, 2, 1, 2)
    if priorities is not None:
        assert np.isnan(priorities[1]).all() and np.isfinite(priorities[[0, 2]]).all()


def test_state_and_torch_rng_round_trip_and_training_continues_identically():
    a = wired("apex_dqn_cartpole.yaml", APEX, 1)
    a.train(4)
    state = a.get_state()
    weights_at_save = a.learner.get_weights()
    store = copy.deepcopy(a.io.experience.store.state_dict())
    draw = torch.rand(3)  # what the RNG gives next from the saved state
    a.train(4)

    b = wired("apex_dqn_cartpole.yaml", [*APEX, "seed=5"], 0)  # other initial weights, empty replay
    assert b.set_state(state) == 4
    assert torch.equal(torch.rand(3), draw)
    assert b.io.versions() == [0, 4]
    assert_same_weights(b.io.sent[-1][1], weights_at_save)
    b.io.experience.load(store)
    b.train(4)
    assert b.io.versions()[-1] == 8
    assert_same_weights(b.learner.get_weights(), a.learner.get_weights())
    assert_same_weights(b.learner.state_dict()["target"], a.learner.state_dict()["target"])


def test_a_learner_restored_to_an_older_state_publishes_it_over_the_newer_weights():
    """A restarted learner goes back to a checkpoint: its weights must replace those of the lost updates."""
    loop = wired("apex_dqn_cartpole.yaml", APEX, 1)
    loop.train(4)
    state, weights_at_save = loop.get_state(), loop.learner.get_weights()
    loop.train(4)
    assert loop.set_state(state) == 4
    assert loop.io.versions() == [0, 4, 8, 4] and loop.io.restored == [False, False, False, True]
    assert_same_weights(loop.io.sent[-1][1], weights_at_save)
    assert loop.io.policy.version == 4


NORMALIZE = ["env.id=Pendulum-v1", "env.num_envs=2", "rollout.fragment_length=8", "env.normalize.obs=true",
             "env.normalize.reward=true"]


def test_normalization_statistics_are_merged_published_with_the_weights_and_resumed_exactly():
    from distrl.envs.normalize import RunningStats

    a = wired("ppo_cartpole.yaml", NORMALIZE, 0)
    cfg = load_config(os.path.join(CONFIGS, "ppo_cartpole.yaml"), ["workers=1", *NORMALIZE])
    rollout = make_rollout(cfg, a.io.policy, cfg.seed, 0)
    rows = []
    for _ in range(3):
        frag = rollout.sample()
        a.io.experience.add(frag.data, frag.priorities)
        a.add_statistics(frag.info.statistics)
        rows.append(frag.info.statistics)
    a.train(3)
    sent = a.io.sent[-1][1]
    assert {"normalize.obs.count", "normalize.ret.count"} <= set(sent)
    assert sent["normalize.obs.count"][0] == 3 * 8 * 2 + 2  # every step of both envs, and their first resets
    assert a.io.policy.statistics.keys() == {k for k in sent if k.startswith("normalize.")}
    state = a.get_state()

    b = wired("ppo_cartpole.yaml", NORMALIZE, 0)  # a resumed learner: its statistics come from the checkpoint
    b.set_state(state)
    assert_same_weights(b.io.sent[-1][1], {k: v for k, v in sent.items()})
    more = rollout.sample().info.statistics
    for loop in (a, b):
        loop.add_statistics(more)
    got = b.statistics.parts["obs"]
    want = RunningStats()
    for part in [*rows, more]:
        want.merge(part["obs"])
    assert got.count == want.count and np.allclose(got.mean, want.mean) and np.allclose(got.m2, want.m2)
    assert_same_weights(a.statistics.arrays(), b.statistics.arrays())
