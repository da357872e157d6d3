"""The global RNGs (python, numpy, torch) through a checkpoint."""
from __future__ import annotations

import random

import numpy as np
import torch

from distrl.checkpoint.run import read_checkpoint, restore_global_rng, write_checkpoint
from tests.checkpoint.builders import run_state


def test_global_rng_capture_restore(tmp_path):
    random.gauss(0, 1), np.random.standard_normal()  # leave cached gaussians in both states
    path = write_checkpoint(str(tmp_path), run_state())
    expected = (random.random(), random.gauss(0, 1), np.random.standard_normal(3).tolist(),
                np.random.randint(0, 2**31, 3).tolist(), torch.rand(3).tolist())
    random.seed(5), np.random.seed(5), torch.manual_seed(5)
    restore_global_rng(read_checkpoint(path))
    got = (random.random(), random.gauss(0, 1), np.random.standard_normal(3).tolist(),
           np.random.randint(0, 2**31, 3).tolist(), torch.rand(3).tolist())
    assert got == expected
