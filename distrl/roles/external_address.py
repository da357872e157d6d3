"""Where a run's simulators connect, and with which token: RUN_DIR/external.json, kept across resumes."""
from __future__ import annotations

import json
import os
import secrets
import socket

from distrl.client import wire
from distrl.envs.spaces import space_to_data


ADDRESS_FILE = "external.json"


def identity(run_dir: str, host: str, port: int) -> tuple[str, int]:
    """(token, port) of the run in `run_dir`: those it wrote before when it is resumed (so its simulators
    reconnect as they were; its port if still free on `host`), else a new token and the config's `port`."""
    try:
        with open(os.path.join(run_dir, ADDRESS_FILE)) as fh:
            known = json.load(fh)
        token, before = str(known["token"]), int(known["port"])
    except (OSError, ValueError, KeyError, TypeError):
        return secrets.token_urlsafe(24), port
    return token, port or (before if _free(host, before) else 0)


def _free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def free_port(host: str, wanted: int) -> int:
    """`wanted`, or when it is 0 a port free on `host` now (a server started later binds it, and binds it
    again after a restart)."""
    if wanted:
        return wanted
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def publish(run_dir: str, host: str, port: int, token: str, spec) -> str:
    """Write where simulators connect and with which token (RUN_DIR/external.json, readable by its owner
    only), print it, and return the line printed."""
    path = os.path.join(run_dir, ADDRESS_FILE)
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"host": host, "port": port, "token": token, "protocol": wire.PROTOCOL,
                   "observation_space": space_to_data(spec.observation_space),
                   "action_space": space_to_data(spec.action_space)}, fh, indent=2)
    os.replace(path + ".tmp", path)
    line = f"simulator server on {host}:{port}, token {token} (also in {path})"
    print(f"distrl: {line}", flush=True)
    return line
