import numpy as np
import pytest
import torch
from gymnasium import spaces

from distrl import tree
from distrl.algos.apex_dqn import ApexDQN, QNetwork
from distrl.algos.common import nstep_items
from distrl.algos.qlearning import epsilon_greedy, worker_epsilon
from distrl.config import load_config
from distrl.core import EnvSpec, Trajectory
from distrl.envs import env_spec
from distrl.models.numpy_run import ATOL, RTOL
from distrl.replay import ReplayBuffer
from distrl.roles.factory import make_algorithm
from distrl.roles.learning import update_once
from tests.algos.same_network import check_acts_with_the_learners_network
from tests.replay.stacking import LeafEnv, Runner, make_envs, make_leaf_envs


@pytest.fixture
def algo():
    cfg = load_config(None, ["model.hidden=[8, 8]", "apex_dqn.gamma=0.9", "apex_dqn.n_step=1"])
    return make_algorithm(cfg, env_spec("CartPole-v1"))


def test_per_worker_epsilons_follow_apex():
    cfg = load_config(None).apex_dqn
    eps = [worker_epsilon(cfg, i, 8, 0) for i in range(8)]
    assert eps[0] == pytest.approx(0.4)
    assert eps[-1] == pytest.approx(0.4 ** 8)
    assert eps[3] == pytest.approx(0.4 ** (1 + 7 * 3 / 7))
    assert all(a > b for a, b in zip(eps, eps[1:]))
    # A lone worker decays linearly from eps_start to eps_end; the evaluator is greedy.
    assert worker_epsilon(cfg, 0, 1, 0) == pytest.approx(cfg.eps_start)
    assert worker_epsilon(cfg, 0, 1, cfg.eps_decay_steps // 2) == pytest.approx((cfg.eps_start + cfg.eps_end) / 2)
    assert worker_epsilon(cfg, 0, 1, 10 * cfg.eps_decay_steps) == pytest.approx(cfg.eps_end)
    assert worker_epsilon(cfg, -1, 4, 0) == 0.0


def test_a_lone_workers_policy_decays_its_epsilon_with_the_steps_it_is_told(algo):
    policy, cfg = algo.make_policy(0, 1, 0), algo.cfg
    assert policy.epsilon == pytest.approx(cfg.eps_start)
    policy.observe_steps(cfg.eps_decay_steps // 2)
    assert policy.epsilon == pytest.approx((cfg.eps_start + cfg.eps_end) / 2)
    policy.observe_steps(10 * cfg.eps_decay_steps)
    assert policy.epsilon == pytest.approx(cfg.eps_end)
    assert [algo.make_policy(i, 3, 0).epsilon for i in (-1, 0, 2)] == [0.0, cfg.eps, cfg.eps ** (1 + cfg.eps_alpha)]


def test_epsilon_greedy_is_greedy_without_rng_and_uniform_at_epsilon_one():
    q = np.array([[0.0, 2.0, 1.0], [5.0, -1.0, 0.0]])
    np.testing.assert_array_equal(epsilon_greedy(q, 1.0, None), [1, 0])
    np.testing.assert_array_equal(epsilon_greedy(q, 0.0, np.random.default_rng(0)), [1, 0])
    many = epsilon_greedy(np.zeros((30000, 3)) + [0.0, 1.0, 0.0], 1.0, np.random.default_rng(0))
    np.testing.assert_allclose(np.bincount(many, minlength=3) / len(many), [1 / 3] * 3, atol=0.01)
    half = epsilon_greedy(np.zeros((30000, 3)) + [0.0, 1.0, 0.0], 0.5, np.random.default_rng(1))
    assert (half == 1).mean() == pytest.approx(0.5 + 0.5 / 3, abs=0.01)  # greedy, or a uniform pick of it


def test_double_dqn_target_and_terminal_discount(algo):
    learner = algo.make_learner("cpu")
    # Make online and target nets differ so "double" matters.
    with torch.no_grad():
        for p in learner.target.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    rng = np.random.default_rng(0)
    n = 6
    batch = {"obs": rng.normal(size=(n, 4)).astype(np.float32), "actions": rng.integers(0, 2, n),
             "rewards": rng.normal(size=n).astype(np.float32),
             "next_obs": rng.normal(size=(n, 4)).astype(np.float32),
             "discounts": np.array([0.9, 0.0, 0.9, 0.0, 0.9, 0.9], np.float32),
             "weights": np.ones(n, np.float32)}
    with torch.no_grad():
        q = learner.q(torch.as_tensor(batch["obs"])).numpy()
        qn_online = learner.q(torch.as_tensor(batch["next_obs"])).numpy()
        qn_target = learner.target(torch.as_tensor(batch["next_obs"])).numpy()
    best = qn_online.argmax(1)
    target = batch["rewards"] + batch["discounts"] * qn_target[np.arange(n), best]
    expected = np.abs(q[np.arange(n), batch["actions"]] - target)
    out = update_once(learner, batch)
    np.testing.assert_allclose(out["priorities"], expected, rtol=1e-5, atol=1e-6)
    # Terminal transitions (discount 0) have target = reward exactly.
    np.testing.assert_allclose(target[[1, 3]], batch["rewards"][[1, 3]])
    assert learner.updates == 1 and np.isfinite(out["loss"])


def test_the_policy_acts_with_the_learners_q_network(algo):
    learner = algo.make_learner("cpu")
    with torch.no_grad():  # away from the initial weights: loading them must matter
        for p in learner.q.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    policy = algo.make_policy(0, 2, 0)
    obs = np.random.default_rng(2).normal(size=(5, 4)).astype(np.float32)
    check_acts_with_the_learners_network(policy, learner.q, learner.get_weights(), "forward", obs)
    assert isinstance(policy.net, QNetwork)
    with torch.no_grad():
        q = learner.q(torch.as_tensor(obs)).numpy()
    # Acting runs the network's numpy program: torch's values within float32 rounding.
    np.testing.assert_allclose(policy.forward(obs, None)[0]["q"], q, rtol=RTOL, atol=ATOL)
    evaluator = algo.make_policy(-1, 2, 0)
    evaluator.set_weights(learner.get_weights(), 1)
    actions, extras = evaluator.act(obs, explore=True)  # the evaluator's epsilon is 0
    np.testing.assert_array_equal(actions, q.argmax(1))
    np.testing.assert_allclose(extras["q"], q, rtol=RTOL, atol=ATOL)


def test_worker_priorities_are_abs_td_under_own_q(algo):
    policy = algo.make_policy(0, 2, 0)
    q_net = algo.make_learner("cpu").q  # the reference: the torch network whose weights the worker acts with
    policy.set_weights({k: v.detach().numpy() for k, v in q_net.state_dict().items()}, 0)
    T, E = 3, 2
    rng = np.random.default_rng(1)
    obs = rng.normal(size=(T, E, 4)).astype(np.float32)
    next_obs = rng.normal(size=(T, E, 4)).astype(np.float32)
    terminated = np.array([[False, True], [False, False], [False, False]])
    next_obs[:-1][~terminated[:-1]] = obs[1:][~terminated[:-1]]  # as a rollout records them: no episode ended
    actions, extras = policy.act(obs.reshape(T * E, 4), explore=False)
    traj = Trajectory(obs, actions.reshape(T, E), rng.normal(size=(T, E)).astype(np.float32),
                      terminated, np.zeros((T, E), bool), next_obs, {"q": extras["q"].reshape(T, E, 2)})
    evaluated = []
    evaluate = policy.evaluate
    policy.evaluate = lambda rows: evaluated.append(len(rows)) or evaluate(rows)
    items, prios = policy.postprocess(traj)
    # The network ran again only where acting had not: env 1's terminal step and the last step of each env.
    assert evaluated == [1 + E]
    with torch.no_grad():
        q_next = q_net(torch.as_tensor(next_obs.reshape(T * E, 4))).numpy().max(1)
    q_taken = extras["q"][np.arange(T * E), actions]
    disc = np.full(T * E, 0.9, np.float32)
    disc[1] = 0.0  # env 1 terminated at t=0
    expected = np.abs(traj.rewards.reshape(-1) + disc * q_next - q_taken)
    np.testing.assert_allclose(prios, expected, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(items["discounts"], disc)


def test_uint8_frames_are_stored_as_bytes_and_learned_from():
    """Image observations stay uint8 from the worker through replay to the learner, whose torso scales them."""
    spec = EnvSpec(spaces.Box(0, 255, (2, 10, 10), np.uint8), spaces.Discrete(3))
    algo = make_algorithm(load_config(None, ["model.features=16", "apex_dqn.n_step=1"]), spec)
    learner = algo.make_learner("cpu")
    policy = algo.make_policy(0, 1, 0)
    policy.set_weights(learner.get_weights(), 0)
    rng = np.random.default_rng(0)
    T, E = 2, 3
    obs = rng.integers(0, 256, (T, E, 2, 10, 10), dtype=np.uint8)
    actions, extras = policy.act(obs.reshape(T * E, 2, 10, 10), explore=True)
    traj = Trajectory(obs, actions.reshape(T, E), np.ones((T, E), np.float32), np.zeros((T, E), bool),
                      np.zeros((T, E), bool), obs[::-1].copy(), {"q": extras["q"].reshape(T, E, 3)})
    items, prios = policy.postprocess(traj)
    assert items["obs"].dtype == items["next_obs"].dtype == np.uint8
    with torch.no_grad():  # the network sees frames / 255
        np.testing.assert_array_equal(extras["q"], learner.q(torch.as_tensor(obs.reshape(T * E, 2, 10, 10))).numpy())
    out = update_once(learner, {**items, "weights": np.ones(len(prios), np.float32)})
    assert np.isfinite(out["loss"]) and out["priorities"].shape == prios.shape


@pytest.mark.parametrize("padding", ["reset", "zero"])
def test_frames_stored_once_sample_the_stacks_the_env_emitted(padding):
    """A FrameStackObservation env through the real postprocess into replay: every sampled obs and n-step
    next_obs stack equals, bit for bit, the one the plain (stacks per item) postprocess stores, across
    episode starts, truncated episodes' final observations and eviction; priorities agree too."""
    box, k = spaces.Box(0, 255, (4, 10, 10), np.uint8), 4
    cfg = load_config(None, ["model.features=16", "apex_dqn.n_step=3", "apex_dqn.gamma=0.9"])
    framed, plain = (make_algorithm(cfg, EnvSpec(box, spaces.Discrete(2), frame_stack=s)) for s in (k, 0))
    weights = framed.make_learner("cpu").get_weights()
    policy, reference = framed.make_policy(0, 1, 0), plain.make_policy(0, 1, 0)
    for p in (policy, reference):
        p.set_weights(weights, 0)
    runner, buf, naive, learner = Runner(make_envs(3, k, padding, (10, 10), seed=2), 2), ReplayBuffer(150), {}, \
        framed.make_learner("cpu")
    for i in range(14):
        traj = runner.rollout([1, 4, 9][i % 3], act=lambda o: policy.act(o, explore=True))
        items, prios = policy.postprocess(traj)
        want, want_prios = reference.postprocess(traj)
        T, E = traj.rewards.shape
        order = np.arange(T * E).reshape(T, E).T.ravel()  # framed items come env by env
        np.testing.assert_allclose(prios, want_prios[order], rtol=RTOL, atol=ATOL)
        uid = len(naive) + np.arange(T * E)
        naive.update({int(u): {n: want[n][j] for n in ("obs", "next_obs", "rewards", "discounts")}
                      for u, j in zip(uid, order)})
        assert items["frames"].dtype == np.uint8 and items["frames"].nbytes < want["obs"].nbytes + want["next_obs"].nbytes
        buf.add({**items, "uid": uid}, prios)
        batch, idx, w = buf.sample_many(1, 32)
        for n in ("obs", "next_obs", "rewards", "discounts"):
            assert np.array_equal(batch[n][0], np.stack([naive[int(u)][n] for u in batch["uid"][0]])), n
        out = update_once(learner, {**{n: v[0] for n, v in batch.items()}, "weights": w[0]})
        buf.update_priorities(idx[0], out["priorities"], batch["_generation"][0])


def test_image_leaves_of_a_dict_observation_are_stored_once_and_reach_the_learner_as_uint8():
    """A Dict observation with image leaves (one inside a Tuple) through the real postprocess into replay: the
    images travel as frames, once each, and every sampled obs and n-step next obs equals the per-step
    transition (`nstep_items`, what replay stores without frames) across episode ends and eviction; the
    learner trains on the uint8 images."""
    space = LeafEnv().observation_space
    algo = make_algorithm(load_config(None, ["model.features=16", "model.hidden=[16]", "apex_dqn.n_step=3",
                                             "apex_dqn.gamma=0.9"]), EnvSpec(space, spaces.Discrete(2)))
    learner, policy = algo.make_learner("cpu"), algo.make_policy(0, 1, 0)
    policy.set_weights(learner.get_weights(), 0)
    runner, buf, naive = Runner(make_leaf_envs(3, seed=4), 4), ReplayBuffer(120, seed=4), {}
    for i in range(16):
        traj = runner.rollout([1, 4, 9][i % 3], act=lambda o: policy.act(o, explore=True))
        items, prios = policy.postprocess(traj)
        want, boot = nstep_items(traj, 0.9, 3)
        T, E = traj.rewards.shape
        order = np.arange(T * E).reshape(T, E).T.ravel()  # framed items come env by env
        assert {"frames/obs.image", "frames/obs.views#0", "obs.direction", "next_obs.views#1"} <= set(items)
        # a frame per step, plus each env's first observation and one after each episode end
        starts = E + int((traj.terminated | traj.truncated)[:-1].sum())
        assert items["frames/obs.image"].dtype == np.uint8 and len(items["frames/obs.image"]) <= T * E + starts
        uid = len(naive) + np.arange(T * E)
        naive.update({int(u): {n: tree.index(want[n], j) for n in ("obs", "next_obs", "rewards", "discounts")}
                      for u, j in zip(uid, order)})
        buf.add({**items, "uid": uid}, prios)
        batch, idx, w = buf.sample(32)
        for n in ("obs", "next_obs", "rewards", "discounts"):
            expected = tree.stack([naive[int(u)][n] for u in batch["uid"]])
            assert tree.structure_text(batch[n]) == tree.structure_text(expected)
            for got, exp in zip(tree.leaves(batch[n]), tree.leaves(expected)):
                assert got.dtype == exp.dtype and np.array_equal(got, exp), n
        assert batch["obs"]["image"].dtype == batch["next_obs"]["views"][0].dtype == np.uint8
        out = update_once(learner, {**{k: v for k, v in batch.items() if k != "uid"}, "weights": w})
        assert np.isfinite(out["loss"])
        buf.update_priorities(idx, out["priorities"], batch["_generation"])


def test_rejects_continuous_actions():
    assert "Discrete" in ApexDQN.check_spec(env_spec("Pendulum-v1"))
    assert ApexDQN.check_spec(env_spec("CartPole-v1")) is None


def test_learner_state_round_trip(algo):
    a, b = algo.make_learner("cpu"), algo.make_learner("cpu")
    batch = {"obs": np.zeros((4, 4), np.float32), "actions": np.zeros(4, np.int64),
             "rewards": np.ones(4, np.float32), "next_obs": np.zeros((4, 4), np.float32),
             "discounts": np.zeros(4, np.float32)}
    update_once(a, batch)
    b.load_state_dict(a.state_dict())
    assert b.updates == 1
    for k, v in a.get_weights().items():
        np.testing.assert_array_equal(v, b.get_weights()[k])
