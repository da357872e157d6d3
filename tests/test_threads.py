"""Every role's process: one BLAS thread and one torch thread."""
import torch
from threadpoolctl import threadpool_info

from distrl.threads import one_compute_thread


def test_one_compute_thread():
    one_compute_thread(load_torch=True)
    assert torch.get_num_threads() == 1
    assert all(pool["num_threads"] == 1 for pool in threadpool_info() if pool["user_api"] == "blas")
