"""What the checkpoint tests write and how they tamper with it: a filled replay, a learner's state,
a whole-run state; digests to compare stores; re-signing DONE after tampering."""
from __future__ import annotations

import copy
import hashlib
import json
import os

import numpy as np
import pytest
import torch

from distrl.checkpoint import CheckpointError, layout
from distrl.checkpoint import run as rc
from distrl.checkpoint.run import capture_global_rng, read_checkpoint
from distrl.replay import ReplayBuffer


def replay_buffer(n: int = 3000) -> ReplayBuffer:
    rng = np.random.default_rng(0)
    buf = ReplayBuffer(4096, alpha=0.6, seed=3)
    for start in range(0, n, 500):
        b = 500
        obs = rng.normal(size=(b, 4)).astype(np.float32)
        buf.add({"obs": obs, "actions": rng.integers(0, 2, b).astype(np.int64),
                 "rewards": rng.normal(size=b).astype(np.float32),
                 "next_obs": obs + 1, "discounts": np.full(b, 0.99, np.float32),
                 "version": np.full(b, start, np.int32)},
                priorities=rng.random(b) + 0.1)
    _, idx, _ = buf.sample(64)
    buf.update_priorities(idx, rng.random(64) * 3)
    return buf


def learner_state() -> dict:
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    net(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
    return copy.deepcopy({"net": net.state_dict(), "opt": opt.state_dict(), "updates": 1,
                          "log_alpha": torch.tensor(-0.5)})


def run_state(store=None, **meta) -> dict:
    learner = learner_state()  # first: building it draws from torch's global RNG
    rng = capture_global_rng()
    return {"meta": {"env_steps": 1234, "updates": 7, "wall_s": 3.25, "config": {"lr": 1e-3,
                     "hidden": [64, 64], "async": True, "name": None}, "python_rng": rng["python_rng"],
                     **meta},
            "learner": learner, "store": store,
            "workers": [{"epsilon": 0.4, "rng": np.random.default_rng(i).bit_generator.state}
                        for i in range(2)],
            "torch_rng": rng["torch_rng"], "numpy_rng": rng["numpy_rng"]}


def array_digest(d: dict) -> dict:
    return {k: (v.dtype.str, v.shape, hashlib.sha256(v.tobytes()).hexdigest())
            if isinstance(v, np.ndarray) else (type(v), v) for k, v in d.items()}


def rehash(ckpt: str) -> None:
    """Make DONE agree with the files on disk, as a deliberate attacker would."""
    files = {n: {"size": os.path.getsize(os.path.join(ckpt, n)),
                 "sha256": layout.sha256(os.path.join(ckpt, n))}
             for n in os.listdir(ckpt) if n != "DONE"}
    with open(os.path.join(ckpt, "DONE"), "w") as fh:
        json.dump({"format_version": rc.FORMAT_VERSION, "files": files}, fh)


def assert_error(ckpt: str, fname: str, words: str) -> str:
    with pytest.raises(CheckpointError) as ei:
        read_checkpoint(ckpt)
    msg = str(ei.value)
    assert "\n" not in msg
    assert os.path.join(ckpt, fname) in msg
    assert words in msg, msg
    return msg
