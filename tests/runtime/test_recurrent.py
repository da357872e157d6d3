"""R2D2 on a POMDP through the real path: it learns where a feed-forward agent cannot, and a run
resumes mid-way with its sequence replay (chunks, items, stored recurrent states) intact."""
import json
import os

from distrl import resume, train
from distrl.checkpoint.run import read_checkpoint
from distrl.replay.store import digest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
R2D2 = os.path.join(ROOT, "configs", "r2d2_position_only_cartpole.yaml")
APEX = os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml")
POMDP = "popgym.envs.position_only_cartpole:PositionOnlyCartPoleEasy"
QUIET = ["log.progress=false", "log.tensorboard=false"]
BUDGET = 450_000  # seeds 0-2 solve in 170k-220k env steps


def test_r2d2_uses_memory_where_feedforward_apex_cannot(tmp_path):
    """Velocities hidden: R2D2 reaches the greedy target within the budget, Ape-X DQN with the same budget does not."""
    recurrent = train(R2D2, run_dir=str(tmp_path / "r2d2"), overrides=[
        "mode=single", "seed=0", f"stop.max_env_steps={BUDGET}", "stop.max_seconds=150", *QUIET])
    assert recurrent["solved"] and recurrent["best_eval_return"] >= 0.95, recurrent
    feedforward = train(APEX, run_dir=str(tmp_path / "apex"), overrides=[
        "mode=single", "seed=0", f"env.id={POMDP}", "eval.target_return=0.95",
        f"stop.max_env_steps={BUDGET}", "stop.max_seconds=150", *QUIET])
    assert feedforward["stop_reason"] == "max_env_steps" and feedforward["env_steps"] >= BUDGET
    assert not feedforward["solved"] and feedforward["best_eval_return"] < 0.6, feedforward


def test_r2d2_resumes_with_its_sequence_replay_through_ray_actors(ray_session, tmp_path):
    run_dir = str(tmp_path / "run")
    first = train(R2D2, run_dir=run_dir, overrides=[
        "mode=sync", "workers=2", "stop.max_env_steps=8000", "eval.target_return=null", *QUIET])
    ckpts = sorted(d for d in os.listdir(os.path.join(run_dir, "checkpoints")) if d.startswith("ckpt-"))
    ckpt = os.path.join(run_dir, "checkpoints", ckpts[-1])
    state = read_checkpoint(ckpt)
    store = state["store"]
    assert state["meta"]["store_saved"] and digest(store) == state["meta"]["store_sha256"]
    states = store["items"]["state"]  # the recurrent state stored with each sequence: (items, 2, core) for an LSTM
    assert states.shape[1:] == (2, 64) and len(states) > 0 and (states != 0).any()
    assert state["meta"]["counters"]["env_steps"] == first["env_steps"] and first["updates"] > 0
    second = resume(run_dir, overrides=["stop.max_env_steps=12000"])
    log = json.loads(open(os.path.join(run_dir, "resumes.jsonl")).read().splitlines()[-1])
    # The replay the resumed server holds, stored recurrent states included, is the checkpoint's.
    assert log["store_sha256"] == state["meta"]["store_sha256"]
    assert (log["env_steps"], log["updates"]) == (first["env_steps"], first["updates"])
    assert second["env_steps"] >= 12000 and second["updates"] > first["updates"]
