"""Whole-run checkpoints: exact round trip, atomic writes, pruning, hostile files."""
from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import shutil
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from distrl.checkpoint import layout, read
from distrl.checkpoint import run as rc
from distrl.checkpoint import store_file
from distrl.checkpoint import CheckpointError, save_json, save_weights
from distrl.replay import FragmentQueue, ReplayBuffer
from distrl.checkpoint.run import (
    capture_global_rng, checkpoint_size, latest_checkpoint, read_checkpoint,
    restore_global_rng, write_checkpoint,
)


# ---------------------------------------------------------------- fixtures
def _buffer(n: int = 3000) -> ReplayBuffer:
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


def _learner_state() -> dict:
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    net(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
    return copy.deepcopy({"net": net.state_dict(), "opt": opt.state_dict(), "updates": 1,
                          "log_alpha": torch.tensor(-0.5)})


def _state(store=None, **meta) -> dict:
    rng = capture_global_rng()
    return {"meta": {"env_steps": 1234, "updates": 7, "wall_s": 3.25, "config": {"lr": 1e-3,
                     "hidden": [64, 64], "async": True, "name": None}, "python_rng": rng["python_rng"],
                     **meta},
            "learner": _learner_state(), "store": store,
            "workers": [{"epsilon": 0.4, "rng": np.random.default_rng(i).bit_generator.state}
                        for i in range(2)],
            "torch_rng": rng["torch_rng"], "numpy_rng": rng["numpy_rng"]}


def _digest(d: dict) -> dict:
    return {k: (v.dtype.str, v.shape, hashlib.sha256(v.tobytes()).hexdigest())
            if isinstance(v, np.ndarray) else (type(v), v) for k, v in d.items()}


def _rehash(ckpt: str) -> None:
    """Make DONE agree with the files on disk, as a deliberate attacker would."""
    files = {n: {"size": os.path.getsize(os.path.join(ckpt, n)),
                 "sha256": layout.sha256(os.path.join(ckpt, n))}
             for n in os.listdir(ckpt) if n != "DONE"}
    with open(os.path.join(ckpt, "DONE"), "w") as fh:
        json.dump({"format_version": rc.FORMAT_VERSION, "files": files}, fh)


def _assert_error(ckpt: str, fname: str, words: str) -> str:
    with pytest.raises(CheckpointError) as ei:
        read_checkpoint(ckpt)
    msg = str(ei.value)
    assert "\n" not in msg
    assert os.path.join(ckpt, fname) in msg
    assert words in msg, msg
    return msg


@pytest.fixture
def ckpt(tmp_path):
    return write_checkpoint(str(tmp_path), _state(store=_buffer(600).state_dict()))


# --------------------------------------------------------------- round trip
def test_replay_learner_workers_round_trip(tmp_path):
    buf = _buffer()
    state = _state(store=buf.state_dict())
    path = write_checkpoint(str(tmp_path), state)
    assert os.path.basename(path) == "ckpt-00000001"
    assert sorted(os.listdir(path)) == ["DONE", "learner.pt", "meta.json", "state.json", "store.npz"]
    back = read_checkpoint(path)

    assert _digest(back["store"]) == _digest(state["store"])  # bit-equal arrays, same scalar types
    fresh = ReplayBuffer(4096, alpha=0.6, seed=99)
    fresh.load_state_dict(back["store"])
    for _ in range(3):
        (b1, i1, w1), (b2, i2, w2) = buf.sample(32), fresh.sample(32)
        np.testing.assert_array_equal(i1, i2)
        np.testing.assert_array_equal(w1, w2)
        assert _digest(b1) == _digest(b2)

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
    buf = _buffer()
    seen = []

    def writer(directory):
        seen.append(directory)
        return rc.save_store(directory, buf.state_dict()), {"store_sha256": "abc", "store_saved": True}

    path = write_checkpoint(str(tmp_path), _state(store=writer))
    assert os.path.basename(seen[0]).startswith(".tmp-ckpt-")  # written before the rename
    back = read_checkpoint(path)
    assert _digest(back["store"]) == _digest(buf.state_dict())
    assert (back["meta"]["store_sha256"], back["meta"]["store_saved"]) == ("abc", True)
    # A writer with nothing to save (store over the size limit) leaves the store out.
    path = write_checkpoint(str(tmp_path), _state(store=lambda d: None))
    assert read_checkpoint(path)["store"] is None and "store.npz" not in os.listdir(path)


def test_failing_store_writer_leaves_no_checkpoint(tmp_path):
    first = write_checkpoint(str(tmp_path), _state())

    def writer(directory):
        raise RuntimeError("replay server died")

    with pytest.raises(RuntimeError):
        write_checkpoint(str(tmp_path), _state(store=writer))
    assert os.listdir(os.path.join(str(tmp_path), "checkpoints")) == [os.path.basename(first)]
    assert latest_checkpoint(str(tmp_path)) == first


def test_fragment_queue_and_empty_stores(tmp_path):
    q = FragmentQueue(4)
    for i in range(3):
        q.add({"obs": np.full((5, 2, 3), i, np.float32), "act": np.arange(10).reshape(5, 2),
               "done": np.zeros((5, 2), bool)})
    q.take(1)
    back = read_checkpoint(write_checkpoint(str(tmp_path), _state(store=q.state_dict())))["store"]
    assert back["added"] == 3 and back["taken"] == 1 and len(back["items"]) == 2
    for a, b in zip(q.state_dict()["items"], back["items"]):
        assert _digest(a) == _digest(b)
    fresh = FragmentQueue(4)
    fresh.load_state_dict(back)
    assert _digest(fresh.take(2)) == _digest(q.take(2))

    assert read_checkpoint(write_checkpoint(str(tmp_path), _state(store=None)))["store"] is None
    empty = FragmentQueue(4).state_dict()
    assert read_checkpoint(write_checkpoint(str(tmp_path), _state(store=empty)))["store"] == empty


scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**130, 2**130),
                    st.floats(allow_nan=False), st.text(max_size=5))
arrays = st.sampled_from([np.float32, np.int64, np.uint8, np.bool_, np.float16]).map(
    lambda t: np.arange(6).astype(t).reshape(2, 3))
trees = st.recursive(st.one_of(scalars, arrays, st.just(np.float64(2.5)), st.just(np.int32(-3))),
                     lambda c: st.one_of(st.lists(c, max_size=3),
                                         st.dictionaries(st.text("ab/", max_size=3), c, max_size=3)),
                     max_leaves=12)


@settings(max_examples=60, deadline=None)
@given(trees)
def test_store_tree_encoding_is_exact(tree):
    skel, arrs = rc._split_store(tree)
    back = read._join_store(json.loads(json.dumps(skel)), arrs, "store.npz")

    def same(a, b):
        assert type(a) is type(b)
        if isinstance(a, (np.ndarray, np.generic)):
            assert a.dtype == b.dtype and np.array_equal(a, b)
        elif isinstance(a, dict):
            assert list(a) == list(b) and all(same(a[k], b[k]) is None for k in a)
        elif isinstance(a, list):
            assert len(a) == len(b) and all(same(x, y) is None for x, y in zip(a, b))
        else:
            assert a == b

    same(tree, back)


def test_global_rng_capture_restore(tmp_path):
    random.gauss(0, 1), np.random.standard_normal()  # leave cached gaussians in both states
    path = write_checkpoint(str(tmp_path), _state())
    expected = (random.random(), random.gauss(0, 1), np.random.standard_normal(3).tolist(),
                np.random.randint(0, 2**31, 3).tolist(), torch.rand(3).tolist())
    random.seed(5), np.random.seed(5), torch.manual_seed(5)
    restore_global_rng(read_checkpoint(path))
    got = (random.random(), random.gauss(0, 1), np.random.standard_normal(3).tolist(),
           np.random.randint(0, 2**31, 3).tolist(), torch.rand(3).tolist())
    assert got == expected


def test_write_rejects_types_that_would_not_round_trip(tmp_path):
    for bad in ({"meta": {"x": (1, 2)}}, {"meta": {"x": np.float64(1.0)}}, {"meta": {1: 2}},
                {"store": {"obs": np.array([object()])}}, {"learner": {"a": np.zeros(2)}}):
        state = _state()
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
    write_checkpoint(run, _state(store=_buffer(600).state_dict(), n=1))
    good = write_checkpoint(run, _state(store=_buffer(600).state_dict(), n=2))

    real = store_file.write_file

    def dies_midway(path, write):
        if path.endswith("store.npz"):
            with open(path, "wb") as fh:
                fh.write(b"PK\x03\x04 half an archive")
            raise OSError("No space left on device")
        real(path, write)

    monkeypatch.setattr(store_file, "write_file", dies_midway)
    with pytest.raises(OSError):
        write_checkpoint(run, _state(store=_buffer(600).state_dict()))
    monkeypatch.undo()
    assert sorted(os.listdir(root)) == ["ckpt-00000001", "ckpt-00000002"]

    # A SIGKILL leaves a renamed dir without DONE and/or a temp dir behind.
    shutil.copytree(good, os.path.join(root, "ckpt-00000009"))
    os.unlink(os.path.join(root, "ckpt-00000009", "DONE"))
    os.makedirs(os.path.join(root, ".tmp-ckpt-00000010-abc"))
    with pytest.warns(RuntimeWarning, match="ckpt-00000009"):
        assert latest_checkpoint(run) == good
    assert read_checkpoint(good)["meta"]["n"] == 2
    _assert_error(os.path.join(root, "ckpt-00000009"), "DONE", "missing")

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = write_checkpoint(run, _state(n=3))
        assert os.path.basename(new) == "ckpt-00000010"
        assert latest_checkpoint(run) == new
    assert sorted(os.listdir(root)) == ["ckpt-00000001", "ckpt-00000002", "ckpt-00000010"]


def test_latest_skips_truncated_and_handles_empty(tmp_path):
    assert latest_checkpoint(str(tmp_path)) is None
    first = write_checkpoint(str(tmp_path), _state())
    second = write_checkpoint(str(tmp_path), _state())
    with open(os.path.join(second, "learner.pt"), "r+b") as fh:
        fh.truncate(100)
    with pytest.warns(RuntimeWarning, match="ckpt-00000002"):
        assert latest_checkpoint(str(tmp_path)) == first


def test_keep_prunes_but_spares_best(tmp_path):
    run = str(tmp_path)
    root = os.path.join(run, "checkpoints")
    save_weights(os.path.join(root, "best.safetensors"), {"w": np.ones(3, np.float32)}, {"v": 1})
    save_json(os.path.join(root, "best.json"), {"score": 1.0})
    for _ in range(5):
        path = write_checkpoint(run, _state(), keep=2)
    assert sorted(os.listdir(root)) == ["best.json", "best.safetensors", "ckpt-00000004", "ckpt-00000005"]
    assert path == latest_checkpoint(run)
    with pytest.raises(ValueError):
        write_checkpoint(run, _state(), keep=0)


# ------------------------------------------------------------ hostile input
def test_truncated_learner(ckpt):
    f = os.path.join(ckpt, "learner.pt")
    with open(f, "r+b") as fh:
        fh.truncate(os.path.getsize(f) // 2)
    _assert_error(ckpt, "learner.pt", "truncated")
    _rehash(ckpt)  # checksums agree now: torch.load itself must refuse it
    _assert_error(ckpt, "learner.pt", "corrupt")


_PLANT_RAN = []


def _plant():
    _PLANT_RAN.append(True)
    return "pwned"


class Planted:
    def __reduce__(self):
        return (_plant, ())


def test_planted_pickle_is_refused(ckpt):
    torch.save({"learner": {"x": Planted()}, "torch_rng": None}, os.path.join(ckpt, "learner.pt"))
    _rehash(ckpt)
    _assert_error(ckpt, "learner.pt", "_plant")
    assert not _PLANT_RAN


def test_object_array_in_npz_is_refused(ckpt):
    f = os.path.join(ckpt, "store.npz")
    with np.load(f) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["storage/obs"] = np.array([Planted()], dtype=object)
    with open(f, "wb") as fh:
        np.savez(fh, **arrays)
    _rehash(ckpt)
    _assert_error(ckpt, "store.npz", "Object arrays")
    assert not _PLANT_RAN


def test_flipped_byte_missing_file_bad_json(ckpt):
    f = os.path.join(ckpt, "store.npz")
    with open(f, "r+b") as fh:
        fh.seek(os.path.getsize(f) // 2)
        b = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([b[0] ^ 0x01]))
    _assert_error(ckpt, "store.npz", "sha256")
    _rehash(ckpt)
    with open(os.path.join(ckpt, "state.json"), "w") as fh:
        fh.write('{"workers": [')
    _rehash(ckpt)
    _assert_error(ckpt, "state.json", "corrupt")
    os.unlink(os.path.join(ckpt, "meta.json"))
    _assert_error(ckpt, "meta.json", "missing")


@pytest.mark.parametrize("version, words", [(99, "newer"), (0, "older"), (None, "found None")])
def test_format_version_checks(ckpt, version, words):
    f = os.path.join(ckpt, "meta.json")
    with open(f) as fh:
        meta = json.load(fh)
    meta["format_version"] = version
    with open(f, "w") as fh:
        json.dump(meta, fh)
    _rehash(ckpt)
    msg = _assert_error(ckpt, "meta.json", words)
    assert str(rc.FORMAT_VERSION) in msg
