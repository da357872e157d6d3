"""DHC on the MAPF gridworld through the real path: it learns, the evaluator reports MAPF metrics,
and a run resumes with per-agent recurrent states and communication masks in its replay intact."""
import json
import os

import numpy as np

from distrl import resume, train
from distrl.checkpoint.run import read_checkpoint
from distrl.replay.store import digest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DHC = os.path.join(ROOT, "configs", "dhc_mapf_8x8.yaml")
QUIET = ["log.progress=false", "log.tensorboard=false"]


def test_dhc_reaches_90_percent_success_on_4_agents_8x8(tmp_path):
    """Seeds 0-2 reach it in 50k-80k env steps; the budget leaves about 3x."""
    run_dir = str(tmp_path / "run")
    summary = train(DHC, run_dir=run_dir, overrides=["mode=single", "seed=0", "stop.max_env_steps=250000",
                                                     "stop.max_seconds=300", *QUIET])
    assert summary["solved"], summary
    best = json.load(open(os.path.join(run_dir, "checkpoints", "best.json")))
    metrics = best["metrics"]
    assert metrics["success_rate"] >= 0.9
    assert {"agent_success", "makespan", "sum_of_costs", "collisions"} <= set(metrics)
    assert metrics["makespan"] <= 64 and metrics["sum_of_costs"] <= 4 * 64


def test_dhc_resumes_with_hidden_states_and_comm_masks_in_replay(ray_session, tmp_path):
    run_dir = str(tmp_path / "run")
    first = train(DHC, run_dir=run_dir, overrides=["mode=sync", "workers=2", "stop.max_env_steps=6000",
                                                   "replay.min_size=50", "eval.target_success=null", *QUIET])
    ckpts = sorted(d for d in os.listdir(os.path.join(run_dir, "checkpoints")) if d.startswith("ckpt-"))
    state = read_checkpoint(os.path.join(run_dir, "checkpoints", ckpts[-1]))
    store = state["store"]
    assert digest(store) == state["meta"]["store_sha256"]
    states, masks = store["items"]["state"], store["chunks"]["data"]["comm_mask"]
    assert states.shape[1:] == (4, 1, 64) and (states != 0).any()  # a GRU state per agent per sequence
    assert masks.shape[2:] == (4, 4) and masks.any() and not masks.all()  # per step, as the env computed it
    assert not np.diagonal(masks, axis1=-2, axis2=-1).any()
    second = resume(run_dir, overrides=["stop.max_env_steps=9000"])
    log = json.loads(open(os.path.join(run_dir, "resumes.jsonl")).read().splitlines()[-1])
    assert log["store_sha256"] == state["meta"]["store_sha256"]
    assert (log["env_steps"], log["updates"]) == (first["env_steps"], first["updates"])
    assert second["env_steps"] >= 9000 and second["updates"] > first["updates"]
