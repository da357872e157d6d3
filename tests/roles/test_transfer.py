"""The learner's data movement: blocks made ready by a thread, and weights published from snapshots by
another, never half-written."""
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from distrl.algos.common import as_tensors
from distrl.roles.transfer import BlockFeeder, WeightPublisher, on_device


def constant_net() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))


def set_all(net: torch.nn.Module, value: float) -> None:
    with torch.no_grad():
        for p in net.parameters():
            p.fill_(value)


def test_a_sent_snapshot_is_always_one_whole_version_while_training_goes_on():
    """The training thread rewrites every weight between publications and publishes without waiting;
    sending is slow (it reads the snapshot twice, a while apart). Every set sent holds one version's
    values only, versions only grow, and publishing with `wait` sends the newest."""
    net = constant_net()
    sent: list[tuple[int, float]] = []

    def send(version, weights, restored):
        first = {k: v.copy() for k, v in weights.items()}
        time.sleep(0.003)  # a slow transfer: the training thread writes new weights meanwhile
        for k, v in weights.items():
            assert np.array_equal(v, first[k]), "the snapshot changed while it was being sent"
        values = np.unique(np.concatenate([v.ravel() for v in weights.values()]))
        assert values.size == 1, f"version {version} mixes weights of several versions: {values[:5]}"
        sent.append((version, float(values[0])))

    publisher = WeightPublisher(net.state_dict, send, "cpu", threaded=True)
    skipped = 0
    for version in range(1, 400):
        set_all(net, float(version))
        skipped += not publisher.publish(version)
        time.sleep(0.0005)  # an update
    set_all(net, 400.0)
    assert publisher.publish(400, wait=True)
    assert sent[-1] == (400, 400.0)
    assert all(version == value for version, value in sent)
    assert [v for v, _ in sent] == sorted(v for v, _ in sent)
    assert skipped > 0 and len(sent) > 10  # some were skipped while one was in flight, many went out


def test_a_snapshot_with_a_nan_is_never_sent():
    net = constant_net()
    sent = []
    publisher = WeightPublisher(net.state_dict, lambda v, w, r: sent.append(v), "cpu", threaded=True)
    publisher.publish(1, wait=True)
    set_all(net, float("nan"))
    publisher.publish(2, wait=True)
    assert sent == [1] and publisher.poisoned


def test_a_threaded_feeder_hands_the_blocks_asked_for_cut_to_the_budget_of_the_call():
    rng = np.random.default_rng(0)
    blocks = {n: ({"obs": rng.integers(0, 255, (n, 4, 3), dtype=np.uint8), "rewards": rng.random((n, 4))},
                  np.arange(n * 4).reshape(n, 4), rng.random((n, 4))) for n in (1, 2, 3)}
    asked, fetched_on = [], []

    def receive(n):
        fetched_on.append(threading.current_thread().name)
        return blocks[n]

    feeder = BlockFeeder(lambda n: asked.append(n) or n, receive, "cpu", ThreadPoolExecutor(1, "distrl-feed"))
    ready = feeder.take(3)
    assert ready.size == 3 and ready.batches["obs"].dtype == np.uint8  # frames stay bytes
    np.testing.assert_array_equal(ready.batches["obs"], blocks[3][0]["obs"])
    feeder.ask(3)  # asked for before the next call's budget is known
    cut = feeder.take(2)
    assert cut.size == 2 and cut.host[1].shape == (2, 4) and cut.weights.shape == (2, 4)
    np.testing.assert_array_equal(cut.batches["rewards"], blocks[3][0]["rewards"][:2])
    assert asked == [3, 3] and all(name.startswith("distrl-feed") for name in fetched_on)
    assert feeder.take(1).size == 1 and asked == [3, 3, 1]


def test_a_blocks_batches_become_an_updates_tensors_without_a_copy_on_the_cpu():
    batches = {"obs": np.zeros((2, 4, 3), np.float32)}
    ready = on_device((batches, None, None), "cpu")
    tensors = as_tensors({"obs": ready.batches["obs"][1]}, "cpu")
    assert tensors["obs"].data_ptr() == batches["obs"][1].__array_interface__["data"][0]
