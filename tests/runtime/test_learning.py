"""Learning test: async mode, 2 Ray workers, greedy eval >= 475 on CartPole-v1 within a step budget."""
import os

from distrl import train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_async_two_workers_solves_cartpole(ray_session, tmp_path):
    summary = train(os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml"), run_dir=str(tmp_path / "run"),
                    overrides=["mode=async", "workers=2", "seed=0", "stop.max_env_steps=300000",
                               "stop.max_seconds=240", "log.progress=false", "log.tensorboard=false"])
    assert summary["solved"], summary
    assert summary["best_eval_return"] >= 475
    assert summary["env_steps"] <= 300000
