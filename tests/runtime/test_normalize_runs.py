"""env.normalize through real runs: the learner's statistics are exactly those of one pass over the raw
observations the workers' envs produced (as far as their fragments reached the learner), in single mode
and as Ray actors in sync and async mode; a resumed run continues them; the evaluator adds nothing."""
import glob
import os
from itertools import product

import numpy as np
import pytest
import torch

from distrl import train
from distrl.api import resume
from distrl.envs.normalize import RunningStats, SharedStatistics
from tests.envs.raw_observations import first_steps, recorded

T, E = 16, 2  # fragment length, envs per worker


def config(mode: str, directory: str, steps: int, env_id: str = "Pendulum-v1", leaf: str | None = None) -> dict:
    """`leaf`: the Dict observation's leaf the raw files record."""
    return {
        "algo": "ppo", "mode": mode, "workers": 2, "seed": 100,
        "env": {"id": env_id, "num_envs": E, "kwargs": {"max_episode_steps": 50},
                "wrappers": [{"tests.envs.raw_observations:RecordRawObservations": {"directory": directory,
                                                                                     "leaf": leaf},
                              "train_only": True}],
                "normalize": {"obs": True, "reward": True, "clip": 5.0, "gamma": 0.95}},
        "rollout": {"fragment_length": T}, "ppo": {"epochs": 1, "minibatches": 1},
        "eval": {"interval_s": 0.5, "episodes": 2}, "stop": {"max_env_steps": steps, "max_seconds": 120},
        "log": {"progress": False, "tensorboard": False}, "checkpoint": {"interval_s": 3600},
    }


def learner_statistics(run_dir: str, parts=("obs", "ret")) -> RunningStats:
    """The learner's statistics of the first of `parts`, which are all the parts it has."""
    newest = sorted(glob.glob(os.path.join(run_dir, "checkpoints", "ckpt-*")))[-1]
    blob = torch.load(os.path.join(newest, "learner.pt"), weights_only=True)
    stats = SharedStatistics()
    stats.load({k: v.numpy() for k, v in blob["learner"]["statistics"].items()})
    assert set(stats.parts) == set(parts)
    assert len({stats.parts[p].count for p in parts if p != "ret"}) == 1  # every leaf saw every row
    return stats.parts[parts[0]]


def one_pass(rows: list[np.ndarray]) -> RunningStats:
    return RunningStats.of(np.concatenate(rows).astype(np.float64))


def assert_equal_stats(got: RunningStats, want: RunningStats):
    assert got.count == want.count
    np.testing.assert_allclose(got.mean, want.mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got.m2, want.m2, rtol=1e-9)


def fragments_merged(files: dict, count: float):
    """Candidates for the rows of the fragments that reached the learner: each worker's (pid's) first k
    fragments (k * T steps of each of its envs), k per worker, whose rows add up to the merged count."""
    pids = sorted({name.split("-")[0] for name in files})
    most = {pid: min(int(s.sum()) for n, (_, s) in files.items() if n.startswith(pid + "-")) // T for pid in pids}
    for ks in product(*(range(most[pid] + 1) for pid in pids)):
        k_of = dict(zip(pids, ks))
        rows = [first_steps(obs, stepped, k_of[name.split("-")[0]] * T) for name, (obs, stepped) in files.items()]
        if sum(len(r) for r in rows) == count:
            yield rows


def test_single_mode_statistics_are_one_pass_over_every_raw_observation_and_resume_continues_them(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    run_dir = str(tmp_path / "run")
    train(config("single", str(raw), 600), run_dir=run_dir)
    first = learner_statistics(run_dir)
    files = recorded(str(raw))
    assert len(files) == E  # one file per env of the one (in-process) worker; the evaluator records nothing
    assert_equal_stats(first, one_pass([obs for obs, _ in files.values()]))

    resume(run_dir, overrides=["stop.max_env_steps=1200"])
    after = learner_statistics(run_dir)
    files = recorded(str(raw))  # the same envs (same process, same seeds): the resumed run's rows appended
    assert after.count > first.count + 500
    assert_equal_stats(after, one_pass([obs for obs, _ in files.values()]))  # carried on from the checkpoint, not from zero


# A flat observation in async mode (fragments gathered as they come), a Dict one in sync mode.
@pytest.mark.parametrize("mode, env_id, parts", [
    ("async", "Pendulum-v1", ("obs", "ret")),
    # a Dict observation: a part per float leaf (the uint8 clock has none); the raw files hold `pole`
    ("sync", "distrl.envs.testing:DictCartPole-v1", ("obs.pole", "obs.cart", "ret")),
])
def test_ray_workers_statistics_merge_exactly_at_the_learner(tmp_path, ray_session, mode, env_id, parts):
    raw = tmp_path / "raw"
    raw.mkdir()
    run_dir = str(tmp_path / "run")
    leaf = parts[0].split(".")[1] if "." in parts[0] else None
    summary = train(config(mode, str(raw), 800, env_id, leaf), run_dir=run_dir)
    files = recorded(str(raw))
    assert len({name.split("-")[0] for name in files}) == 2 and len(files) == 2 * E  # two worker processes
    got = learner_statistics(run_dir, parts)
    assert got.count >= 0.5 * summary["env_steps"]  # most fragments reached the learner
    candidates = list(fragments_merged(files, got.count))
    assert candidates, f"no prefix of the workers' fragments has {got.count} rows"
    errors = []
    for rows in candidates:  # the one prefix whose statistics these are
        try:
            assert_equal_stats(got, one_pass(rows))
            return
        except AssertionError as e:
            errors.append(str(e))
    raise AssertionError(f"no prefix of the workers' fragments gives the learner's statistics: {errors[:2]}")
