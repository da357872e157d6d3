"""Reading checkpoints back: the newest complete one, and hostile files refused with one line naming them."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from distrl.checkpoint import run as rc
from distrl.checkpoint.run import latest_checkpoint, write_checkpoint
from tests.checkpoint.builders import assert_error, rehash, run_state


def test_latest_skips_truncated_and_handles_empty(tmp_path):
    assert latest_checkpoint(str(tmp_path)) is None
    first = write_checkpoint(str(tmp_path), run_state())
    second = write_checkpoint(str(tmp_path), run_state())
    with open(os.path.join(second, "learner.pt"), "r+b") as fh:
        fh.truncate(100)
    with pytest.warns(RuntimeWarning, match="ckpt-00000002"):
        assert latest_checkpoint(str(tmp_path)) == first


def test_truncated_learner(ckpt):
    f = os.path.join(ckpt, "learner.pt")
    with open(f, "r+b") as fh:
        fh.truncate(os.path.getsize(f) // 2)
    assert_error(ckpt, "learner.pt", "truncated")
    rehash(ckpt)  # checksums agree now: torch.load itself must refuse it
    assert_error(ckpt, "learner.pt", "corrupt")


_PLANT_RAN = []


def _plant():
    _PLANT_RAN.append(True)
    return "pwned"


class Planted:
    def __reduce__(self):
        return (_plant, ())


def test_planted_pickle_is_refused(ckpt):
    torch.save({"learner": {"x": Planted()}, "torch_rng": None}, os.path.join(ckpt, "learner.pt"))
    rehash(ckpt)
    assert_error(ckpt, "learner.pt", "_plant")
    assert not _PLANT_RAN


def test_object_array_in_npz_is_refused(ckpt):
    f = os.path.join(ckpt, "store.npz")
    with np.load(f) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["storage/obs"] = np.array([Planted()], dtype=object)
    with open(f, "wb") as fh:
        np.savez(fh, **arrays)
    rehash(ckpt)
    assert_error(ckpt, "store.npz", "Object arrays")
    assert not _PLANT_RAN


def test_flipped_byte_missing_file_bad_json(ckpt):
    f = os.path.join(ckpt, "store.npz")
    with open(f, "r+b") as fh:
        fh.seek(os.path.getsize(f) // 2)
        b = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([b[0] ^ 0x01]))
    assert_error(ckpt, "store.npz", "sha256")
    rehash(ckpt)
    with open(os.path.join(ckpt, "state.json"), "w") as fh:
        fh.write('{"workers": [')
    rehash(ckpt)
    assert_error(ckpt, "state.json", "corrupt")
    os.unlink(os.path.join(ckpt, "meta.json"))
    assert_error(ckpt, "meta.json", "missing")


@pytest.mark.parametrize("version, words", [(99, "newer"), (0, "older"), (1, "resume it with the distrl that wrote it"),
                                            (None, "found None")])
def test_format_version_checks(ckpt, version, words):
    f = os.path.join(ckpt, "meta.json")
    with open(f) as fh:
        meta = json.load(fh)
    meta["format_version"] = version
    with open(f, "w") as fh:
        json.dump(meta, fh)
    rehash(ckpt)
    msg = assert_error(ckpt, "meta.json", words)
    assert str(rc.FORMAT_VERSION) in msg
