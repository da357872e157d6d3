"""NaN and inf never reach the weights: from the env (counted like an env exception) or from a loss
(the update is skipped and counted; nothing non-finite is published or checkpointed), in one process and
through Ray's actors."""
import csv
import glob
import os
import threading
import time

import numpy as np
import pytest
import torch

from distrl import train
from distrl.checkpoint import load_weights
from distrl.checkpoint.run import read_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARTPOLE = os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml")
QUIET = ["log.progress=false", "log.tensorboard=false"]


def all_finite(tree) -> bool:
    if isinstance(tree, torch.Tensor):
        return bool(torch.isfinite(tree).all()) if tree.is_floating_point() else True
    if isinstance(tree, dict):
        return all(all_finite(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return all(all_finite(v) for v in tree)
    return not isinstance(tree, float) or np.isfinite(tree)


def test_nan_observations_and_rewards_from_the_env_are_counted_and_the_run_still_solves(tmp_path):
    summary = train(CARTPOLE, run_dir=str(tmp_path / "run"), overrides=[
        "mode=single", "seed=0", "env.id=distrl.envs.testing:NaNCartPole-v1", "env.kwargs={nan_prob: 0.002}",
        "stop.max_env_steps=300000", "stop.max_seconds=150", *QUIET])
    assert summary["env_errors"] > 10 and summary["nonfinite_updates"] == 0, summary
    assert summary["solved"], summary


@pytest.mark.parametrize("replay, reason", [
    # Uniform replay, small batches: a few batches hold an overflowing reward, the rest train on.
    (["replay.prioritized=false", "learner.batch_size=64", "fault.max_nonfinite_updates=100000"], "max_env_steps"),
    # Prioritized: the overflowing item's priority dominates, every batch holds it, the run stops.
    (["replay.prioritized=true", "fault.max_nonfinite_updates=3"], "nonfinite"),
])
def test_a_nonfinite_loss_skips_the_update_and_nothing_nonfinite_is_published_or_saved(tmp_path, replay, reason):
    """Rewards of 3e38 overflow the float32 loss to inf on a batch that holds one: the update is skipped
    and counted; after fault.max_nonfinite_updates in a row the run stops, its last checkpoint good."""
    run_dir = str(tmp_path / "run")
    summary = train(CARTPOLE, run_dir=run_dir, overrides=[
        "mode=single", "seed=0", "env.id=distrl.envs.testing:HugeRewardCartPole-v1", "env.kwargs={huge_prob: 0.0005}",
        "stop.max_env_steps=30000", "eval.target_return=null", "checkpoint.interval_s=1", *replay, *QUIET])
    assert summary["nonfinite_updates"] > 0 and summary["stop_reason"] == reason, summary
    if reason == "nonfinite":
        assert "fault.max_nonfinite_updates=3" in summary["failure"]
    else:
        assert summary["updates"] > 10 * summary["nonfinite_updates"]
    best = os.path.join(run_dir, "checkpoints", "best.safetensors")
    if reason != "nonfinite" or os.path.exists(best):  # a run stopped that early may have had no evaluation
        weights, _ = load_weights(best)
        assert all(np.isfinite(w).all() for w in weights.values())
    ckpts = sorted(glob.glob(os.path.join(run_dir, "checkpoints", "ckpt-*")))
    assert ckpts and all(all_finite(read_checkpoint(c)["learner"]) for c in ckpts)


def read_parameter_server(roles: list, seen: dict, done: threading.Event) -> None:
    """Every weight version the run's ParameterServer actor hands out while it runs -> whether all finite."""
    import ray

    version = -1
    while not done.is_set():
        try:
            got = ray.get(roles[0].ps.pull_if_changed.remote(version), timeout=5) if roles else None
            if got is not None:
                version, weights = got
                seen[version] = all(np.isfinite(w).all() for w in weights.values())
        except (ray.exceptions.RayError, TimeoutError):
            return  # the run ended and took its actors with it
        time.sleep(0.05)


def test_in_sync_mode_a_nonfinite_loss_skips_the_update_and_the_parameter_server_and_checkpoints_stay_finite(
        ray_session, tmp_path, monkeypatch):
    """Overflowing rewards through Ray's actors (workers, replay server, learner, parameter server): the learner
    skips and counts the updates whose loss is inf, and the run trains on. Every weight version read from the
    parameter server while the run goes, the best weights and every checkpoint are finite.

    The non-finite number comes from real data on the real path: a NaN or inf from the env never reaches a
    batch (it ends the episode), so the env pays a finite reward of 3e38 and the Huber loss's mean of a
    uniform batch of 64 that holds two such targets overflows to inf (one batch in 50 to 200 here)."""
    from distrl.runtime import launch

    roles: list = []  # the run's RayRoles, to reach its ParameterServer actor
    make_roles = launch.make_roles
    monkeypatch.setattr(launch, "make_roles", lambda *a, **k: roles.append(make_roles(*a, **k)) or roles[-1])
    seen: dict[int, bool] = {}
    done = threading.Event()
    reader = threading.Thread(target=read_parameter_server, args=(roles, seen, done), daemon=True)
    reader.start()
    run_dir = str(tmp_path / "run")
    try:
        summary = train(CARTPOLE, run_dir=run_dir, overrides=[
            "mode=sync", "workers=1", "seed=0", "env.id=distrl.envs.testing:HugeRewardCartPole-v1",
            "env.kwargs={huge_prob: 0.001}", "replay.prioritized=false", "learner.batch_size=64",
            "replay.samples_per_insert=8", "fault.max_nonfinite_updates=100000", "stop.max_env_steps=15000",
            "eval.target_return=null", "eval.interval_s=0.5", "checkpoint.interval_s=1", "log.interval_s=0.25", *QUIET])
    finally:
        done.set()
        reader.join(timeout=15)
    assert summary["nonfinite_updates"] > 0 and summary["stop_reason"] == "max_env_steps", summary
    assert summary["updates"] > 10 * summary["nonfinite_updates"], summary
    rows = list(csv.DictReader(open(os.path.join(run_dir, "metrics.csv"))))
    first_skip = next(int(r["weight_version"]) for r in rows if int(r["nonfinite_updates"]) > 0)
    assert len(seen) >= 10 and max(seen) > first_skip, (sorted(seen), first_skip)  # read after updates were skipped
    assert all(seen.values()), {v: ok for v, ok in seen.items() if not ok}
    weights, _ = load_weights(os.path.join(run_dir, "checkpoints", "best.safetensors"))
    assert all(np.isfinite(w).all() for w in weights.values())
    ckpts = sorted(glob.glob(os.path.join(run_dir, "checkpoints", "ckpt-*")))
    assert ckpts and all(all_finite(read_checkpoint(c)["learner"]) for c in ckpts)
