"""The simulator server against clients that break the protocol, while others go on (`distrl.roles.external_server`).

A real server on a loopback port, real sockets: wrong tokens, silence, oversized, malformed and out-of-order
messages each get an error reply; a fuzzer's random messages never stop a well-behaved client."""
import json
import socket
import struct
import threading
import time

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distrl.client import Client, ServerError, wire
from distrl.config import load_config
from distrl.roles.external_server import MAX_READY, SimulatorServer
from distrl.roles.factory import make_algorithm

TOKEN = "s3cret"


def make_server(algo="ppo", port=0, overrides=(), weights=None, **external):
    sets = [f"external.{k}={v}" for k, v in external.items()]
    cfg = load_config(None, [f"algo={algo}", "external.enabled=true", "env.num_envs=2", "rollout.fragment_length=8",
                             *sets, *overrides])
    weights = weights or make_algorithm(cfg).make_learner("cpu").get_weights()
    return SimulatorServer(cfg, TOKEN, port, lambda v: None if v == 7 else (7, weights), worker_index=1)


@pytest.fixture
def server():
    s = make_server()
    yield s
    s.close()


class Raw:
    """A client speaking frames by hand."""

    def __init__(self, port, encoding="json"):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.encoding = encoding

    def send(self, msg=None, payload=None):
        payload = payload if payload is not None else wire.encode(msg, self.encoding)
        self.sock.sendall(struct.pack(">I", len(payload)) + payload)

    def ask(self, msg=None, payload=None):
        self.send(msg, payload)
        return wire.receive(self.sock)

    def hello(self, **kw):
        return self.ask({"type": "hello", "protocol": wire.PROTOCOL, "token": TOKEN, **kw})

    def closed(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True


OBS = [0.01, -0.02, 0.03, 0.0]


@pytest.mark.parametrize("first, code", [
    ({"type": "hello", "protocol": 1, "token": "wrong"}, "bad_token"),
    ({"type": "hello", "protocol": 99, "token": TOKEN}, "bad_version"),
    ({"type": "hello", "protocol": 1}, "bad_token"),
    ({"type": "get_action", "episode": "x", "obs": OBS}, "unauthenticated"),
])
def test_a_client_without_the_token_or_the_protocol_is_refused_and_cut_off(server, first, code):
    raw = Raw(server.port)
    reply = raw.ask(first)
    assert reply["type"] == "error" and reply["error"] == code
    assert raw.closed()
    assert server.take(0.0).info.counts["rejected"] == 1


def test_an_oversized_frame_is_refused_before_it_is_read(server):
    raw = Raw(server.port)
    raw.hello()
    raw.sock.sendall(struct.pack(">I", 2**31))
    assert wire.receive(raw.sock)["error"] == "too_large"
    assert raw.closed()


def test_a_first_frame_too_long_to_read_is_refused_in_json_which_any_client_parses(server):
    raw = Raw(server.port)
    raw.sock.sendall(struct.pack(">I", 2**31))  # no payload read: the connection's encoding is not known
    (n,) = struct.unpack(">I", raw.sock.recv(4, socket.MSG_WAITALL))
    reply = json.loads(raw.sock.recv(n, socket.MSG_WAITALL))
    assert reply["type"] == "error" and reply["error"] == "too_large"
    assert raw.closed()


@pytest.mark.parametrize("msg, code", [
    ({"type": "get_action", "episode": "nope", "obs": OBS}, "unknown_episode"),
    ({"type": "get_action", "episode": "e", "obs": [1.0, 2.0]}, "bad_value"),
    ({"type": "get_action", "episode": "e", "obs": [1.0, float("nan"), 0.0, 0.0]}, "malformed"),  # NaN: not JSON
    ({"type": "get_action", "episode": "e", "obs": wire.pack_array(np.array([0, np.inf, 0, 0], np.float32), "json")},
     "bad_value"),
    ({"type": "get_action", "episode": "e", "obs": OBS, "reward": "lots"}, "bad_value"),
    ({"type": "get_action", "episode": "e", "obs": "pixels"}, "bad_value"),
    ({"type": "end_episode", "episode": "e", "obs": OBS, "truncated": "yes"}, "bad_value"),
    ({"type": "start_episode", "episode": "e"}, "out_of_order"),
    ({"type": "get_weights", "version": -1}, "out_of_order"),
    ({"type": "experience", "episodes": []}, "out_of_order"),
    ({"type": "hello", "protocol": 1, "token": TOKEN}, "unknown_type"),
    ({"type": "teleport"}, "unknown_type"),
    ({"no": "type"}, "unknown_type"),
])
def test_a_bad_message_gets_an_error_and_the_connection_goes_on(server, msg, code):
    raw = Raw(server.port)
    raw.hello()
    assert raw.ask({"type": "start_episode", "episode": "e"}) == {"type": "episode", "episode": "e"}
    payload = json.dumps(msg).encode() if code == "malformed" else None  # json.dumps writes NaN, which JSON has not
    reply = raw.ask(msg, payload=payload)
    assert reply["type"] == "error" and reply["error"] == code, reply
    assert raw.ask({"type": "get_action", "episode": "e", "obs": OBS})["type"] == "action"


def test_a_full_server_refuses_one_more_client():
    server = make_server(max_clients=1)
    try:
        first = Raw(server.port)
        assert first.hello()["client"] == 0
        second = Raw(server.port)
        assert second.hello()["error"] == "server_full" and second.closed()
        first.sock.close()
        time.sleep(0.2)
        assert Raw(server.port).hello()["client"] == 0  # the slot came back
    finally:
        server.close()


def test_a_well_behaved_client_plays_on_through_a_fuzzer(server):
    done, stop = [], threading.Event()

    def good():
        client = Client(f"127.0.0.1:{server.port}", TOKEN)
        while not stop.is_set():
            episode = client.start_episode()
            for _ in range(5):
                client.get_action(episode, OBS)
                client.log_returns(episode, 1.0)
            client.end_episode(episode, OBS)
            done.append(episode)
        client.close()

    counts = {}

    def driver():  # takes fragments as the driver does, so the server never holds its clients back
        while not stop.is_set():
            for name, n in server.take(0.1).info.counts.items():
                counts[name] = counts.get(name, 0) + n

    threads = [threading.Thread(target=good), threading.Thread(target=driver)]
    for t in threads:
        t.start()
    try:
        fuzz(server.port)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert len(done) > 0 and server.alive()
    for name, n in server.take(0.0).info.counts.items():
        counts[name] = counts.get(name, 0) + n
    assert counts.get("internal_errors", 0) == 0, server.last_internal_error
    assert counts["errors"] > 0
    assert counts["episodes"] >= len(done)  # the fuzzer's own episodes count too


values = st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False, allow_infinity=False) |
                      st.text(max_size=8) | st.binary(max_size=16),
                      lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
                      max_leaves=12)
messages = st.fixed_dictionaries({"type": st.sampled_from(["start_episode", "get_action", "end_episode", "experience",
                                                           "get_weights", "bye", "hello", "x"])},
                                 optional={"episode": st.sampled_from(["e", 1, None, "f"]) | values,
                                           "obs": st.sampled_from([OBS, [OBS], {"dtype": "float32", "shape": [4],
                                                                                "data": b"\0" * 16}]) | values,
                                           "reward": values, "truncated": values, "episodes": values,
                                           "version": values, "token": values, "protocol": values})


def fuzz(port):
    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.lists(messages | st.binary(max_size=64), min_size=1, max_size=6), st.sampled_from(wire.ENCODINGS))
    def attack(sequence, encoding):
        raw = Raw(port, encoding)
        try:
            raw.hello()
            for msg in sequence:
                if isinstance(msg, bytes):
                    raw.send(payload=msg)
                else:
                    raw.send(msg if encoding == "msgpack" else json.loads(json.dumps(msg, default=repr)))
                reply = wire.receive(raw.sock)
                assert reply["type"] in ("ok", "episode", "action", "error", "weights")
        except (ConnectionError, OSError):
            pass  # closed by the server after a fatal error (or a bye)
        finally:
            raw.sock.close()
    attack()


def test_a_held_back_server_stops_reading_until_the_driver_takes_a_fragment(server):
    client = Client(f"127.0.0.1:{server.port}", TOKEN)
    episode = client.start_episode()
    for _ in range(MAX_READY * 16):  # fills MAX_READY fragments of 8 x 2 steps
        client.get_action(episode, OBS)
    assert len(server.assembler.ready) == MAX_READY - 1 or server.paused is False
    client.get_action(episode, OBS)  # the step that completes the last one
    assert server.paused
    answered = []
    blocked = threading.Thread(target=lambda: answered.append(client.get_action(episode, OBS)))
    blocked.start()
    blocked.join(0.5)
    assert not answered  # held back: its request waits in the socket
    assert server.take(1.0).data is not None
    blocked.join(5)
    assert answered
    client.close()


def test_local_inference_pulls_onnx_weights_and_sends_checked_experience(server):
    client = Client(f"127.0.0.1:{server.port}", TOKEN, inference="local", send_steps=4, seed=0)
    episode = client.start_episode()
    for _ in range(20):
        client.log_returns(episode, 1.0)
        assert client.get_action(episode, OBS) in (0, 1)
    client.end_episode(episode, OBS)
    client.close()
    assert client.actor is None or client.actor.version == 7
    frags = [server.take(1.0) for _ in range(2)]
    assert frags[0].data is not None and frags[0].data["version"].min() == 7
    raw = Raw(server.port, "msgpack")
    raw.hello(inference="local")
    seg = {"episode": "e", "start": True, "obs": [OBS], "actions": [1], "rewards": [1.0], "versions": [7],
           "extras": {"value": [0.5]}}  # the run's policy also records logp
    assert raw.ask({"type": "experience", "episodes": [seg]})["error"] == "bad_value"
    seg["extras"]["logp"] = [-0.7]
    seg["actions"] = [2]  # CartPole has 2 actions
    assert raw.ask({"type": "experience", "episodes": [seg]})["error"] == "bad_value"
    seg["actions"] = [1]
    assert raw.ask({"type": "experience", "episodes": [seg]}) == {"type": "ok", "steps": 1}


def test_local_inference_acts_for_many_episodes_at_once_and_sends_each_ones_steps(server):
    client = Client(f"127.0.0.1:{server.port}", TOKEN, inference="local", send_steps=1000, seed=0)
    episodes = [client.start_episode() for _ in range(4)]
    shared = np.array([OBS] * 4, np.float32)
    for step in range(4):
        shared[:, 0] = step  # a vectorized simulator writes its next rows in place
        actions = client.get_actions(episodes, shared)
        assert len(actions) == 4 and all(a in (0, 1) for a in actions)
        for episode in episodes:
            client.log_returns(episode, 1.0)
    with pytest.raises(ValueError, match="2 episodes but 4 observations"):
        client.get_actions(episodes[:2], shared)
    for episode in episodes:
        client.end_episode(episode, OBS)
    client.close()
    data = server.take(1.0).data  # the server's fragments hold 2 x 8 steps: exactly these 16
    assert data["rewards"].sum() == 16.0 and data["version"].min() == 7
    # every row the observation it was given, each episode's steps in their order: (T, E) columns of 2 episodes
    assert data["obs"].shape[:2] == (8, 2)
    assert data["obs"][..., 0].T.reshape(-1).tolist() == [0.0, 1.0, 2.0, 3.0] * 4


def test_a_client_reconnects_to_a_restarted_server_and_only_the_open_episode_is_cut():
    server = make_server()
    port = server.port
    client = Client(f"127.0.0.1:{port}", TOKEN, reconnect_s=20)
    episode = client.start_episode()
    for _ in range(3):
        client.get_action(episode, OBS)
    server.close()
    assert server.take(0.0).info.counts == {"connections": 1, "steps": 2, "steps_lost": 3, "episodes_cut": 1,
                                            "clients": 0}
    server = make_server(port=port)
    try:
        for _ in range(3):
            client.get_action(episode, OBS)  # the episode goes on, announced again to the new server
        client.end_episode(episode, OBS)
        counts = server.take(0.0).info.counts
        assert counts["episodes"] == 1 and counts["steps"] == 3
    finally:
        client.close()
        server.close()


def test_an_episode_ended_as_the_server_restarts_is_announced_to_the_new_one_and_ends_there():
    """The server goes down as a client ends an episode: the client connects again to the restarted server,
    announces the episode it is ending with the others open, and the server takes its end (an episode the
    new server was never told of would be refused: unknown_episode)."""
    server = make_server()
    port = server.port
    client = Client(f"127.0.0.1:{port}", TOKEN, reconnect_s=20)
    ending, still_open = client.start_episode(), client.start_episode()
    for episode in (ending, still_open):
        client.get_action(episode, OBS)
    server.close()
    holder: list = []  # the restarted server
    restarted = threading.Timer(0.3, lambda: holder.append(make_server(port=port)))
    restarted.start()
    try:
        client.end_episode(ending, OBS)  # sent into the closed port: retried once the new server listens
        client.get_action(still_open, OBS)
        counts = holder[0].take(0.0).info.counts  # the ended episode had no step there: not counted
        assert counts["connections"] == 1 and counts.get("errors", 0) == 0, counts
        assert set(client.episodes) == {still_open}
    finally:
        restarted.join()
        client.close()
        for s in holder:
            s.close()


def test_clients_can_refuse_a_wrong_token_at_once(server):
    with pytest.raises(ServerError) as e:
        Client(f"127.0.0.1:{server.port}", "guess")
    assert e.value.code == "bad_token"



def test_an_episode_being_started_when_the_connection_drops_is_announced_once_on_the_new_one(server):
    """The connection is lost as a new episode starts: the client connects again, announces the episodes the
    server knew, and its retry starts the new one, which the server then knows exactly once."""
    client = Client(("127.0.0.1", server.port), TOKEN)
    old = client.start_episode()
    client.get_action(old, OBS)
    client.sock.shutdown(socket.SHUT_RDWR)  # the link goes down under the next call
    new = client.start_episode()
    for episode in (old, new):
        assert client.get_action(episode, OBS) in (0, 1)
    client.close()


class Taker:
    """Takes the server's fragments as the run's driver does (a held-back server stops reading), summing
    the counts they carry."""

    def __init__(self, server):
        self.server, self.counts, self.done = server, {}, threading.Event()
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self):
        while not self.done.is_set():
            for name, n in self.server.take(0.05).info.counts.items():
                self.counts[name] = self.counts.get(name, 0) + n if name != "clients" else n

    def stop(self) -> dict:
        self.done.set()
        self.thread.join(10)
        return self.counts


def test_local_inference_sends_64_calls_of_many_rows_at_once_by_default(server):
    """A simulator acting for 16 episodes per call sends after 64 calls (1,024 rows, more than 256)."""
    client = Client(f"127.0.0.1:{server.port}", TOKEN, inference="local", seed=0)
    episodes = [client.start_episode() for _ in range(16)]
    obs = np.array([OBS] * 16, np.float32)
    for _ in range(63):
        client.get_actions(episodes, obs)
    assert server.take(0.0).info.counts.get("steps", 0) == 0
    taker = Taker(server)
    try:
        client.get_actions(episodes, obs)  # the 64th: every episode's 63 rows but its newest go
        time.sleep(0.5)
        assert taker.counts["steps"] == 16 * 62  # the last sent waits on the server for its next observation
    finally:
        client.close()
        taker.stop()


def test_local_inference_sends_before_a_batch_nears_the_servers_message_limit():
    server = make_server(max_message_bytes=4096)
    taker = Taker(server)
    try:
        client = Client(f"127.0.0.1:{server.port}", TOKEN, inference="local", send_steps=10**6, seed=0)
        episode = client.start_episode()
        for _ in range(200):
            client.log_returns(episode, 1.0)
            client.get_action(episode, OBS)
        time.sleep(0.5)
        counts = dict(taker.counts)
        client.close()
    finally:
        taker.stop()
        server.close()
    assert counts["steps"] >= 150 and "errors" not in counts, counts  # several messages, each under the limit
