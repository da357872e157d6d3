"""Shared fixtures: one embedded Ray for the whole session (starting it costs ~6 s); and how `make test`'s two
pytest processes share the modules."""
from __future__ import annotations

import pytest

# Modules whose runs mostly wait (paced envs, the fault timeouts at their defaults): one pytest process runs
# them one after another, so the two processes are never both waiting while the cores idle.
WAITING_MODULES = ("tests/runtime/test_chaos.py", "tests/runtime/test_faults.py", "tests/runtime/test_hangs.py")


# Modules of whole runs (Ray, a learning budget): tens of seconds to minutes each.
LONG_MODULES = ("tests/runtime/", "tests/docsgen/test_examples.py")


def _cost_rank(module: str) -> int:
    return 0 if module == WAITING_MODULES[0] else 1 if module.startswith(LONG_MODULES) else 2


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` (one module per process at a time, its module fixtures built once), with the waiting
    modules as one unit of work, handed out first."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class WaitingTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = super()._split_scope(nodeid)
            return WAITING_MODULES[0] if module in WAITING_MODULES else module

        def _assign_work_unit(self, node) -> None:
            # The longest units first (the waiting ones, then the runs), the quick modules last: they even
            # out the two processes' ends.
            self.workqueue.move_to_end(min(self.workqueue, key=_cost_rank), last=False)
            super()._assign_work_unit(node)

    return WaitingTogether(config, log)


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
