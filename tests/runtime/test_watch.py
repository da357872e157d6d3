"""RoleWatch over real Ray actors: a role Ray gives up on is reported lost once; the health looks taken
while the run winds down (a last checkpoint's waits) go on for the other roles without raising again."""
import os
import signal
import time

import pytest
import ray

from distrl.core import RoleLost
from distrl.runtime.actor_base import Traced, role_actor
from distrl.runtime.deaths import ActorTable
from distrl.runtime.faultlog import FaultLog
from distrl.runtime.heartbeat import Heartbeats
from distrl.runtime.watch import RoleWatch


@ray.remote(max_restarts=0, num_cpus=0)
class Role:
    def pid(self) -> int:
        return os.getpid()


def test_a_role_reported_lost_is_not_reported_again_while_the_run_winds_down(ray_session):
    actors = {"evaluator": Role.remote(), "learner": Role.remote()}
    table = ActorTable(FaultLog(None, time.time(), console=False), interval_s=0.0)
    for name, actor in actors.items():
        table.track(actor, name, name)
    watch = RoleWatch(actors, Heartbeats(table, timeout_s=10.0, interval_s=0.0), start_s=60.0)
    assert watch.wait_for("evaluator") is False and watch.wait_for("learner") is False
    ray.kill(actors["evaluator"], no_restart=True)
    deadline = time.time() + 30
    with pytest.raises(RoleLost, match="the evaluator died and its restarts are used up"):
        while time.time() < deadline:
            watch.poll()
            time.sleep(0.05)
    # Winding down: the looks go on, the learner is still watched, the lost evaluator is not raised again.
    pid = ray.get(actors["learner"].pid.remote())
    for _ in range(5):
        watch.poll()
        time.sleep(0.05)
    assert watch.pids["learner"] == pid and watch.lost == {"evaluator"}
    # A wait on the lost role itself still fails at once.
    t0 = time.time()
    with pytest.raises(RoleLost, match="evaluator"):
        watch.wait_for("evaluator")
    assert time.time() - t0 < 5
    ray.kill(actors["learner"], no_restart=True)


@role_actor(max_restarts=1, num_cpus=0)
class Busy(Traced):
    def work(self, seconds: float) -> int:
        time.sleep(seconds)  # an evaluation, a checkpoint or an env step far longer than the hang timeout
        return os.getpid()


def test_a_role_busy_in_a_call_longer_than_the_timeout_is_not_hung_and_a_stopped_one_is(ray_session):
    """Heartbeats are answered on the role's own thread: a call of 3x the timeout ends normally and nothing is
    ended, while the same role SIGSTOPped is ended (and restarted by Ray) within the timeout."""
    faults = FaultLog(None, time.time(), console=False)
    table = ActorTable(faults, interval_s=0.0)
    actor = Busy.remote()
    table.track(actor, "evaluator", "evaluator")
    beats = Heartbeats(table, timeout_s=1.5, interval_s=0.2)
    beats.watch("evaluator", actor)
    pid = ray.get(actor.pid.remote())
    beats.start()
    try:
        assert ray.get(actor.work.remote(4.5)) == pid  # 3x the timeout, answering its heartbeats meanwhile
        assert table.restarts("evaluator") == 0 and beats.answer["evaluator"][1] == pid
        os.kill(pid, signal.SIGSTOP)
        stopped = time.time()
        while time.time() - stopped < 10 and table.restarts("evaluator") == 0:
            time.sleep(0.1)
        assert table.restarts("evaluator") == 1, "a stopped role was not ended"
        assert time.time() - stopped < 1.5 + 3.0  # the timeout, a heartbeat's period and a look
    finally:
        beats.close()
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        ray.kill(actor, no_restart=True)
