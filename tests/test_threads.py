"""Every role's process: one BLAS thread and one torch thread."""
import time

import pytest
import torch
from threadpoolctl import threadpool_info

from distrl.threads import ThreadChoice, learner_threads, one_compute_thread


def test_one_compute_thread():
    one_compute_thread(load_torch=True)
    assert torch.get_num_threads() == 1
    assert all(pool["num_threads"] == 1 for pool in threadpool_info() if pool["user_api"] == "blas")


def test_a_learner_tries_one_thread_and_the_free_cores_then_keeps_the_faster():
    choice = ThreadChoice(4, trial_updates=10, free_cores=lambda: 4.0)
    tried, seconds_per_update = [], {1: 0.02, 4: 0.01}
    while choice.chosen is None:
        n = choice.threads()
        tried.append(n)
        choice.record(n, 4 * seconds_per_update[n], 4)  # a call of 4 updates
    assert sorted(set(tried)) == [1, 4] and tried[:3] == [1, 4, 1]  # alternating, not one after the other
    assert choice.chosen == 4 and choice.threads() == 4
    slow_net = ThreadChoice(2, trial_updates=10, free_cores=lambda: 2.0)
    while slow_net.chosen is None:
        n = slow_net.threads()
        slow_net.record(n, 0.015 * 5 if n == 2 else 0.01 * 5, 5)  # hand-offs cost more than they give
    assert slow_net.threads() == 1 and slow_net.trial[2][1] >= 10


def test_threads_far_slower_are_dropped_at_once_and_a_busy_machine_trains_on_one():
    choice = ThreadChoice(2, trial_updates=100, free_cores=lambda: 2.0)
    choice.record(1, 0.1, 10)
    choice.record(2, 5.0, 10)  # oversubscribed: threads spinning on each other
    assert choice.chosen == 1
    free = [2.0]
    busy = ThreadChoice(2, trial_updates=10, free_cores=lambda: free[0])
    busy.chosen, busy.chosen_at = 2, time.monotonic()
    free[0] = 0.8  # another process took a core
    assert busy.threads() == 1
    free[0] = 1.9
    assert busy.threads() == 2


def test_the_choice_is_measured_again_after_a_while():
    choice = ThreadChoice(2, trial_updates=1, recheck_s=0.0, free_cores=lambda: 2.0)
    choice.record(choice.threads(), 0.1, 1)
    choice.record(choice.threads(), 0.2, 1)
    assert choice.chosen is not None
    time.sleep(0.01)
    choice.threads()
    assert choice.chosen is None and choice.trial == {}


@pytest.mark.parametrize("fixed, mode, workers, cpus, deterministic, most, measured", [
    (0, "single", 2, 2, False, 2, True), (0, "sync", 4, 16, False, 16, True), (0, "async", 12, 16, False, 4, True),
    (0, "async", 2, 2, False, 1, False), (0, "single", 1, 2, True, 1, False), (3, "async", 2, 2, False, 3, False)])
def test_a_learner_may_take_the_cores_nothing_else_uses_while_it_trains(fixed, mode, workers, cpus, deterministic,
                                                                        most, measured):
    choice = learner_threads(fixed, mode, workers, cpus, deterministic)
    assert choice.most == most and (choice.chosen is None) is measured


def test_a_learner_loop_trains_on_the_chosen_threads_and_samples_on_one():
    from tests.roles.test_learning import APEX, wired

    loop = wired("apex_dqn_cartpole.yaml", APEX, 2)
    seen = []
    update = loop.learner.update
    loop.learner.update = lambda batch: seen.append(torch.get_num_threads()) or update(batch)
    loop.threads = ThreadChoice(2, fixed=True)
    loop.train(4)
    assert seen == [2] * 4 and torch.get_num_threads() == 1


def test_a_trial_of_slow_updates_ends_on_its_time_not_its_update_count():
    """Updates of seconds each (Atari PPO's 1,024 frames): 64 a side would take minutes, most of a short run,
    half of them on the slower side; two a side past `trial_s` decide."""
    choice = ThreadChoice(2, trial_updates=64, trial_s=2.0, free_cores=lambda: 2.0)
    seconds_per_update, tried = {1: 2.8, 2: 1.5}, []
    while choice.chosen is None:
        n = choice.threads()
        tried.append(n)
        choice.record(n, seconds_per_update[n], 1)
    assert choice.chosen == 2 and tried[:2] == [1, 1] and sorted(tried) == [1, 1, 2, 2]


def test_a_small_update_trains_on_one_thread_without_a_trial():
    """A small MLP's update (a millisecond): no update ever runs on more threads, not even in a trial."""
    choice = ThreadChoice(2, free_cores=lambda: 2.0)
    tried = []
    for seconds in (0.02, 0.001, 0.001, 0.001):  # the first call's set-up is slow; the next one decides
        n = choice.threads()
        tried.append(n)
        choice.record(n, seconds, 1)
    assert tried == [1, 1, 1, 1] and choice.chosen == 1


def test_other_processes_busy_while_the_learner_trains_are_counted_and_its_own_threads_are_not():
    import subprocess
    import sys

    from distrl.threads import OthersBusy, usable_cpus

    others = OthersBusy()
    spinner = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time() + 3\nwhile time.time() < t: pass"])
    try:
        time.sleep(0.5)  # started
        others.mark()
        time.sleep(1.0)  # a "call" during which another process keeps a core busy
        others.read()
    finally:
        spinner.kill()
        spinner.wait()
    assert others.cores >= 0.6, others.cores
    # This process busy on every core it may use: its own threads are not another's load. What the other
    # processes (a test suite's other worker among them) do meanwhile varies, so the check is that this
    # process's CPU time and the others' estimate together fit in the cores: counting its own threads as
    # others' would count them twice.
    threads = torch.get_num_threads()
    torch.set_num_threads(usable_cpus())
    try:
        others.mark()
        wall, own = time.monotonic(), time.process_time()
        x = torch.ones(256, 256)
        while time.monotonic() - wall < 1.0:
            x = torch.tanh(x @ x)
        others.read()
        wall, own = time.monotonic() - wall, time.process_time() - own
    finally:
        torch.set_num_threads(threads)
    assert own / wall >= 0.3, own / wall
    assert others.cores + own / wall <= usable_cpus() + 0.25, (others.cores, own / wall)


def test_the_minute_view_counts_what_other_processes_did_between_calls():
    from distrl.threads import OthersBusy, usable_cpus

    others = OthersBusy()
    others.history = [(0.0, 0.0, 0.0), (10.0, 15.0, 5.0)]  # 15 CPU-s busy in 10 s, 5 of them this process's
    assert others.minute() == 1.0 and others.free_cores() == usable_cpus() - 1.0
    others.history = [(0.0, 0.0, 0.0), (2.0, 4.0, 0.0)]  # under 5 s of marks: not yet a view
    assert others.minute() == 0.0
