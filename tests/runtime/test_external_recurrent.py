"""Memory from simulators that own their loop: PPO with an LSTM learns CartPole without velocities from two
simulator processes acting with the ONNX policy themselves (local inference: each episode's state kept by
the client), their episodes longer than a fragment cut into columns that store their states."""
import csv
import os

from distrl.api import train
from tests.runtime.test_external import ROOT, result, simulator

PPO_LSTM = os.path.join(ROOT, "configs", "ppo_lstm_position_only_cartpole.yaml")
POMDP = "popgym.envs.position_only_cartpole:PositionOnlyCartPoleEasy"


def test_ppo_with_an_lstm_learns_a_pomdp_from_simulators_acting_locally(tmp_path):
    """Single mode (the server a thread of the driver), 4 envs in each of 2 simulators. Greedy 0.4 (80
    balanced steps of 200; a feedforward policy stays near 0.2, docs/guides/memory.md) took 39k-70k env
    steps in 5 runs (18-23 s a test on an idle 2-core VM); the budget is 200k. Training episodes grow longer
    than a fragment (32 steps: a return of 0.16; the mean reached 0.25-0.46), so it learned from cut ones."""
    run_dir = str(tmp_path / "run")
    sims = [simulator(run_dir, 300, seed, "--env", POMDP, "--inference", "local", "--envs", "4",
                      "--weights-interval", "0.5", "--reconnect", "2") for seed in (1, 2)]
    try:
        summary = train(PPO_LSTM, run_dir=run_dir, overrides=[
            "external.enabled=true", "seed=0", "eval.target_return=0.4", "stop.max_env_steps=200000",
            "stop.max_seconds=150", "log.progress=false", "log.tensorboard=false"])
    finally:
        outs = [result(p) for p in sims]
    assert summary["solved"] and summary["best_eval_return"] >= 0.4, summary
    assert summary["external"]["clients"] == 2 and summary["external"].get("errors", 0) == 0, summary["external"]
    assert all(o["steps"] > 0 for o in outs), outs
    with open(os.path.join(run_dir, "metrics.csv")) as fh:
        train_returns = [float(row["train_return_mean"]) for row in csv.DictReader(fh) if row["train_return_mean"]]
    assert max(train_returns) >= 0.17, train_returns  # episodes of 34 steps and more on average
