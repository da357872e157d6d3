"""A simulator written against docs/reference/protocol.md alone, with the Python standard library only: no
distrl, no numpy, no gymnasium, as a C++ or C# simulator would be. Its world is CartPole, written out
here with gymnasium's CartPole-v1 equations and limits, so a run whose evaluator plays CartPole-v1
learns from it.

    python tests/runtime/stdlib_sim.py RUN_DIR SECONDS SEED

Prints one JSON line: steps, episodes.
"""
import json
import math
import os
import random
import socket
import struct
import sys
import time


class CartPole:
    """gymnasium's CartPole-v1: Euler steps of 0.02 s, force 10 N, ends past 2.4 m or 12 degrees, or at 500 steps."""

    def __init__(self, rng):
        self.rng = rng

    def reset(self):
        self.state = [self.rng.uniform(-0.05, 0.05) for _ in range(4)]
        self.steps = 0
        return list(self.state)

    def step(self, action):
        x, x_dot, theta, theta_dot = self.state
        force = 10.0 if action == 1 else -10.0
        cos, sin = math.cos(theta), math.sin(theta)
        temp = (force + 0.05 * theta_dot ** 2 * sin) / 1.1
        theta_acc = (9.8 * sin - cos * temp) / (0.5 * (4.0 / 3.0 - 0.1 * cos ** 2 / 1.1))
        x_acc = temp - 0.05 * theta_acc * cos / 1.1
        x, x_dot = x + 0.02 * x_dot, x_dot + 0.02 * x_acc
        theta, theta_dot = theta + 0.02 * theta_dot, theta_dot + 0.02 * theta_acc
        self.state, self.steps = [x, x_dot, theta, theta_dot], self.steps + 1
        terminated = abs(x) > 2.4 or abs(theta) > 12 * 2 * math.pi / 360
        return list(self.state), 1.0, terminated, self.steps >= 500 and not terminated


class Connection:
    """Frames: a 4-byte big-endian length, then a JSON object."""

    def __init__(self, host, port, token):
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        welcome = self.ask({"type": "hello", "protocol": 1, "token": token, "inference": "remote"})
        assert welcome["type"] == "welcome", welcome

    def ask(self, msg):
        payload = json.dumps(msg).encode()
        self.sock.sendall(struct.pack(">I", len(payload)) + payload)
        (n,) = struct.unpack(">I", self.read(4))
        reply = json.loads(self.read(n))
        if reply["type"] == "error":
            raise RuntimeError(f"{reply['error']}: {reply['message']}")
        return reply

    def read(self, n):
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("the server closed the connection")
            data += chunk
        return data


def main(run_dir, seconds, seed):
    path = os.path.join(run_dir, "external.json")
    while not os.path.exists(path):
        time.sleep(0.05)
    with open(path) as fh:
        address = json.load(fh)
    conn = Connection(address["host"], address["port"], address["token"])
    env, steps, episodes, start = CartPole(random.Random(seed)), 0, 0, time.time()
    try:
        while time.time() - start < seconds:
            obs = env.reset()
            episode = conn.ask({"type": "start_episode"})["episode"]
            reward = 0.0
            while True:
                action = conn.ask({"type": "get_action", "episode": episode, "obs": obs, "reward": reward})["action"]
                obs, reward, terminated, truncated = env.step(action)
                steps += 1
                if terminated or truncated:
                    conn.ask({"type": "end_episode", "episode": episode, "obs": obs, "reward": reward,
                              "truncated": truncated})
                    break
            episodes += 1
    except (ConnectionError, OSError):
        pass  # the run ended
    print(json.dumps({"steps": steps, "episodes": episodes}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), int(sys.argv[3]))
