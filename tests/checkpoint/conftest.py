"""A checkpoint with a replay in it, for the tests that tamper with one."""
import pytest

from distrl.checkpoint.run import write_checkpoint
from tests.checkpoint.builders import replay_buffer, run_state


@pytest.fixture
def ckpt(tmp_path):
    return write_checkpoint(str(tmp_path), run_state(store=replay_buffer(600).state_dict()))
