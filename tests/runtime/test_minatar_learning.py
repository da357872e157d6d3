"""Learning from pixels: Ape-X DQN with the MinAtar CNN on MinAtar Breakout (10x10 frames), the shipped config in
its own single mode, within a step budget. The target is below the config's 10: its first evaluations score
about 0.5-1, and its three seeds pass 4 by 175k env steps (bench/results/solve_apex_dqn_minatar_breakout.json)."""
import os

from distrl import train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "apex_dqn_minatar_breakout.yaml")
BUDGET = 300_000


def test_apex_dqn_learns_minatar_breakout_within_a_step_budget(tmp_path):
    summary = train(CONFIG, run_dir=str(tmp_path / "run"), overrides=[
        "seed=2", "eval.target_return=3", "eval.interval_s=5", f"stop.max_env_steps={BUDGET}",
        "stop.max_seconds=300", "log.progress=false", "log.tensorboard=false"])
    assert summary["solved"] and summary["best_eval_return"] >= 3, summary
    assert summary["env_steps"] <= BUDGET + 20_000, summary  # the last gather's fragments may overshoot
