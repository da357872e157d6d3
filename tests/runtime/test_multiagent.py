"""DHC on the MAPF gridworld through the real path: it learns, the evaluator reports MAPF metrics,
and a run resumes with per-agent recurrent states and communication masks in its replay intact; MAPPO
trains simple_spread through Ray actors and the central inference server, with discrete and continuous
actions."""
import json
import os

import numpy as np

from distrl import resume, train
from distrl.checkpoint.run import read_checkpoint
from distrl.config import load_config
from distrl.envs.mapf import MAPF
from distrl.replay.store import digest
from tests.runtime.test_inference import assert_the_server_batched_both_workers
from tests.runtime.test_trace import assert_trace_has_every_lane, run_lanes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DHC = os.path.join(ROOT, "configs", "dhc_mapf_8x8.yaml")
MAPPO = os.path.join(ROOT, "configs", "mappo_simple_spread.yaml")
QUIET = ["log.progress=false", "log.tensorboard=false"]


def bfs_lower_bounds(kwargs: dict, seeds: range) -> tuple[float, float]:
    """Mean over the maps of `seeds` of the makespan and sum of costs every agent would reach alone
    on its shortest path (no agent can do better): BFS distances from the starts to the goals."""
    env, makespans, costs = MAPF(**kwargs), [], []
    for seed in seeds:
        env.reset(seed=seed)
        alone = env.distances[np.arange(env.num_agents), env.positions[:, 0], env.positions[:, 1]]
        makespans.append(alone.max())
        costs.append(alone.sum())
    return float(np.mean(makespans)), float(np.mean(costs))


def test_dhc_reaches_90_percent_success_on_4_agents_8x8(tmp_path):
    """Seeds 0-2 reach it in 112k, 75k and 117k env steps (bench/results/solve_dhc_mapf_8x8_vs_53bd0a7.json):
    seed 1 is the one run here, and the step budget leaves over 2x for the slowest of the three (its time limit
    is only against a hang: 75k steps took 280 s on a slow 2-core VM beside the suite's other process)."""
    run_dir = str(tmp_path / "run")
    # No checkpoint before the end (each holds the ~1 GB replay): resume is tested below.
    summary = train(DHC, run_dir=run_dir, overrides=["mode=single", "seed=1", "stop.max_env_steps=250000",
                                                     "stop.max_seconds=900", "checkpoint.interval_s=3600", *QUIET])
    assert summary["solved"], summary
    best = json.load(open(os.path.join(run_dir, "checkpoints", "best.json")))
    metrics = best["metrics"]
    assert metrics["success_rate"] >= 0.9
    assert {"agent_success", "makespan", "sum_of_costs", "collisions"} <= set(metrics)
    # Solved episodes take near-shortest paths: under 2x the bounds on the maps evaluations are played
    # on (seed + 10 000 on; 8.5 steps and 21.8 moves). A failed episode's makespan is max_steps, so its
    # share comes out of the mean exactly; the sum of costs is averaged over the solved episodes alone.
    kwargs = load_config(DHC).env.kwargs
    makespan_lb, cost_lb = bfs_lower_bounds(kwargs, range(10_000, 11_000))
    solved = metrics["success_rate"]
    solved_makespan = (metrics["makespan"] - (1 - solved) * kwargs["max_steps"]) / solved
    assert solved_makespan <= 2.0 * makespan_lb, (metrics, makespan_lb)
    assert metrics["solved_sum_of_costs"] <= 2.0 * cost_lb, (metrics, cost_lb)


def test_dhc_resumes_with_hidden_states_and_comm_masks_in_replay(tmp_path):
    """Single mode: the store is the replay server's (a sequence replay resumed through Ray actors is
    tests/runtime/test_recurrent.py's R2D2 run)."""
    run_dir = str(tmp_path / "run")
    first = train(DHC, run_dir=run_dir, overrides=["mode=single", "stop.max_env_steps=4000",
                                                   "replay.min_size=50", "eval.target_success=null", *QUIET])
    ckpts = sorted(d for d in os.listdir(os.path.join(run_dir, "checkpoints")) if d.startswith("ckpt-"))
    state = read_checkpoint(os.path.join(run_dir, "checkpoints", ckpts[-1]))
    store = state["store"]
    assert digest(store) == state["meta"]["store_sha256"]
    states, masks = store["items"]["state"], store["chunks"]["data"]["comm_mask"]
    assert states.shape[1:] == (4, 1, 64) and (states != 0).any()  # a GRU state per agent per sequence
    assert masks.shape[2:] == (4, 4) and masks.any() and not masks.all()  # per step, as the env computed it
    assert not np.diagonal(masks, axis1=-2, axis2=-1).any()
    second = resume(run_dir, overrides=["stop.max_env_steps=6000"])
    log = json.loads(open(os.path.join(run_dir, "resumes.jsonl")).read().splitlines()[-1])
    assert log["store_sha256"] == state["meta"]["store_sha256"]
    assert (log["env_steps"], log["updates"]) == (first["env_steps"], first["updates"])
    assert second["env_steps"] >= 6000 and second["updates"] > first["updates"]


def test_mappo_trains_every_agent_through_ray_actors_and_central_inference(ray_session, tmp_path):
    """Sync mode, two workers acting through the inference server (a worker's E envs of N agents are E * N of
    its rows), which batches a step of both together, the learner on agents as columns, the evaluator scoring
    the mean per-agent return; the trace has a lane per process."""
    run_dir = str(tmp_path / "mappo")
    summary = train(MAPPO, run_dir=run_dir, overrides=[
        "mode=sync", "workers=2", "rollout.inference=central", "env.num_envs=4", "stop.max_env_steps=4000",
        "eval.interval_s=1", "eval.episodes=4", "log.trace=true", *QUIET])
    assert_the_server_batched_both_workers(run_dir)
    assert_trace_has_every_lane(run_dir, run_lanes("sync", workers=2, inference=True))
    assert summary["env_steps"] >= 4000 and summary["updates"] >= 4000 // (2 * 4 * 25) - 1, summary
    assert summary["evaluations"] >= 1 and -100.0 < summary["best_eval_return"] < 0.0  # a per-agent return
    with open(os.path.join(run_dir, "learner.jsonl")) as fh:
        stats = [json.loads(line) for line in fh]
    assert stats and all(np.isfinite(s["loss_value"]) and 0.0 < s["entropy"] <= np.log(5) + 1e-6 for s in stats)


def test_ippo_with_continuous_actions_trains_in_async_mode_through_central_inference(ray_session, tmp_path):
    """The continuous config, as `distrl train` starts it (its checks step the env with a Box action per
    agent), in async mode with a worker acting through the inference server: every agent's action a
    Gaussian's sample mapped onto MPE's Box(0, 1, (5,))."""
    config = os.path.join(ROOT, "configs", "ippo_simple_spread_continuous.yaml")
    run_dir = str(tmp_path / "ippo")
    summary = train(config, run_dir=run_dir, overrides=[
        "mode=async", "workers=1", "rollout.inference=central", "env.num_envs=4", "stop.max_env_steps=3000",
        "eval.interval_s=1", "eval.episodes=4", *QUIET])
    assert summary["env_steps"] >= 3000 and summary["updates"] >= 3, summary
    assert summary["evaluations"] >= 1 and -100.0 < summary["best_eval_return"] < 0.0, summary
    with open(os.path.join(run_dir, "learner.jsonl")) as fh:
        stats = [json.loads(line) for line in fh]
    assert stats and all(np.isfinite(s["loss_value"]) and np.isfinite(s["entropy"]) for s in stats)
