"""Ape-X DQN through Ray (sync mode) on MiniGrid's Dict observation: its image leaf stored once per frame in
the replay server, the learner trained on it, the replay checkpointed with its frames and restored on resume."""
import glob
import json
import os

from distrl import resume, train
from distrl.checkpoint.run import read_checkpoint
from distrl.replay.store import digest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml")
MINIGRID = ["env.id=minigrid:MiniGrid-Empty-5x5-v0", "env.obs_keys=[image, direction]",
            "model.encoders={image: codes}"]
QUIET = ["log.progress=false", "log.tensorboard=false", "eval.episodes=2", "eval.interval_s=0.5"]
VIEW = 7 * 7 * 3  # bytes of MiniGrid's uint8 view


def test_apex_sync_stores_a_dict_image_leaf_once_per_frame_trains_and_resumes_its_replay(ray_session, tmp_path):
    run_dir = str(tmp_path / "run")
    first = train(CONFIG, run_dir=run_dir, overrides=[
        "mode=sync", "workers=1", *MINIGRID, "replay.min_size=500", "apex_dqn.eps_decay_steps=2000",
        "stop.max_env_steps=4000", "eval.target_return=null", *QUIET])
    assert first["stop_reason"] == "max_env_steps" and first["failure"] is None, first
    assert first["updates"] > 0 and first["best_eval_return"] is not None
    # A transition holds its view once (its share of the frame ring), where obs and next_obs would hold it twice.
    assert VIEW < first["replay_bytes_per_item"] < 2 * VIEW
    ckpt = sorted(glob.glob(os.path.join(run_dir, "checkpoints", "ckpt-*")))[-1]
    meta = json.load(open(os.path.join(ckpt, "meta.json")))
    store = read_checkpoint(ckpt)["store"]
    assert store["frames/obs.image"]["frames"].shape[1:] == (7, 7, 3) and "storage/obs.direction" in store
    assert digest(store) == meta["store_sha256"] is not None
    second = resume(run_dir, overrides=[f"stop.max_env_steps={first['env_steps'] + 1000}"])
    log = json.loads(open(os.path.join(run_dir, "resumes.jsonl")).read().splitlines()[-1])
    assert log["checkpoint"] == ckpt and log["store_sha256"] == meta["store_sha256"]
    assert second["stop_reason"] == "max_env_steps" and second["updates"] > first["updates"], second
