"""MAPPO through the real path: a recurrent actor learns a team task that needs memory where a feedforward one
cannot, and a masked recurrent team trains in async mode through Ray actors and the central inference server
without ever taking a masked action, in training, in evaluation, in `distrl eval` and in its exported file."""
import json
import math
import os

import numpy as np

from distrl import train
from distrl.api import evaluate
from distrl.cli import main
from tests.run_files import episode_returns

QUIET = ["log.progress=false", "log.tensorboard=false"]
# Each agent sees its cue at the first of 6 steps and earns 1 at the last for acting on it: 1.0 remembering,
# 0.5 guessing. Seeds 0-2 reach 0.95 within 1,200 env steps (single mode, 16 envs x 12 steps per update).
MEMORY = ["algo=mappo", "mode=single", "seed=0", "env.id=distrl.envs.testing:CueMemory", "env.kwargs={length: 6}",
          "env.num_envs=16", "rollout.fragment_length=12", "model.hidden=[32]", "mappo.lr=0.003",
          "mappo.ent_coef=0.01", "eval.episodes=50", "eval.interval_s=1", "eval.target_return=0.95",
          "stop.max_seconds=90", *QUIET]


def test_a_recurrent_team_remembers_each_agents_cue_where_a_feedforward_one_cannot(tmp_path):
    recurrent = train(None, run_dir=str(tmp_path / "lstm"), overrides=[
        *MEMORY, "model.core=lstm", "stop.max_env_steps=20000"])
    assert recurrent["solved"] and recurrent["best_eval_return"] >= 0.95, recurrent
    # 100 agents' episodes per evaluation: a guess reaches 0.75 with odds of ~3e-7.
    feedforward = train(None, run_dir=str(tmp_path / "ff"), overrides=[*MEMORY, "stop.max_env_steps=10000"])
    assert feedforward["stop_reason"] == "max_env_steps" and feedforward["evaluations"] >= 1, feedforward
    assert not feedforward["solved"] and feedforward["best_eval_return"] < 0.75, feedforward


LENGTH = 20  # MaskedAgents' episode: a team that never acts masked returns exactly this per agent


def test_a_masked_recurrent_team_in_async_mode_through_ray_actors_and_central_inference(ray_session, tmp_path):
    """Three agents with observations of two sizes (padded), masks in their infos, a GRU actor with a state per
    agent row on the inference server, sequences of 8 steps, V-trace on late batches; its best checkpoint
    played by `distrl eval` and exported with its state."""
    run_dir = str(tmp_path / "run")
    summary = train(None, run_dir=run_dir, overrides=[
        "algo=mappo", "mode=async", "workers=2", "rollout.inference=central", "seed=3",
        "env.id=distrl.envs.testing:MaskedAgents", "env.kwargs={num_agents: 3, mask_in: info, sizes: [3, 5]}",
        "env.num_envs=8", "rollout.fragment_length=16", "rollout.recurrence=8", "model.hidden=[16]",
        "model.core=gru", "model.core_size=16", "eval.episodes=8", "eval.interval_s=0.3",
        "stop.max_env_steps=6000", "stop.max_seconds=90", "fault.max_env_errors=0", *QUIET])
    assert summary["env_steps"] >= 6000 and summary["env_errors"] == 0 and summary["failure"] is None, summary
    assert summary["evaluations"] >= 1 and summary["updates"] >= 10, summary
    assert summary["policy_lag"]["mean"] > 0.0, summary  # late batches: V-trace on the recurrent log-probs
    train_returns, eval_returns = map(set, episode_returns(run_dir))
    assert train_returns == {LENGTH} and eval_returns == {LENGTH}, (train_returns, eval_returns)
    with open(os.path.join(run_dir, "learner.jsonl")) as fh:
        stats = [json.loads(line) for line in fh]
    # The learner's distribution is the masked one: 3 legal actions of 6, never more entropy than log 3.
    assert stats and all(0.0 < s["entropy"] <= math.log(3) + 1e-5 for s in stats), stats
    assert all(0.0 <= s["sequences_cut"] <= 1.0 for s in stats)
    played = evaluate(run_dir, episodes=4)  # fresh states per episode, masks from the env's infos
    assert played["returns"] == [LENGTH] * 4, played
    path = str(tmp_path / "actor.onnx")
    assert main(["export", run_dir, "--onnx", path]) == 0
    import onnxruntime as ort

    session = ort.InferenceSession(path)
    assert [i.name for i in session.get_inputs()] == ["action_mask", "agent", "own.obs", "state"]
    mask = np.eye(6, dtype=np.int8)[[1, 4, 5]]  # one legal action per row: the file must take it
    action, _, state = session.run(None, {"action_mask": mask, "agent": np.arange(3),
                                          "own.obs": np.zeros((3, 5), np.float32),
                                          "state": np.zeros((3, 1, 16), np.float32)})
    assert action.tolist() == [1, 4, 5] and state.shape == (3, 1, 16)
