"""One simulator's connection to the server: its frames, its handshake, and each message's checks.

Every request gets one reply, in order. A message that breaks the protocol gets an `error` reply and the
connection goes on; the ones that make a connection worthless (a wrong token or protocol version, a frame
over the size limit, anything before `hello`, a full server) are answered and the connection closed.
Nothing a client sends reaches the run unchecked: shapes, dtypes, finite numbers, action bounds, episode
order. The protocol: docs/reference/protocol.md.
"""
from __future__ import annotations

import asyncio
import hmac
import socket

from distrl.client import wire
from distrl.client.wire import ProtocolError
from distrl.roles.external_checks import episode_id, reward
from distrl.roles.external_steps import Episodes

FATAL = ("too_large", "bad_token", "bad_version", "unauthenticated", "server_full")
HELLO_S = 10.0  # a connection that has not said hello by then is closed
MAX_OPEN_EPISODES = 256  # open episodes one connection may hold


class Session(asyncio.Protocol):
    """Frames in, replies out; messages go to the `SimulatorServer` that owns it."""

    def __init__(self, server):
        self.server, self.buf = server, bytearray()
        self.transport = None
        # JSON until a payload says otherwise: a reply before one is read (a first frame too long, no hello)
        # must be one that any client can parse
        self.encoding = "json"
        self.slot: int | None = None
        self.inference = ""
        self.protocol = 0  # the version its hello spoke
        self.episodes: Episodes | None = None  # set by hello
        self.busy = False  # a request waits for the server (a batched action, weights): later frames wait
        self.closing = False
        self.hello_timer = None

    # --- the connection -------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.hello_timer = asyncio.get_running_loop().call_later(HELLO_S, self._no_hello)
        self.server.opened(self)

    def connection_lost(self, exc) -> None:
        self.closing = True
        if self.hello_timer is not None:
            self.hello_timer.cancel()
        self.server.closed(self)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self.drain()

    def drain(self) -> None:
        """Handle the complete frames received, in order, while no request waits on the server."""
        limit = self.server.max_message_bytes
        while not self.busy and not self.closing and len(self.buf) >= wire.HEADER.size:
            (n,) = wire.HEADER.unpack_from(self.buf)
            if n > limit:
                self.fail(ProtocolError("too_large", f"a frame of {n} bytes; the limit is {limit}"))
                return
            if len(self.buf) < wire.HEADER.size + n:
                return
            payload = bytes(self.buf[wire.HEADER.size:wire.HEADER.size + n])
            del self.buf[:wire.HEADER.size + n]
            self.handle(payload)

    def handle(self, payload: bytes) -> None:
        try:
            msg, encoding = wire.decode(payload)
            if self.episodes is None:
                self.encoding = encoding
            reply = self.dispatch(msg)
        except ProtocolError as e:
            self.fail(e)
            return
        if reply is not None:
            self.send(reply)

    def send(self, msg: dict) -> None:
        if not self.closing:
            self.transport.write(wire.frame(wire.encode(msg, self.encoding)))

    def fail(self, e: ProtocolError) -> None:
        """An error reply; the connection is closed after it when the error leaves nothing to go on with."""
        self.server.count("errors")
        self.send({"type": "error", "error": e.code, "message": str(e)})
        if e.code in FATAL:
            self.server.count("rejected")
            self.close()

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            self.transport.close()

    def _no_hello(self) -> None:
        if self.episodes is None:
            self.fail(ProtocolError("unauthenticated", f"no hello within {HELLO_S:g} s"))

    def answered(self, reply: dict) -> None:
        """A request that waited on the server is answered: its frames after it go on."""
        self.busy = False
        self.send(reply)
        self.drain()

    # --- messages --------------------------------------------------------------------
    def dispatch(self, msg: dict) -> dict | None:
        kind = msg.get("type")
        if self.episodes is None:
            if kind != "hello":
                raise ProtocolError("unauthenticated", f"the first message must be hello, got {kind!r}")
            return self.hello(msg)
        handler = HANDLERS.get(kind)
        if handler is None:
            raise ProtocolError("unknown_type", f"no message type {kind!r} (known: {', '.join(HANDLERS)})")
        return handler(self, msg)

    def hello(self, msg: dict) -> dict:
        protocol = msg.get("protocol")
        if type(protocol) is not int or protocol not in wire.PROTOCOLS:  # not True, not 2.0
            spoken = " or ".join(map(str, wire.PROTOCOLS))
            raise ProtocolError("bad_version", f"this server speaks protocol {spoken}, the client {protocol!r}")
        token = msg.get("token")
        if not isinstance(token, str) or not hmac.compare_digest(token.encode(), self.server.token.encode()):
            raise ProtocolError("bad_token", "the token is not this run's (RUN_DIR/external.json)")
        if protocol < self.server.protocol:  # a protocol 1 client would misread a Dict, a mask, a MultiDiscrete
            raise ProtocolError("bad_version", f"this run's spaces (a Dict or Tuple observation, MultiDiscrete or "
                                               f"MultiBinary actions) need protocol {self.server.protocol}, the "
                                               f"client speaks {protocol}")
        if msg.get("inference", "remote") not in ("remote", "local"):
            raise ProtocolError("bad_version", f"inference is remote or local, got {msg.get('inference')!r}")
        slot = self.server.claim_slot()
        if slot is None:
            raise ProtocolError("server_full", f"{self.server.max_clients} simulators are connected "
                                               "(external.max_clients)")
        self.hello_timer.cancel()
        self.slot, self.inference, self.protocol = slot, msg.get("inference", "remote"), protocol
        self.episodes = Episodes(self.server.assembler, self.server.chunk, MAX_OPEN_EPISODES, self.server.counts)
        return self.server.welcome(slot, protocol)

    def start_episode(self, msg: dict) -> dict:
        episode = msg.get("episode")
        episode = self.server.new_episode_id(self.slot) if episode is None else episode_id(episode)
        problem = self.episodes.start(episode)
        if problem:
            raise ProtocolError("out_of_order", problem)
        return {"type": "episode", "episode": episode}

    def get_action(self, msg: dict) -> None:
        self._mode("remote", "get_action")
        episode = self._known(msg)
        obs = self.server.observation(msg.get("obs"), rows=None)
        earned = reward(msg.get("reward", 0.0))
        self.busy = True
        self.server.queue_action(self, episode, obs, earned)
        return None

    def end_episode(self, msg: dict) -> dict:
        episode = self._known(msg)
        obs = self.server.observation(msg.get("obs"), rows=None)
        earned, truncated = reward(msg.get("reward", 0.0)), msg.get("truncated", False)
        if not isinstance(truncated, bool):
            raise ProtocolError("bad_value", f"truncated is true or false, got {truncated!r}")
        self.episodes.reward(episode, earned)
        self.episodes.end(episode, obs, truncated)
        self.server.stepped()
        return {"type": "ok"}

    def get_weights(self, msg: dict) -> dict | None:
        self._mode("local", "get_weights")
        have = msg.get("version", -1)
        if not isinstance(have, int) or isinstance(have, bool):
            raise ProtocolError("bad_value", f"version is an integer, got {have!r}")
        reply = self.server.queue_weights(self, have)
        self.busy = reply is None  # answered when the first export is there
        return reply

    def experience(self, msg: dict) -> dict:
        self._mode("local", "experience")
        segments = msg.get("episodes")
        if not isinstance(segments, list):
            raise ProtocolError("bad_value", "experience carries a list of episodes")
        checked = [self.server.segment(seg, self.episodes) for seg in segments]  # all checked before any is applied
        if len({c[0] for c in checked}) != len(checked):
            raise ProtocolError("bad_value", "an episode appears twice in one experience message")
        if len(self.episodes.open) + sum(c[1] for c in checked) > MAX_OPEN_EPISODES:
            raise ProtocolError("out_of_order", f"more than {MAX_OPEN_EPISODES} episodes open on one connection")
        steps = sum(self.server.apply_segment(self.episodes, self.slot, *c) for c in checked)
        return {"type": "ok", "steps": steps}

    def bye(self, msg: dict) -> dict:
        asyncio.get_running_loop().call_soon(self.close)
        return {"type": "ok"}

    def _mode(self, inference: str, kind: str) -> None:
        if self.inference != inference:
            raise ProtocolError("out_of_order", f"{kind} is for {inference} inference; this client said "
                                                f"{self.inference} in its hello")

    def _known(self, msg: dict) -> str:
        episode = episode_id(msg.get("episode"))
        if episode not in self.episodes.open:
            raise ProtocolError("unknown_episode", f"episode {episode!r} is not open (start_episode first)")
        return episode


HANDLERS = {"start_episode": Session.start_episode, "get_action": Session.get_action,
            "end_episode": Session.end_episode, "get_weights": Session.get_weights,
            "experience": Session.experience, "bye": Session.bye}
