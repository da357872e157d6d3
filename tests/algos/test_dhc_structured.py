"""DHC on structured observations with action masks: per-agent Dict observations through the multi-input torso;
exploration among the legal actions, greedy acting masked, targets over the next state's legal actions (its
mask stored with it in sequence replay); a masked team trained through Ray actors and central inference never
takes a masked action, in training, evaluation or `distrl eval`; and DHC learns a small Dict-observation task."""
import json
import os

import numpy as np
import pytest
import torch
from gymnasium import spaces

from distrl import train
from distrl.algos.dhc import DHC
from distrl.api import evaluate
from distrl.config import load_config
from distrl.core import EnvSpec
from distrl.envs.multiagent_vector import MultiAgentVectorEnv
from distrl.envs.testing import TeamEnv
from distrl.models.multi_input import MultiInputTorso
from distrl.roles.factory import make_algorithm
from distrl.roles.learning import update_once
from distrl.roles.rollout import Rollout
from distrl.sampling import MASKED
from tests.algos.same_network import check_acts_with_the_learners_network
from tests.algos.test_dhc import make_batch, make_cfg, perturbed_learner, random_masks, reference_td
from tests.run_files import episode_returns

MASKED_AGENTS = "distrl.envs.testing:MaskedAgents"  # a random half of 6 actions legal per agent and step
QUIET = ["log.progress=false", "log.tensorboard=false"]
A = 5  # actions of the synthetic spec
DICT = EnvSpec(spaces.Dict({"x": spaces.Box(-1.0, 1.0, (3,), np.float32), "kind": spaces.Discrete(4),
                            "action_mask": spaces.MultiBinary(A)}), spaces.Discrete(A))


def with_agents(spec, agents):
    return EnvSpec(spec.observation_space, spec.action_space, agents)


def dict_obs(rng, shape, agents, active=None):
    """Observations of DICT (..., N, ...): legal actions a random subset with at least one, all of them for an
    agent out of the episode (as the adapter gives), its observation zero."""
    mask = (rng.random((*shape, agents, A)) < 0.4).astype(np.int8)
    mask[..., 0][~mask.any(-1)] = 1
    obs = {"x": rng.uniform(-1, 1, (*shape, agents, 3)).astype(np.float32),
           "kind": rng.integers(0, 4, (*shape, agents)), "action_mask": mask}
    if active is not None:
        obs = {"x": obs["x"] * active[..., None], "kind": obs["kind"] * active,
               "action_mask": np.where(active[..., None], mask, 1).astype(np.int8)}
    return obs


def joint(rng, shape, agents):
    comm_mask, active = random_masks(rng, shape, agents)
    return {"obs": dict_obs(rng, shape, agents, active), "comm_mask": comm_mask, "active": active}


# ------------------------------------------------------------------ what DHC takes


def test_dhc_takes_dict_and_tuple_observations_through_the_multi_input_torso_and_refuses_factored_actions():
    assert DHC.check_spec(DICT) is None
    pair = spaces.Tuple((spaces.Box(-1, 1, (2,)), spaces.Discrete(3)))
    assert DHC.check_spec(EnvSpec(pair, spaces.Discrete(2))) is None
    net = make_algorithm(make_cfg(), with_agents(DICT, 3)).build_network()
    assert isinstance(net.torso, MultiInputTorso)
    problem = DHC.check_spec(EnvSpec(DICT.observation_space, spaces.MultiDiscrete([3, 3])))
    assert problem == "dhc takes Discrete actions; MultiDiscrete([3 3]) actions are for a2c, a3c, ppo and impala"
    assert DHC.check_spec(EnvSpec(DICT.observation_space, spaces.Box(-1, 1, (2,)))).startswith(
        "dhc needs a Discrete action space")


# ------------------------------------------------------------------ acting


def test_the_policy_steps_the_learners_network_on_a_dict_observation():
    algo = make_algorithm(make_cfg(), with_agents(DICT, 3))
    learner = perturbed_learner(algo)
    rng = np.random.default_rng(1)
    obs = joint(rng, (4,), 3)
    state = rng.normal(size=(4, 3, 1, 16)).astype(np.float32)
    policy = algo.make_policy(0, 1, 0)
    check_acts_with_the_learners_network(policy, learner.q, learner.get_weights(), "step", obs, state)


def test_exploration_is_among_the_legal_actions_and_greedy_acting_picks_the_best_legal_one():
    algo = make_algorithm(make_cfg(), with_agents(DICT, 3))
    weights = perturbed_learner(algo).get_weights()
    explorer, greedy = algo.make_policy(0, 1, 0), algo.make_policy(-1, 1, 0)  # a lone worker at step 0: epsilon 1
    for p in (explorer, greedy):
        p.set_weights(weights, 0)
    assert explorer.epsilon == 1.0 and greedy.epsilon == 0.0
    rng = np.random.default_rng(2)
    seen, first_picks, pairs = set(), 0, 0
    for _ in range(40):
        obs = joint(rng, (16,), 3)
        mask = obs["obs"]["action_mask"]
        actions, extras = explorer.act(obs, explore=True)
        assert np.take_along_axis(mask, actions[..., None], -1).all()  # every one legal
        two = mask.sum(-1) == 2  # rows of two legal actions: each taken half the time
        first_picks, pairs = first_picks + (actions[two] == mask.argmax(-1)[two]).sum(), pairs + two.sum()
        seen |= set(actions.ravel().tolist())
        q = extras["q"]
        assert np.all(q[mask == 0] == MASKED) and np.all(q[mask == 1] > MASKED / 2)
        best, extras = greedy.act(obs, explore=False)
        np.testing.assert_array_equal(best, np.where(mask == 1, extras["q"], -np.inf).argmax(-1))
    assert seen == set(range(A)) and pairs > 300 and abs(first_picks / pairs - 0.5) < 0.1, (first_picks, pairs)


# ------------------------------------------------------------------ the learner


@torch.no_grad()
def stepped(net, batch, obs):
    """Q (L, B, N, A) from `net.step` in a Python loop from the stored state (zeroed where `first`)."""
    state, qs = torch.as_tensor(batch["state"]), []
    for t in range(len(batch["mask"])):
        state = state * torch.as_tensor(~batch["first"][t], dtype=torch.float32)[:, None, None, None]
        step = {"obs": {k: torch.as_tensor(v[t]) for k, v in obs.items()},
                "comm_mask": torch.as_tensor(batch["comm_mask"][t]), "active": torch.as_tensor(batch["active"][t])}
        q, state = net.step(step, state)
        qs.append(q.numpy())
    return np.stack(qs)


@pytest.mark.parametrize("double", [False, True])
def test_targets_take_the_best_of_the_next_steps_legal_actions_from_replays_columns(double):
    """The learner takes the columns sequence replay sends (`obs.x`, `obs.kind`, `obs.action_mask`) and
    bootstraps from the best legal action (double: the online network's best legal one), as a step-by-step
    reference with masked Q-values does; padding (no action legal) neither trains nor bootstraps."""
    learner = perturbed_learner(make_algorithm(make_cfg(2, 4, 2, f"dhc.double={double}"), with_agents(DICT, 3)))
    with torch.no_grad():
        for p in learner.target.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    rng = np.random.default_rng(3)
    batch = make_batch(rng, 8, 5, 3, first_at=[None, 2, 1, None, 0], obs_shape=(3,), end=4)
    batch["actions"] = batch["actions"] % A
    obs = dict_obs(rng, (8, 5), 3, batch["active"])
    obs["action_mask"][np.arange(8)[:, None, None], np.arange(5)[:, None], np.arange(3), batch["actions"]] = 1
    obs["action_mask"] *= (batch["valid"] > 0)[..., None, None].astype(np.int8)  # replay's padding: zeros
    q, qt = stepped(learner.q, batch, obs), stepped(learner.target, batch, obs)
    legal = obs["action_mask"] == 1
    assert np.all(q[~legal] == MASKED) and np.all(qt[legal] > MASKED / 2)
    best = np.where(legal, q if double else qt, -np.inf).argmax(-1)[..., None]
    values = np.take_along_axis(qt, best, -1)[..., 0] * (batch["valid"] > 0)[..., None]
    every = dict(obs, action_mask=np.ones_like(obs["action_mask"]))  # the same Q-values, none masked
    q_all, qt_all = stepped(learner.q, batch, every), stepped(learner.target, batch, every)
    np.testing.assert_array_equal(np.where(legal, q_all, MASKED), q)
    unmasked = np.take_along_axis(qt_all, (q_all if double else qt_all).argmax(-1)[..., None], -1)[..., 0]
    stored = (batch["valid"] > 0)[..., None] & batch["active"]
    assert (values[stored] != unmasked[stored]).mean() > 0.2  # the masks matter to the targets
    expected_td, live = reference_td(q, values, batch, learner.cfg.gamma)
    columns = {**{k: v for k, v in batch.items() if k != "obs"}, **{f"obs.{k}": v for k, v in obs.items()}}
    out = update_once(learner, columns)
    assert np.isfinite(out["loss"]) and abs(out["q_mean"]) < 100.0  # no MASKED value in a trained pair's Q
    from distrl.algos.dhc_acting import agent_priorities

    np.testing.assert_allclose(out["priorities"], agent_priorities(np.abs(expected_td), live, 0.9), atol=3e-5)


def test_a_batch_without_an_active_agent_encodes_no_row():
    """Every stored step of every item has its agents out (a team that left at once): each row is the
    encoder's output for a zero observation, with no empty batch through the multi-input torso."""
    net = make_algorithm(make_cfg(), with_agents(DICT, 3)).build_network()
    obs = {k: torch.as_tensor(v) for k, v in dict_obs(np.random.default_rng(0), (4, 2), 3).items()}
    with torch.no_grad():
        out = net.features(obs, torch.zeros(4, 2, 3, dtype=torch.bool))
        blank = net.encode({k: torch.zeros_like(v[0, 0, :1]) for k, v in obs.items()})  # one zero observation's
    assert out.shape == (4, 6, 16)
    torch.testing.assert_close(out, blank.expand(4, 6, 16), rtol=0, atol=0)


def test_a_rollouts_masks_reach_replay_with_their_observations_and_priorities_match_the_learner():
    """A worker's fragments of MaskedAgents (a Dict of `observation` and `action_mask`; episodes truncated every
    6 steps, so a final observation's legal actions bound its bootstrap) -> the adder's columns -> sequence
    replay -> the learner, whose priorities with the worker's network as online and target are the worker's."""
    from distrl.replay.sequence_replay import SequenceReplay

    kwargs = {"num_agents": 3, "length": 6, "sizes": [3, 5]}
    cfg = load_config(None, ["algo=dhc", f"env.id={MASKED_AGENTS}", f"env.kwargs={kwargs}", "sequence.burn_in=3",
                             "sequence.length=4", "dhc.n_step=2", "sequence.period=2", "sequence.chunk_length=4",
                             "model.hidden=[8]", "model.core_size=16"])
    algo = make_algorithm(cfg)
    learner = perturbed_learner(algo)
    learner.target.load_state_dict(learner.q.state_dict())
    policy = algo.make_policy(0, 1, 7)  # epsilon 1: random legal actions
    policy.set_weights(learner.get_weights(), 0)
    rollout = Rollout(policy, MultiAgentVectorEnv(MASKED_AGENTS, 4, 0, kwargs), 10, 0)
    replay, worker = SequenceReplay(10_000, 3 + 4 + 2, prioritized=False), []
    for _ in range(4):
        frag = rollout.sample()
        chunks = {k for k in frag.data if k.startswith("chunk/obs")}  # the leaves as columns of their own
        assert chunks == {"chunk/obs.observation", "chunk/obs.action_mask"}, sorted(frag.data)
        assert frag.data["chunk/obs.action_mask"].dtype == np.int8
        replay.add(frag.data, frag.priorities)
        worker.append(frag.priorities)
    assert len(replay) == sum(map(len, worker)) > 10
    batches, idx, weights = replay.sample_many(1, 64)
    batch = {k: v[0] for k, v in batches.items()} | {"weights": weights[0]}
    stored = batch["valid"] == 1
    masks = batch["obs.action_mask"]
    assert masks.shape[-2:] == (3, 6) and (masks[stored].sum(-1) == 3).all() and not masks[~stored].any()
    # the mask of each stored step is its own: legal actions taken, and the rewards never a masked action's -100
    trained = (batch["mask"] == 1)[..., None] & batch["active"]
    assert np.take_along_axis(masks, batch["actions"][..., None], -1)[..., 0][trained].all()
    assert (batch["rewards"][trained] == 1.0).all()
    out = update_once(learner, batch)
    np.testing.assert_allclose(out["priorities"], np.concatenate(worker)[idx[0]], rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------ through Ray: never a masked action

LENGTH = 20  # MaskedAgents' episode: a team that never acts masked returns exactly this per agent (-100 else)


@pytest.fixture(scope="module")
def masked_run(ray_session, tmp_path_factory):
    """Async mode, two workers acting through the central inference server (Ape-X epsilons 0.9 and 0.43: most
    actions explore), three agents with Dict observations of two sizes (padded), sequence replay on the
    learner's side; 6,000 env steps."""
    run_dir = str(tmp_path_factory.mktemp("dhc_masked") / "run")
    summary = train(None, run_dir=run_dir, overrides=[
        "algo=dhc", "mode=async", "workers=2", "rollout.inference=central", "seed=3",
        f"env.id={MASKED_AGENTS}", "env.kwargs={num_agents: 3, sizes: [3, 5]}", "env.num_envs=8",
        "rollout.fragment_length=16", "model.hidden=[16]", "model.core_size=16", "replay.min_size=32",
        "learner.batch_size=16", "dhc.eps=0.9", "sequence.burn_in=4", "sequence.length=8", "sequence.period=4",
        "sequence.chunk_length=8", "eval.episodes=8", "eval.interval_s=0.3", "stop.max_env_steps=6000",
        "stop.max_seconds=90", "fault.max_env_errors=0", *QUIET])
    return summary, run_dir


def test_a_masked_team_through_ray_actors_never_takes_a_masked_action_in_training_or_evaluation(masked_run):
    summary, run_dir = masked_run
    assert summary["env_steps"] >= 6000 and summary["env_errors"] == 0 and summary["failure"] is None, summary
    assert summary["updates"] >= 20 and summary["evaluations"] >= 1, summary
    train_returns, eval_returns = map(set, episode_returns(run_dir))
    # A mean of LENGTH: no episode ended on a masked action (that one returns at most -81 for its agent).
    assert train_returns == {LENGTH} and eval_returns == {LENGTH}, (train_returns, eval_returns)


def test_the_learners_targets_never_bootstrap_from_a_masked_action(masked_run):
    _, run_dir = masked_run
    with open(os.path.join(run_dir, "learner.jsonl")) as fh:
        stats = [json.loads(line) for line in fh]
    # Returns of at most 20 steps of reward 1: a masked action's value (-1e9) in a target or Q would show.
    assert stats and all(abs(s["q_mean"]) < 25.0 and s["td_abs_mean"] < 25.0 for s in stats), stats


def test_distrl_eval_plays_the_best_checkpoint_masked(masked_run):
    _, run_dir = masked_run
    assert evaluate(run_dir, episodes=4)["returns"] == [LENGTH] * 4


# ------------------------------------------------------------------ learning on a Dict observation


class CueMatch(TeamEnv):
    """Each agent's Dict observation: a cue (Discrete(4)), noise (a Box) and an action mask allowing the cue and
    each other action with probability 1/2, new every step. The cued action earns 1, another legal one 0, a
    masked one -10. Over 8 steps a team that reads the cue returns 8 per agent; acting uniformly among the
    legal actions, about 3.6; ignoring the mask, negative."""

    metadata = {"name": "cue_match_v0", "is_parallelizable": True}
    N = 4

    def __init__(self, num_agents: int = 2, length: int = 8):
        super().__init__(num_agents, length)

    def observation_space(self, agent):
        return spaces.Dict({"cue": spaces.Discrete(self.N), "noise": spaces.Box(-1, 1, (2,), np.float32),
                            "action_mask": spaces.MultiBinary(self.N)})

    def action_space(self, agent):
        return spaces.Discrete(self.N)

    def _observe(self):
        obs, self.cues, self.masks = {}, {}, {}
        for a in self.agents:
            cue, mask = int(self.np_random.integers(self.N)), (self.np_random.random(self.N) < 0.5).astype(np.int8)
            mask[cue] = 1
            self.cues[a], self.masks[a] = cue, mask
            obs[a] = {"cue": cue, "noise": self.np_random.uniform(-1, 1, 2).astype(np.float32),
                      "action_mask": mask.copy()}
        return obs

    def reset(self, seed=None, options=None):
        self._start(seed)
        return self._observe(), {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        rewards = {a: (float(int(actions[a]) == self.cues[a]) if self.masks[a][int(actions[a])] else -10.0)
                   for a in self.agents}
        over = self.t >= self.length
        obs = self._observe()
        term, trunc = {a: False for a in self.agents}, {a: over for a in self.agents}
        if over:
            self.agents = []
        return obs, rewards, term, trunc, {a: {} for a in obs}


def test_dhc_learns_to_act_on_a_dict_observations_cue(tmp_path):
    """Greedy mean return >= 7 of 8 (random legal actions: ~3.6). Seeds 0-2 reach it in 6.8k, 6.3k and 5.4k
    env steps (~10 s each on 2 cores): the budget is over 4x the slowest."""
    summary = train(None, run_dir=str(tmp_path / "run"), overrides=[
        "algo=dhc", "mode=single", "seed=0", f"env.id={__name__}:CueMatch", "env.kwargs={num_agents: 2}",
        "env.num_envs=8", "rollout.fragment_length=16", "model.hidden=[32]", "model.core_size=32",
        "replay.min_size=64", "learner.batch_size=32", "sequence.burn_in=2", "sequence.length=8",
        "sequence.period=4", "sequence.chunk_length=8", "dhc.gamma=0.5", "dhc.eps_decay_steps=2000",
        "dhc.target_update_interval=50", "eval.episodes=20", "eval.interval_s=1", "eval.target_return=7.0",
        "stop.max_env_steps=30000", "stop.max_seconds=120", *QUIET])
    assert summary["solved"] and summary["best_eval_return"] >= 7.0, summary
