"""RLlib's external-env example beside distrl's simulator server: PPO on CartPole from N client processes
that act themselves (RLlib's new API stack serves local inference only), through RLlib's
`EnvRunnerServerForExternalInference` (one TCP client per EnvRunner) and its own dummy CartPole client.

    bash bench/peers/setup_rllib.sh          # its own venv: bench/peers/.venv-rllib (ray[rllib] 2.60, torch 2.13.0)
    bench/peers/.venv-rllib/bin/python -m bench.peers.rllib_external --clients 1 2 4 --seconds 60

Prints one JSON line per client count: env steps sampled per second over the training window (after the
first iteration), iterations, and the training episode return (RLlib's metric; it has no greedy
evaluation here). The PPO settings are the example's (`num_epochs=10`, `vf_loss_coeff=0.01`, a shared
value layer).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time


def client(port: int) -> None:
    from ray.rllib.examples.envs.classes.utils.dummy_external_client import _dummy_external_client

    _dummy_external_client(port)


def run(clients: int, seconds: float, port: int) -> dict:
    import gymnasium as gym
    import numpy as np
    import ray
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.env.external.env_runner_server_for_external_inference import EnvRunnerServerForExternalInference

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    config = (PPOConfig()
              .environment(observation_space=gym.spaces.Box(-np.inf, np.inf, (4,), np.float32),
                           action_space=gym.spaces.Discrete(2), env_config={"port": port})
              .env_runners(env_runner_cls=EnvRunnerServerForExternalInference, num_env_runners=clients)
              .training(num_epochs=10, vf_loss_coeff=0.01)
              .rl_module(model_config=DefaultModelConfig(vf_share_layers=True)))
    algo = config.build_algo()
    procs = [mp.get_context("spawn").Process(target=client, args=(port + i + 1,), daemon=True) for i in range(clients)]
    for p in procs:
        p.start()
    rows = []
    try:
        start = time.time()
        while time.time() - start < seconds:
            r = algo.train()
            runners = r.get("env_runners", {})
            rows.append((time.time(), runners.get("num_env_steps_sampled_lifetime", 0),
                         runners.get("episode_return_mean")))
    finally:
        for p in procs:
            p.kill()
        algo.stop()
        ray.shutdown()
    (t0, s0, _), (t1, s1, ret) = rows[0], rows[-1]
    return {"clients": clients, "iterations": len(rows), "env_steps": s1,
            "env_steps_per_s": (s1 - s0) / max(t1 - t0, 1e-9), "episode_return_mean": ret}


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--port", type=int, default=5555)
    a = p.parse_args(argv)
    for k, n in enumerate(a.clients):
        # Ports of their own per run: RLlib's local EnvRunner listens on the first port from a thread of this
        # process, which outlives `algo.stop()`, so a second run here could not bind it.
        print(json.dumps(run(n, a.seconds, a.port + 10 * k)), flush=True)


if __name__ == "__main__":
    main()
