"""A recurrent policy served to simulators (`distrl.roles.external_server`, `distrl.client`): the client acts as
the run's own policy does, step for step, in remote and in local inference, and the learner, unrolling the
server's fragments from the states stored with them, gets the log-probabilities the steps were acted with,
also where long episodes were cut into several columns."""
import threading
import time

import numpy as np
import pytest
import torch

from distrl.algos.actor_critic import estimates, time_major
from distrl.client import Client, wire
from distrl.config import load_config
from distrl.envs.vector import VectorEnv
from distrl.models import load_numpy_weights
from distrl.roles.factory import make_algorithm
from tests.roles.test_external_server import OBS, TOKEN, Raw, make_server

CORE = ["model.core=gru", "model.core_size=8", "model.hidden=[16]", "rollout.recurrence=4"]
E = 3  # episodes open at once


def state_dependent(core=CORE):
    """(learner, weights) of a PPO policy whose actions turn on its state: random weights, scaled up."""
    cfg = load_config(None, ["algo=ppo", "env.id=CartPole-v1", "external.enabled=true", "env.num_envs=2",
                             "rollout.fragment_length=8", *core])
    learner = make_algorithm(cfg).make_learner("cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        for p in learner.net.parameters():
            p.add_(torch.randn_like(p))
    return cfg, learner, learner.get_weights()


def play_beside(client: Client, policy, episodes: int) -> int:
    """Step E CartPoles with `policy` (a worker's, its own state per env) and ask `client` for the same
    observations' actions, until `episodes` ended: each step's actions must be the same, and in local
    inference the state each episode acts from too. The steps taken."""
    envs = VectorEnv("CartPole-v1", E, 0)
    policy.episodes_ended(np.ones(E, bool))
    open_ = [client.start_episode() for _ in range(E)]
    steps = ended = 0
    while ended < episodes:
        obs = envs.obs.copy()
        if client.inference == "local" and client.actor is not None:
            mine = [client.episodes[e].state for e in open_]
            want = np.stack([np.zeros((1, 8), np.float32) if s is None else s for s in mine])
        actions, extras = policy.act(obs, explore=True)
        assert client.get_actions(open_, obs) == list(actions), steps
        if client.inference == "local" and steps:
            np.testing.assert_allclose(want, extras["state"], atol=1e-5)
        next_obs, rewards, terminated, truncated, _ = envs.step(actions)
        done = terminated | truncated
        for i, episode in enumerate(open_):
            client.log_returns(episode, float(rewards[i]))
            if done[i]:
                client.end_episode(episode, next_obs[i], truncated=bool(truncated[i] and not terminated[i]))
                open_[i] = client.start_episode()
        policy.episodes_ended(done)
        steps, ended = steps + E, ended + done.sum()
    return steps


@pytest.mark.parametrize("inference", ["remote", "local"])
def test_a_client_acts_as_the_runs_policy_and_the_learner_unrolls_its_cut_episodes_as_they_were_acted(inference):
    cfg, learner, weights = state_dependent()
    server = make_server(overrides=CORE, weights=weights)
    frags, done = [], threading.Event()
    taker = threading.Thread(target=lambda: [frags.append(server.take(0.05).data) for _ in iter(done.is_set, True)])
    taker.start()  # as the driver takes them: a server whose fragments wait stops reading its clients
    try:
        policy = make_algorithm(cfg).make_policy(0, cfg.external.max_clients, seed=0)
        policy.set_weights(weights, 7)
        policy.rng = np.random.default_rng(5)
        server.slot_policy(0).rng = np.random.default_rng(5)  # remote inference explores with its slot's RNG,
        client = Client(f"127.0.0.1:{server.port}", TOKEN, inference=inference, seed=5,  # local with the client's
                        send_steps=4)  # a few steps a message: the episodes' steps arrive interleaved
        steps = play_beside(client, policy, episodes=12)
        client.close()
        time.sleep(0.3)
    finally:
        done.set()
        taker.join()
        server.close()
    frags = [f for f in frags if f is not None]
    assert 16 * len(frags) >= steps - 3 * 16 and len(frags) >= 5  # all but what waits for a full fragment
    load_numpy_weights(learner.net, weights)
    starts, inside = 0, 0
    for data in frags:
        assert data["state"].shape == (1, 2, 1, 8)  # one state per column
        est = estimates(learner.net, time_major(data, "cpu"), 4)
        np.testing.assert_allclose(est.logp.numpy(), data["logp"], atol=2e-5)
        starts += int((data["state"][0] != 0).any(axis=(1, 2)).sum())  # columns starting inside an episode
        inside += int((data["terminated"][:-1] | data["truncated"][:-1]).sum())  # episodes starting inside a column
    assert starts >= 3 and inside >= 3


def test_local_experience_of_a_recurrent_policy_carries_each_steps_state_or_is_refused():
    _, _, weights = state_dependent()
    server = make_server(overrides=CORE, weights=weights)
    try:
        old = Raw(server.port)
        old.ask({"type": "hello", "protocol": 1, "token": TOKEN, "inference": "local"})
        reply = old.ask({"type": "get_weights", "version": -1})
        assert reply["error"] == "unavailable" and "protocol 2" in reply["message"]
        raw = Raw(server.port, "msgpack")
        assert raw.hello(inference="local")["protocol"] == wire.PROTOCOL
        reply = raw.ask({"type": "get_weights", "version": -1})
        assert reply["state"] == [1, 8] and reply["rule"] == {"kind": "categorical"}
        seg = {"episode": "e", "start": True, "obs": [OBS, OBS], "actions": [1, 0], "rewards": [1.0, 1.0],
               "versions": [7, 7], "extras": {"logp": [-0.7, -0.7], "value": [0.5, 0.5]}}
        reply = raw.ask({"type": "experience", "episodes": [seg]})
        assert reply["error"] == "bad_value" and "recurrent" in reply["message"] and "(1, 8)" in reply["message"]
        for bad in (np.zeros((2, 8)), np.zeros((1, 1, 8)), np.full((2, 1, 8), np.nan)):
            seg["extras"]["state"] = wire.pack_array(bad.astype(np.float32), "msgpack")
            assert raw.ask({"type": "experience", "episodes": [seg]})["error"] == "bad_value"
        seg["extras"]["state"] = wire.pack_array(np.zeros((2, 1, 8), np.float32), "msgpack")
        assert raw.ask({"type": "experience", "episodes": [seg]}) == {"type": "ok", "steps": 2}
    finally:
        server.close()
