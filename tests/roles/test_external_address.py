"""Where simulators connect, kept across resumes (`distrl.roles.external_address`)."""
import socket

from distrl.config import load_config
from distrl.roles.external_address import identity, publish
from distrl.roles.factory import make_algorithm


def test_a_resumed_run_keeps_its_token_and_its_port_while_free(tmp_path):
    token, port = identity(str(tmp_path), "127.0.0.1", 0)
    assert len(token) >= 32 and port == 0  # a new run: a new token, any port
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        publish(str(tmp_path), "127.0.0.1", busy, token, make_algorithm(load_config(None, [])).spec)
        assert identity(str(tmp_path), "127.0.0.1", 0) == (token, 0)  # its port is taken now: another
    assert identity(str(tmp_path), "127.0.0.1", 0) == (token, busy)  # resumed: the same token, the same port
    assert identity(str(tmp_path), "127.0.0.1", 41000) == (token, 41000)  # unless the config names one
    assert identity(str(tmp_path / "other"), "127.0.0.1", 0)[0] != token
