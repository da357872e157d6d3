"""Whole-run checkpoint directories: exact round trip, writers, atomic writes, pruning."""
from __future__ import annotations

import os
import shutil
import warnings

import numpy as np
import pytest
import torch

from distrl.checkpoint import run as rc
from distrl.checkpoint import save_json, save_weights, store_file
from distrl.checkpoint.run import checkpoint_size, latest_checkpoint, read_checkpoint, write_checkpoint
from distrl.replay import FragmentQueue, ReplayBuffer
from tests.checkpoint.builders import array_digest, assert_error, replay_buffer, run_state


def test_replay_learner_workers_round_trip(tmp_path):
    buf = replay_buffer()
    state = run_state(store=buf.state_dict())
    path = write_checkpoint(str(tmp_path), state)
    assert os.path.basename(path) == "ckpt-00000001"
    assert sorted(os.listdir(path)) == ["DONE", "learner.pt", "meta.json", "state.json", "store.npz"]
    back = read_checkpoint(path)

    assert array_digest(back["store"]) == array_digest(state["store"])  # bit-equal arrays, same scalar types
    fresh = ReplayBuffer(4096, alpha=0.6, seed=99)
    fresh.load_state_dict(back["store"])
    for _ in range(3):
        (b1, i1, w1), (b2, i2, w2) = buf.sample(32), fresh.sample(32)
        np.testing.assert_array_equal(i1, i2)
        np.testing.assert_array_equal(w1, w2)
        assert array_digest(b1) == array_digest(b2)

    ls, lb = state["learner"], back["learner"]
    assert lb["updates"] == 1 and type(lb["updates"]) is int
    assert torch.equal(lb["log_alpha"], ls["log_alpha"])
    for k in ls["net"]:
        assert torch.equal(lb["net"][k], ls["net"][k])
    assert lb["opt"]["param_groups"] == ls["opt"]["param_groups"]  # incl. betas tuple
    for p, s in ls["opt"]["state"].items():
        for k, v in s.items():
            assert torch.equal(lb["opt"]["state"][p][k], v)
    # The restored optimizer continues exactly like the original.
    nets = []
    for sd in (ls, lb):
        net = torch.nn.Linear(4, 2)
        net.load_state_dict(sd["net"])
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        opt.load_state_dict(sd["opt"])
        net(torch.ones(2, 4)).sum().backward()
        opt.step()
        nets.append(net)
    assert torch.equal(nets[0].weight, nets[1].weight)

    assert back["workers"] == state["workers"]
    meta = back["meta"]
    assert meta["format_version"] == rc.FORMAT_VERSION and isinstance(meta["distrl_version"], str)
    assert {k: meta[k] for k in state["meta"]} == state["meta"]
    assert type(meta["wall_s"]) is float and type(meta["config"]["async"]) is bool
    assert checkpoint_size(path) == sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


def test_store_writer_saves_in_place(tmp_path):
    """The replay server's path: a callable writes store.npz itself and adds to the metadata."""
    buf = replay_buffer()
    seen = []

    def writer(directory):
        seen.append(directory)
        return rc.save_store(directory, buf.state_dict()), {"store_sha256": "abc", "store_saved": True}

    path = write_checkpoint(str(tmp_path), run_state(store=writer))
    assert os.path.basename(seen[0]).startswith(".tmp-ckpt-")  # written before the rename
    back = read_checkpoint(path)
    assert array_digest(back["store"]) == array_digest(buf.state_dict())
    assert (back["meta"]["store_sha256"], back["meta"]["store_saved"]) == ("abc", True)
    # A writer with nothing to save (store over the size limit) leaves the store out.
    path = write_checkpoint(str(tmp_path), run_state(store=lambda d: None))
    assert read_checkpoint(path)["store"] is None and "store.npz" not in os.listdir(path)


def test_failing_store_writer_leaves_no_checkpoint(tmp_path):
    first = write_checkpoint(str(tmp_path), run_state())

    def writer(directory):
        raise RuntimeError("replay server died")

    with pytest.raises(RuntimeError):
        write_checkpoint(str(tmp_path), run_state(store=writer))
    assert os.listdir(os.path.join(str(tmp_path), "checkpoints")) == [os.path.basename(first)]
    assert latest_checkpoint(str(tmp_path)) == first


def test_fragment_queue_and_empty_stores(tmp_path):
    q = FragmentQueue(4)
    for i in range(3):
        q.add({"obs": np.full((5, 2, 3), i, np.float32), "act": np.arange(10).reshape(5, 2),
               "done": np.zeros((5, 2), bool)})
    q.take(1)
    back = read_checkpoint(write_checkpoint(str(tmp_path), run_state(store=q.state_dict())))["store"]
    assert back["added"] == 3 and back["taken"] == 1 and len(back["items"]) == 2
    for a, b in zip(q.state_dict()["items"], back["items"]):
        assert array_digest(a) == array_digest(b)
    fresh = FragmentQueue(4)
    fresh.load_state_dict(back)
    assert array_digest(fresh.take(2)) == array_digest(q.take(2))

    assert read_checkpoint(write_checkpoint(str(tmp_path), run_state(store=None)))["store"] is None
    empty = FragmentQueue(4).state_dict()
    assert read_checkpoint(write_checkpoint(str(tmp_path), run_state(store=empty)))["store"] == empty


def test_write_rejects_types_that_would_not_round_trip(tmp_path):
    for bad in ({"meta": {"x": (1, 2)}}, {"meta": {"x": np.float64(1.0)}}, {"meta": {1: 2}},
                {"store": {"obs": np.array([object()])}}, {"learner": {"a": np.zeros(2)}}):
        state = run_state()
        for k, v in bad.items():
            state[k] = {**state[k], **v} if k == "meta" else v
        with pytest.raises(TypeError):
            write_checkpoint(str(tmp_path), state)
    assert not os.path.exists(os.path.join(tmp_path, "checkpoints")) or \
        os.listdir(os.path.join(tmp_path, "checkpoints")) == []


# --------------------------------------------------------------- atomicity
def test_interrupted_writes_fall_back_to_previous(tmp_path, monkeypatch):
    run = str(tmp_path)
    root = os.path.join(run, "checkpoints")
    write_checkpoint(run, run_state(store=replay_buffer(600).state_dict(), n=1))
    good = write_checkpoint(run, run_state(store=replay_buffer(600).state_dict(), n=2))

    real = store_file.write_file

    def dies_midway(path, write):
        if path.endswith("store.npz"):
            with open(path, "wb") as fh:
                fh.write(b"PK\x03\x04 half an archive")
            raise OSError("No space left on device")
        real(path, write)

    monkeypatch.setattr(store_file, "write_file", dies_midway)
    with pytest.raises(OSError):
        write_checkpoint(run, run_state(store=replay_buffer(600).state_dict()))
    monkeypatch.undo()
    assert sorted(os.listdir(root)) == ["ckpt-00000001", "ckpt-00000002"]

    # A SIGKILL leaves a renamed dir without DONE and/or a temp dir behind.
    shutil.copytree(good, os.path.join(root, "ckpt-00000009"))
    os.unlink(os.path.join(root, "ckpt-00000009", "DONE"))
    os.makedirs(os.path.join(root, ".tmp-ckpt-00000010-abc"))
    with pytest.warns(RuntimeWarning, match="ckpt-00000009"):
        assert latest_checkpoint(run) == good
    assert read_checkpoint(good)["meta"]["n"] == 2
    assert_error(os.path.join(root, "ckpt-00000009"), "DONE", "missing")

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = write_checkpoint(run, run_state(n=3))
        assert os.path.basename(new) == "ckpt-00000010"
        assert latest_checkpoint(run) == new
    assert sorted(os.listdir(root)) == ["ckpt-00000001", "ckpt-00000002", "ckpt-00000010"]


def test_keep_prunes_but_spares_best(tmp_path):
    run = str(tmp_path)
    root = os.path.join(run, "checkpoints")
    save_weights(os.path.join(root, "best.safetensors"), {"w": np.ones(3, np.float32)}, {"v": 1})
    save_json(os.path.join(root, "best.json"), {"score": 1.0})
    for _ in range(5):
        path = write_checkpoint(run, run_state(), keep=2)
    assert sorted(os.listdir(root)) == ["best.json", "best.safetensors", "ckpt-00000004", "ckpt-00000005"]
    assert path == latest_checkpoint(run)
    with pytest.raises(ValueError):
        write_checkpoint(run, run_state(), keep=0)
