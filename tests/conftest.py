"""Shared fixtures: one embedded Ray for the whole session (starting it costs ~6 s)."""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """Small nets on a 2-core machine: intra-op threads only add contention (as in every role)."""
    from distrl.threads import one_compute_thread

    one_compute_thread(load_torch=True)


@pytest.fixture(scope="session")
def ray_session():
    from distrl.runtime.ray_setup import init_ray

    import ray

    init_ray(None)
    yield
    ray.shutdown()
