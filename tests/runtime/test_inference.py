"""Central inference (`rollout.inference: central`): an InferenceServer actor runs the network for every
RolloutWorker actor. With the same weights and seeds, workers acting through it produce the fragments
that workers acting locally do, recurrent states included; the server batches concurrent workers."""
import json
import os

import numpy as np
import pytest
import ray

from distrl import train
from distrl.config import ConfigError, load_config, to_dict
from distrl.observe.report import run_report
from distrl.roles.factory import acting_policy, make_algorithm, make_rollout
from distrl.runtime.actors import ParameterServer, RolloutWorker
from distrl.runtime.inference import InferenceServer
from tests.runtime.processes import kill_one_once_logging
from tests.runtime.test_trace import assert_trace_has_every_lane, run_lanes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUIET = ["log.tensorboard=false", "log.progress=false"]


def central_fragments(cfg, ps, server, fragments_each: int = 3) -> list[list[tuple]]:
    """Each of two RolloutWorker actors' fragments (data, priorities), acting through `server` and
    sampling at the same time."""
    workers = [RolloutWorker.remote(to_dict(cfg), i, 2, ps, server) for i in range(2)]
    try:  # each worker holds one of the embedded Ray's two CPUs: a leaked one would starve later tests
        # Both processes up before either samples: their steps then reach the server together.
        ray.get([w.pid.remote() for w in workers], timeout=120)
        out: list[list[tuple]] = [[], []]
        for _ in range(fragments_each):
            calls = [w.sample.remote(True) for w in workers]  # (info, payload) refs each
            for i, (data, priorities, _) in enumerate(ray.get([payload for _, payload in calls], timeout=120)):
                out[i].append((data, priorities))
        return out
    finally:
        for w in workers:
            ray.kill(w)


def local_fragments(cfg, weights, fragments_each: int = 3) -> list[list[tuple]]:
    """The fragments the same two workers give acting locally: their policy and rollout (as a RolloutWorker
    builds them), in this process."""
    out: list[list[tuple]] = []
    for i in range(2):
        policy = acting_policy(cfg, i, 2)
        policy.set_weights(weights, 0)
        rollout = make_rollout(cfg, policy, cfg.seed + i, i)
        out.append([(frag.data, frag.priorities) for frag in (rollout.sample() for _ in range(fragments_each))])
    return out


@pytest.mark.parametrize("config, overrides", [
    ("apex_dqn_cartpole.yaml", []),
    ("ppo_cartpole.yaml", []),
    ("sac_pendulum.yaml", ["sac.random_steps=0"]),  # past the uniform warm-up: the actor's network acts
    ("r2d2_position_only_cartpole.yaml", ["rollout.fragment_length=40"]),  # sequences complete: stored states
    ("ppo_lstm_position_only_cartpole.yaml", []),  # each fragment's start states, truncations' final values
    ("dhc_mapf_8x8.yaml", ["rollout.fragment_length=40", "env.num_envs=4"]),  # per-agent states, comm masks
])
def test_central_inference_gives_the_fragments_local_inference_gives(ray_session, config, overrides):
    # A batch timeout far above a step's round trip: the server always waits for both workers' steps, so
    # how it batched does not depend on this machine's load.
    cfg = load_config(os.path.join(ROOT, "configs", config), ["mode=sync", "workers=2", "seed=3",
                                                              "rollout.batch_timeout_ms=5000", *overrides])
    weights = make_algorithm(cfg).make_learner("cpu").get_weights()
    ps = ParameterServer.remote()
    server = None
    try:
        ray.get(ps.push.remote(0, weights))
        server = InferenceServer.remote(to_dict(cfg), ps, 2)
        local, central = local_fragments(cfg, weights), central_fragments(cfg, ps, server)
        stats = ray.get(server.stats.remote())
    finally:
        for actor in (server, ps):
            if actor is not None:
                ray.kill(actor)
    compared = 0
    for mine, theirs in zip(local, central):
        for (data, prio), (data_c, prio_c) in zip(mine, theirs):
            assert data.keys() == data_c.keys()
            for k in data.keys() - {"chunk/key", "item/chunks"}:  # chunk names are unique per process
                if np.issubdtype(data[k].dtype, np.floating):
                    np.testing.assert_allclose(data_c[k], data[k], rtol=1e-5, atol=1e-5, err_msg=k)
                else:
                    np.testing.assert_array_equal(data_c[k], data[k], err_msg=k)
                compared += data[k].size
            if prio is not None:
                np.testing.assert_allclose(prio_c, prio, rtol=1e-5, atol=1e-5)
    assert compared > 0
    if cfg.algo in ("r2d2", "dhc"):  # stored sequence-start states came from the server, and are not all zero
        assert any(data["item/state"].any() for data, _ in central[0])
    elif "state" in central[0][0][0]:  # an on-policy core: a later fragment starts from the states the server kept
        assert all(data["state"].any() for data, _ in central[0][1:])
    # The workers step in lockstep through the server: every batch held one step of each.
    assert stats["batches"] > 0 and stats["requests"] == 2 * stats["batches"], stats


def assert_the_server_batched_both_workers(run_dir: str) -> None:
    """A traced run's server held a step of each of its two workers in one batch (a sync run through the server:
    tests/runtime/test_multiagent.py's MAPPO run; learning through it: the async run below, which kills it)."""
    with open(os.path.join(run_dir, "trace.json")) as fh:
        events = json.load(fh)["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    batches = [e for e in events if e.get("name") == "infer_batch" and names[e["pid"]] == "inference"]
    assert len(batches) > 100 and max(e["args"]["requests"] for e in batches) == 2  # both workers in one batch
    assert "inference" in run_report(run_dir)  # the server has its row in where the time goes


@pytest.mark.parametrize("config, overrides, message", [
    ("a3c_cartpole.yaml", ["mode=async"], r"rollout\.inference.*a3c acts only in its workers"),
    ("ppo_cartpole.yaml", ["mode=single"], r"rollout\.inference.*only modes sync and async start Ray actors"),
])
def test_central_inference_where_it_cannot_run_is_refused(tmp_path, config, overrides, message):
    with pytest.raises(ConfigError, match=message):
        train(os.path.join(ROOT, "configs", config), run_dir=str(tmp_path / "run"),
              overrides=["rollout.inference=central", *overrides, *QUIET])
    assert not (tmp_path / "run").exists()


def test_an_async_run_with_central_inference_learns_cartpole_though_its_server_is_killed(ray_session, tmp_path):
    run_dir = str(tmp_path / "run")
    thread, killed = kill_one_once_logging(run_dir, "InferenceServer")
    summary = train(os.path.join(ROOT, "configs", "ppo_cartpole.yaml"), run_dir=run_dir,
                    overrides=["mode=async", "workers=2", "seed=0", "rollout.inference=central",
                               "stop.max_seconds=150", "log.interval_s=0.25", "log.trace=true", *QUIET])
    thread.join(timeout=5)
    assert len(killed) == 1
    assert summary["solved"] and summary["failure"] is None, summary
    assert summary["inference_restarts"] == 1 and summary["worker_restarts"] == 0, summary
    assert_the_server_batched_both_workers(run_dir)  # the restarted server's batches (the first's died with it)
