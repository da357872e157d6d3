"""MultiDiscrete and MultiBinary actions for the policy-gradient family: the factored categorical (torch and
numpy), its acting rule as plain data, PPO learning with it, and the refusal of the others."""
import math
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from distrl import train
from distrl.algos.actor_critic import Categorical, FactoredCategorical, action_factors
from distrl.config import load_config
from distrl.core import EnvSpec
from distrl.envs import VectorEnv
from distrl.roles.factory import make_algorithm
from distrl.roles.learning import update_once
from distrl.roles.rollout import Rollout
from distrl.sampling import Factors, categorical_act, factor_index, factored_act, rule_from_wire

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
MASKED = -1e9  # what a network sets an illegal action's logit to


class CopyFactors(gym.Env):
    """Each step shows one target value per factor of a MultiDiscrete action (one-hot codes, concatenated);
    the reward is the share of factors the action copies. Episodes of `length` steps."""

    def __init__(self, nvec=(3, 4, 2), start=(1, 0, -1), length: int = 8):
        self.action_space = gym.spaces.MultiDiscrete(list(nvec), start=list(start))
        self.observation_space = gym.spaces.Box(0.0, 1.0, (int(sum(nvec)),), np.float32)
        self.nvec, self.start, self.length = np.asarray(nvec), np.asarray(start), length

    def _show(self):
        self.target = self.start + self.np_random.integers(0, self.nvec)
        obs = np.zeros(self.observation_space.shape, np.float32)
        obs[np.cumsum(self.nvec) - self.nvec + self.target - self.start] = 1.0
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._show(), {}

    def step(self, action):
        space = self.action_space
        if not (isinstance(action, np.ndarray) and action.dtype == space.dtype and action.shape == space.shape
                and space.contains(action)):
            raise TypeError(f"not an action of {space}: {action!r}")
        reward = float(np.mean(action == self.target))
        self.t += 1
        return self._show(), reward, self.t >= self.length, False, {}


class CopyBits(CopyFactors):
    """CopyFactors with a MultiBinary action: the observation is the bits to copy."""

    def __init__(self, bits: int = 6, length: int = 8):
        super().__init__((2,) * bits, (0,) * bits, length)
        self.action_space = gym.spaces.MultiBinary(bits)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (bits,), np.float32)

    def _show(self):
        self.target = self.np_random.integers(0, 2, len(self.nvec)).astype(np.int8)
        return self.target.astype(np.float32)


def random_logits(rng, rows, nvec, masked=0.0):
    logits = rng.normal(size=(rows, int(np.sum(nvec)))).astype(np.float32) * 2
    logits[rng.random(logits.shape) < masked] = MASKED
    return logits


def reference(logits, nvec):
    """torch.distributions' categoricals, one per factor."""
    parts = torch.as_tensor(logits).split(list(nvec), dim=-1)
    return [torch.distributions.Categorical(logits=p) for p in parts]


# --- the distributions ------------------------------------------------------------
@pytest.mark.parametrize("nvec", [(3, 4, 2), (2, 2, 2, 2, 2), (5,), (1, 3)])
def test_factored_log_prob_and_entropy_are_sums_over_factors(nvec):
    rng = np.random.default_rng(0)
    logits = random_logits(rng, 16, nvec)
    actions = np.stack([rng.integers(0, n, 16) for n in nvec], axis=1)
    start = np.arange(len(nvec)) - 1  # stored actions count from each factor's start
    dist = FactoredCategorical(torch.as_tensor(logits), torch.as_tensor(factor_index(nvec)), torch.as_tensor(start))
    ref = reference(logits, nvec)
    expected_logp = sum(d.log_prob(torch.as_tensor(actions[:, i])) for i, d in enumerate(ref))
    torch.testing.assert_close(dist.log_prob(torch.as_tensor(actions + start)), expected_logp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dist.entropy(), sum(d.entropy() for d in ref), rtol=1e-5, atol=1e-5)


def test_factored_log_prob_of_actions_shaped_like_the_space():
    nvec = np.array([[2, 3], [4, 2]])
    logits = torch.as_tensor(random_logits(np.random.default_rng(1), 5, nvec))
    flat = np.array([[1, 2, 3, 0]] * 5)
    dist = FactoredCategorical(logits, torch.as_tensor(factor_index(nvec)), torch.zeros(4, dtype=torch.long))
    torch.testing.assert_close(dist.log_prob(torch.as_tensor(flat.reshape(5, 2, 2), dtype=torch.int8)),
                               dist.log_prob(torch.as_tensor(flat)))


@pytest.mark.parametrize("mask", [MASKED, -math.inf])
def test_masked_logits_have_probability_zero_and_finite_entropy_and_gradients(mask):
    nvec = (3, 4, 2)
    logits = torch.tensor([[0.5, mask, 1.0, mask, mask, 0.2, 0.1, mask, 0.3],
                           [mask, mask, 2.0, 0.0, 0.0, 0.0, 0.0, 0.7, mask]], requires_grad=True)
    dist = FactoredCategorical(logits, torch.as_tensor(factor_index(nvec)), torch.zeros(3, dtype=torch.long))
    p = dist.logp_all.exp()
    assert (p[0, 0, 1] == 0) and (p[0, 1, :2] == 0).all() and p[1, 0, 2] == 1 and p[1, 2, 1] == 0
    ent = dist.entropy()
    legal = [torch.distributions.Categorical(logits=torch.tensor(row)) for row in
             ([0.5, 1.0], [0.2, 0.1], [0.3], [2.0], [0.0] * 4, [0.7])]
    torch.testing.assert_close(ent, torch.stack([sum(d.entropy() for d in legal[:3]), sum(d.entropy() for d in legal[3:])]))
    logp = dist.log_prob(torch.tensor([[0, 2, 1], [2, 1, 0]]))
    assert torch.isfinite(logp).all() and torch.isfinite(ent).all()
    (logp.sum() - ent.sum()).backward()
    assert torch.isfinite(logits.grad).all()

    flat = torch.tensor([[0.5, mask, 1.0], [mask, mask, 2.0]], requires_grad=True)
    cat = Categorical(flat)
    assert cat.logp_all.exp()[0, 1] == 0 and cat.entropy()[1] == 0 and torch.isfinite(cat.entropy()).all()
    (cat.log_prob(torch.tensor([0, 2])).sum() - cat.entropy().sum()).backward()
    assert torch.isfinite(flat.grad).all()


@pytest.mark.parametrize("mask", [MASKED, -math.inf])
def test_numpy_sampling_never_takes_a_masked_action(mask):
    rng = np.random.default_rng(2)
    nvec = (3, 4, 2)
    logits = np.tile(np.array([[mask, 0.0, mask, 0.0, 0.0, mask, mask, mask, 1.0]], np.float32), (5000, 1))
    a, logp = factored_act(logits, factor_index(nvec), rng)
    assert set(a[:, 0]) == {1} and set(a[:, 1]) == {0, 1} and set(a[:, 2]) == {1}
    np.testing.assert_allclose(logp, np.log(0.5), rtol=1e-6)
    b, logp = categorical_act(logits[:, :3], rng)
    assert set(b) == {1} and np.isfinite(logp).all()

    class ZeroFirst:  # a uniform of exactly 0 (inverse CDF's edge) and the largest one below 1
        def __init__(self, u):
            self.u = u

        def random(self, shape):
            return np.full(shape, self.u)
    for u in (0.0, np.nextafter(1.0, 0.0)):
        a, _ = factored_act(logits[:1], factor_index(nvec), ZeroFirst(u))
        assert a[0, 0] == 1 and a[0, 2] == 1 and a[0, 1] in (0, 1)
        assert categorical_act(logits[:1, :3], ZeroFirst(u))[0][0] == 1


def test_numpy_samples_follow_each_factors_probabilities():
    nvec = (3, 2)
    probs = [np.array([0.2, 0.5, 0.3]), np.array([0.9, 0.1])]
    logits = np.tile(np.log(np.concatenate(probs))[None].astype(np.float32), (40000, 1))
    a, logp = factored_act(logits, factor_index(nvec), np.random.default_rng(3))
    for f, p in enumerate(probs):
        np.testing.assert_allclose(np.bincount(a[:, f], minlength=len(p)) / len(a), p, atol=0.01)
    np.testing.assert_allclose(logp, np.log(probs[0][a[:, 0]] * probs[1][a[:, 1]]), rtol=1e-5)
    greedy, _ = factored_act(logits[:2], factor_index(nvec), None)
    np.testing.assert_array_equal(greedy, [[1, 0], [1, 0]])


@pytest.mark.parametrize("masked", [0.0, 0.3])
def test_numpy_rule_and_torch_distribution_agree_on_log_probs(masked):
    nvec, start = (3, 4, 2, 5), (1, 0, -1, 0)
    factors = Factors(nvec, start, (4,), np.int64)
    rng = np.random.default_rng(4)
    logits = random_logits(rng, 64, nvec, masked)
    logits[:, [0, 3, 7, 9]] = 0.0  # a legal choice in every factor
    dist = FactoredCategorical(torch.as_tensor(logits), torch.as_tensor(factors.index), torch.as_tensor(factors.start))
    for explore in (True, False):
        a, logp = factored_act(logits, factors.index, rng if explore else None)
        env_a = factors.to_env(a)
        assert env_a.dtype == np.int64 and ((env_a - start) == a).all()
        np.testing.assert_allclose(logp, dist.log_prob(torch.as_tensor(env_a)).numpy(), rtol=1e-5, atol=1e-4)
    assert (logits[np.arange(64)[:, None], factors.index[np.arange(4), a]] > MASKED).all()


# --- the acting rule ----------------------------------------------------------------
@pytest.mark.parametrize("space", [gym.spaces.MultiDiscrete([3, 4, 2], start=[1, 0, -1]), gym.spaces.MultiBinary(5),
                                   gym.spaces.MultiDiscrete([[2, 3], [4, 2]]), gym.spaces.MultiBinary([2, 3])])
def test_the_rule_as_data_acts_as_the_rule_in_the_spaces_dtype_and_shape(space):
    factors = action_factors(space)
    rule = rule_from_wire({"kind": "factored_categorical", "factors": factors.to_wire()})
    back = rule_from_wire(rule.to_wire())
    logits = random_logits(np.random.default_rng(5), 7, factors.nvec)
    out = {"out": logits, "value": np.zeros(7, np.float32)}
    for explore in (True, False):
        a, extras = rule.act(out, np.random.default_rng(0), explore)
        b, extras_back = back.act(out, np.random.default_rng(0), explore)
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(extras["logp"], extras_back["logp"])
        assert a.dtype == space.dtype and a.shape == (7, *space.shape) and all(space.contains(x) for x in a)
        assert set(extras) == {"logp", "value"}


@pytest.mark.parametrize("factors", [{"nvec": [2, 0], "start": [0, 0], "shape": [2], "dtype": "int64"},
                                     {"nvec": [2, 2], "start": [0, 0], "shape": [3], "dtype": "int64"},
                                     {"nvec": [2], "start": [0], "shape": [1], "dtype": "float32"},
                                     {"nvec": [2]}])
def test_factors_no_rule_wrote_are_refused(factors):
    with pytest.raises(ValueError):
        rule_from_wire({"kind": "factored_categorical", "factors": factors})


# --- the algorithms -------------------------------------------------------------------
SPACES = {"multi_discrete": CopyFactors, "multi_binary": CopyBits}


@pytest.mark.parametrize("name", ["a2c", "a3c", "ppo", "impala"])
@pytest.mark.parametrize("kind", list(SPACES))
def test_one_update_on_a_real_rollout(name, kind):
    env = f"{__name__}:{SPACES[kind].__name__}"
    spec = EnvSpec(SPACES[kind]().observation_space, SPACES[kind]().action_space)
    algo = make_algorithm(load_config(None, [f"algo={name}", "model.hidden=[16]"]), spec)
    assert algo.check_spec(spec) is None
    learner = algo.make_learner("cpu")
    policy = algo.make_policy(0, 1, 0)
    policy.set_weights(learner.get_weights(), 0)
    envs = VectorEnv(env, 4, 0)
    frag = Rollout(policy, envs, 8, 0).sample()
    assert envs.env_errors == 0  # every action in the env's dtype and shape
    if name != "a3c":
        assert frag.data["actions"].shape == (8, 4, *spec.action_space.shape)
        assert frag.data["actions"].dtype == spec.action_space.dtype
    before = learner.get_weights()
    out = update_once(learner, frag.data)
    assert learner.updates == 1 and all(math.isfinite(out[k]) for k in ("loss", "entropy"))
    assert any(not np.array_equal(before[k], v) for k, v in learner.get_weights().items())


def test_ppo_learns_multi_discrete_and_multi_binary_actions(tmp_path):
    # Random actions earn ~2.9 (MultiDiscrete) and 4 (MultiBinary) of 8 per episode; seeds 0-3 pass 7.5 in
    # 1.3k-2.6k env steps (under a second each, after the start); the budget leaves ~5x margin.
    for kind, env in SPACES.items():
        summary = train(None, run_dir=str(tmp_path / kind), overrides=[
            "algo=ppo", "mode=single", "seed=0", f"env.id={__name__}:{env.__name__}", "env.num_envs=8",
            "rollout.fragment_length=16", "model.hidden=[32]", "ppo.lr=0.003", "ppo.gamma=0.5", "ppo.epochs=4",
            "ppo.minibatches=2", "ppo.ent_coef=0.0", "eval.target_return=7.5", "eval.episodes=16",
            "eval.interval_s=0.2", "stop.max_env_steps=12000", "stop.max_seconds=60", "log.progress=false",
            "log.tensorboard=false", "fault.max_env_errors=0"])
        assert summary["solved"] and summary["best_eval_return"] >= 7.5, (kind, summary)
        assert summary["env_errors"] == 0


@pytest.mark.parametrize("algo, env, message", [
    ("apex_dqn", "CopyFactors", ("apex_dqn takes Discrete actions; MultiDiscrete([3 4 2], start=[ 1 0 -1]) actions "
                                 "are for a2c, a3c, ppo and impala")),
    ("sac", "CopyBits", "sac takes Box actions; MultiBinary(6) actions are for a2c, a3c, ppo and impala")])
def test_train_refuses_factored_actions_for_the_others_in_one_line_exit_2(capsys, tmp_path, algo, env, message):
    import distrl.cli

    distrl.cli.START = time.time()  # the command's start, as the console script's import sets it
    run_dir, config = tmp_path / "run", CONFIGS / ("apex_dqn_cartpole.yaml" if algo == "apex_dqn" else "sac_pendulum.yaml")
    code = distrl.cli.main(["train", str(config), "--mode", "single", "--set", f"env.id={__name__}:{env}", "--run-dir", str(run_dir)])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().splitlines() == [f"distrl: error: config key 'algo': {message} ({__name__}:{env})"]
    assert not run_dir.exists()
