"""Every role's process: one BLAS thread, one torch thread, and (with torch) denormals flushed."""
import numpy as np
import torch
from threadpoolctl import threadpool_info

from distrl.threads import one_compute_thread


def test_one_compute_thread_and_no_denormals():
    one_compute_thread(load_torch=True)
    assert torch.get_num_threads() == 1
    assert all(pool["num_threads"] == 1 for pool in threadpool_info() if pool["user_api"] == "blas")
    tiny = np.full(8, 1e-39, np.float32)  # denormal in float32
    assert float((tiny * np.float32(1.0)).max()) == 0.0  # flushed to zero: numpy shares the thread's FPU mode
    assert float((torch.from_numpy(tiny) * 1.0).max()) == 0.0
