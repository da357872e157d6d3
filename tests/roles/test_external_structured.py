"""Protocol 2 on a real server: Dict and Tuple observations (nested, Discrete, MultiBinary and Box leaves), an
action mask, MultiDiscrete and Discrete actions, in remote and local inference; protocol 1 clients on the
runs protocol 1 carries, and refused on those it cannot; bad leaves and masks refused as `bad_value` while
the connection goes on."""
import json
import types

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distrl import tree
from distrl.client import Client, ServerError, wire
from tests.roles.test_external_server import TOKEN, Raw, fuzz, make_server, values

OBS_SPACE = ("{type: dict, spaces: {pos: {type: box, shape: [2], low: -1, high: 1}, "
             "items: {type: tuple, spaces: [{n: 3}, {type: multi_binary, n: 2}]}, "
             "action_mask: {type: multi_binary, n: 5}}}")
FACTORED = {"observation_space": OBS_SPACE, "action_space": "{type: multi_discrete, nvec: [2, 3], start: [1, 0]}"}
DISCRETE = {"observation_space": OBS_SPACE, "action_space": "{n: 5}"}
OFFSETS = {"factored": np.array([0, 2]), "discrete": np.array([0])}


def observation(rng, mask=None):
    """A Python client's observation: a dict with a tuple, numpy leaves, a random mask allowing a value of each
    factor (of [2, 3] and of 5 alike)."""
    if mask is None:
        mask = (rng.random(5) < 0.5).astype(np.int8)
        mask[rng.integers(0, 2)] = 1
        mask[2 + rng.integers(0, 3)] = 1
    return {"pos": rng.uniform(-1, 1, 2).astype(np.float32),
            "items": (int(rng.integers(0, 3)), rng.integers(0, 2, 2).astype(np.int8)), "action_mask": mask}


def allowed(mask, action, kind) -> bool:
    choices = np.atleast_1d(action) - (np.array([1, 0]) if kind == "factored" else 0)
    return bool(mask[OFFSETS[kind] + choices].all())


@pytest.fixture(params=["factored", "discrete"])
def served(request):
    algo = "ppo" if request.param == "factored" else "apex_dqn"
    extra = [] if algo == "ppo" else ["replay.min_size=10"]
    server = make_server(algo, overrides=extra, **(FACTORED if request.param == "factored" else DISCRETE))
    yield server, request.param
    server.close()


def test_protocol_1_is_refused_where_it_cannot_carry_the_spaces_and_2_gets_them(served):
    server, kind = served
    old = Raw(server.port)
    reply = old.hello(protocol=1)
    assert reply["error"] == "bad_version" and "need protocol 2" in reply["message"] and old.closed()
    welcome = Raw(server.port).hello(protocol=2)
    assert welcome["protocol"] == 2
    space = welcome["observation_space"]
    assert space["type"] == "dict" and set(space["spaces"]) == {"pos", "items", "action_mask"}
    assert space["spaces"]["items"] == {"type": "tuple", "spaces": [{"type": "discrete", "n": 3},
                                                                   {"type": "multi_binary", "n": 2}]}
    if kind == "factored":
        assert welcome["action_space"] == {"type": "multi_discrete", "nvec": [2, 3], "dtype": "int64", "start": [1, 0]}


def test_a_protocol_1_client_of_a_flat_run_is_answered_in_protocol_1():
    server = make_server()
    try:
        raw = Raw(server.port)
        assert raw.hello(protocol=1)["protocol"] == 1
        assert raw.ask({"type": "start_episode", "episode": "e"})["type"] == "episode"
        assert raw.ask({"type": "get_action", "episode": "e", "obs": [0.0, 0.1, 0.0, 0.0]})["action"] in (0, 1)
        assert Raw(server.port).hello(protocol=2)["protocol"] == 2
    finally:
        server.close()


@pytest.mark.parametrize("inference", ["remote", "local"])
def test_no_masked_action_is_taken_and_the_fragment_holds_the_tree(served, inference):
    server, kind = served
    client = Client(f"127.0.0.1:{server.port}", TOKEN, inference=inference, send_steps=8, seed=0)
    rng = np.random.default_rng(1)
    episodes = [client.start_episode() for _ in range(2)]
    for step in range(12):
        obs = [observation(rng) for _ in episodes]
        if step % 2:  # several episodes at once: a dict of stacked leaves, as a vector env gives it
            actions = client.get_actions(episodes, tree.stack([tree.map(np.asarray, o) for o in obs]))
        else:
            actions = [client.get_action(e, o) for e, o in zip(episodes, obs)]
        for o, a, e in zip(obs, actions, episodes):
            assert allowed(o["action_mask"], a, kind), (o["action_mask"], a)
            if kind == "factored":
                assert np.shape(a) == (2,) and 1 <= a[0] <= 2 and 0 <= a[1] <= 2
            client.log_returns(e, 1.0)
    for e in episodes:
        client.end_episode(e, observation(rng))
    client.close()
    data = server.take(5.0).data  # 2 columns of 8: the fragment's 16 steps
    assert data is not None
    obs = data["obs"]
    assert set(obs) == {"pos", "items", "action_mask"} and isinstance(obs["items"], tuple)
    assert obs["pos"].dtype == np.float32 and obs["items"][0].dtype == np.int64 and obs["action_mask"].dtype == np.int8
    lead = obs["pos"].shape[:-1]
    assert obs["items"][1].shape == (*lead, 2) and obs["action_mask"].shape == (*lead, 5)
    assert (obs["action_mask"].reshape(-1, 5).sum(axis=1) > 0).all()


def good_message(rng):
    """An observation as a JSON client writes it, its mask [1, 0, 0, 1, 0]."""
    o = observation(rng, mask=np.array([1, 0, 0, 1, 0], np.int8))
    return {"pos": o["pos"].tolist(), "items": [o["items"][0], o["items"][1].tolist()], "action_mask": [1, 0, 0, 1, 0]}


BAD_OBS = [  # (how the good observation is spoiled, what the error says)
    (lambda o: {k: v for k, v in o.items() if k != "pos"}, "keys"),  # a leaf missing
    (lambda o: {**o, "speed": [1.0]}, "keys"),  # a leaf too many
    (lambda o: {**o, "pos": [0.0, 0.0, 0.0]}, "'pos': shaped (2,)"),
    (lambda o: {**o, "items": o["items"][:1]}, "'items' is a list of 2"),
    (lambda o: {**o, "items": {"0": 1, "1": [0, 1]}}, "'items' is a list of 2"),
    (lambda o: {**o, "items": [3, [0, 1]]}, "'items.0': values in [0, 3)"),  # a Discrete leaf out of range
    (lambda o: {**o, "items": [1.5, [0, 1]]}, "'items.0': integers expected"),
    (lambda o: {**o, "items": [1, [0, 2]]}, "'items.1': values in [0, 2)"),
    (lambda o: {**o, "action_mask": [0, 0, 0, 0, 0]}, "allows no"),
    (lambda o: {**o, "action_mask": "all"}, "'action_mask': an array holds numbers"),
    (lambda o: [o["pos"]], "is a map with the keys"),
]


@pytest.mark.parametrize("encoding", wire.ENCODINGS)
def test_a_bad_structured_observation_is_a_bad_value_and_the_connection_goes_on(served, encoding):
    server, kind = served
    raw = Raw(server.port, encoding)
    raw.hello()
    assert raw.ask({"type": "start_episode", "episode": "e"})["type"] == "episode"
    rng = np.random.default_rng(0)
    for spoil, message in BAD_OBS:
        reply = raw.ask({"type": "get_action", "episode": "e", "obs": spoil(good_message(rng))})
        assert reply["type"] == "error" and reply["error"] == "bad_value" and message in reply["message"], \
            (message, reply)
    # No legal value for the second factor: refused for MultiDiscrete actions; for 5 Discrete ones, 0 and 1 are legal
    reply = raw.ask({"type": "get_action", "episode": "e", "obs": {**good_message(rng), "action_mask": [1, 1, 0, 0, 0]}})
    if kind == "factored":
        assert reply["error"] == "bad_value" and "allows no value of factor 1" in reply["message"], reply
    else:
        assert reply["action"] in (0, 1)
    reply = raw.ask({"type": "get_action", "episode": "e", "obs": good_message(rng)})
    assert reply["action"] in ([1, 1],) if kind == "factored" else reply["action"] in (0, 3)  # the mask [1, 0, 0, 1, 0]


def test_local_experience_with_a_masked_or_out_of_range_action_is_refused(served):
    server, kind = served
    raw = Raw(server.port, "msgpack")
    raw.hello(inference="local")
    rng = np.random.default_rng(0)
    obs = good_message(rng)
    rows = {"pos": [obs["pos"]] * 2, "items": [[obs["items"][0]] * 2, [obs["items"][1]] * 2],
            "action_mask": [obs["action_mask"]] * 2}
    extras = {name: np.zeros((2, *shape), dtype).tolist() for name, (shape, dtype) in server.checks.extras().items()}
    legal, masked, outside = ([[1, 1], [1, 1]], [[1, 1], [2, 1]], [[1, 1], [1, 3]]) if kind == "factored" else \
        ([0, 3], [0, 2], [0, 5])

    def segment(actions):
        return {"episode": "e", "start": True, "obs": rows, "actions": actions, "rewards": [1.0, 1.0],
                "versions": [7, 7], "extras": extras, "end": {"obs": obs, "truncated": False}}

    for actions, message in ((masked, "forbids"), (outside, "integer actions in")):
        reply = raw.ask({"type": "experience", "episodes": [segment(actions)]})
        assert reply["error"] == "bad_value" and message in reply["message"], reply
    assert raw.ask({"type": "experience", "episodes": [segment(legal)]}) == {"type": "ok", "steps": 2}
    short = {**segment(legal), "episode": "f", "obs": {**rows, "pos": [obs["pos"]]}}  # one row of pos for 2 steps
    assert "'pos': shaped (2, 2)" in raw.ask({"type": "experience", "episodes": [short]})["message"]


def test_a_python_client_names_a_wrong_observation_before_it_is_sent(served):
    server, _ = served
    client = Client(f"127.0.0.1:{server.port}", TOKEN)
    episode = client.start_episode()
    with pytest.raises(ValueError, match="keys"):
        client.get_action(episode, {"pos": np.zeros(2)})
    with pytest.raises(ServerError, match="bad_value: the action_mask allows no"):
        client.get_action(episode, observation(np.random.default_rng(0), mask=np.zeros(5, np.int8)))
    client.close()
    json.dumps(client.welcome)  # what a JSON client reads: plain data


def test_a_fuzzer_never_breaks_the_structured_server(served):
    """Random maps, lists and numbers where observations go, and observations of the right keys with random
    leaves: each an error reply or an action, never a server fault."""
    server, _ = served
    fuzz(server.port)
    leaf = values | st.lists(st.integers(-1, 3), min_size=2, max_size=5) | st.lists(st.floats(-2, 2), min_size=2, max_size=2)
    shaped = st.fixed_dictionaries({"pos": leaf, "items": st.lists(leaf, min_size=1, max_size=3), "action_mask": leaf})

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(shaped, st.sampled_from(wire.ENCODINGS))
    def send(obs, encoding):
        raw = Raw(server.port, encoding)
        try:
            raw.hello()
            raw.ask({"type": "start_episode", "episode": "e"})
            obs = obs if encoding == "msgpack" else json.loads(json.dumps(obs, default=repr))  # JSON has no bytes
            assert raw.ask({"type": "get_action", "episode": "e", "obs": obs})["type"] in ("action", "error")
        finally:
            raw.sock.close()
    send()
    counts = server.take(0.0).info.counts
    assert server.alive() and counts["errors"] > 0 and counts.get("internal_errors", 0) == 0, server.last_internal_error


def test_the_python_client_speaks_protocol_1_to_a_server_that_speaks_only_1(monkeypatch):
    from distrl.roles import external_session

    old_wire = types.SimpleNamespace(**{**vars(wire), "PROTOCOLS": (1,)})  # a server of distrl before protocol 2
    monkeypatch.setattr(external_session, "wire", old_wire)
    server = make_server()
    try:
        assert Raw(server.port).hello(protocol=2)["error"] == "bad_version"
        client = Client(f"127.0.0.1:{server.port}", TOKEN)
        assert client.welcome["protocol"] == 1
        assert client.get_action(client.start_episode(), [0.0, 0.1, 0.0, 0.0]) in (0, 1)
        client.close()
    finally:
        server.close()
