"""The evaluator's job without its process: greedy episodes, scores, best checkpoint."""
from __future__ import annotations

import json
import os
import time

import numpy as np

from distrl.checkpoint import save_json, save_weights
from distrl.core import Policy, Weights
from distrl.envs import VectorEnv
from distrl.observe.trace import tracer
from distrl.roles.factory import acting_policy

EVAL_SEED_OFFSET = 10_000


def play_greedy(policy: Policy, env_id: str, episodes: int, seed: int, env_kwargs: dict | None = None,
                max_steps: int = 1_000_000) -> np.ndarray:
    """Returns of `episodes` greedy episodes, one env each, with batched inference."""
    envs = VectorEnv(env_id, episodes, seed, env_kwargs)
    policy.episodes_ended(np.ones(episodes, bool))  # each greedy episode starts from a fresh state
    returns = np.full(episodes, np.nan)
    running = np.ones(episodes, bool)
    try:
        for _ in range(max_steps):
            actions, _ = policy.act(envs.obs, explore=False)
            # Finished envs keep stepping (auto-reset) but only the first episode counts;
            # an episode cut short by an env exception doesn't count and is played again.
            _, rewards, term, trunc, _ = envs.step(actions)
            policy.episodes_ended(term | trunc)
            done_now = running & (term | trunc) & ~envs.errored
            if done_now.any():
                returns[done_now] = envs.episode_return_at_end[done_now]
                running &= ~done_now
            if not running.any():
                break
    finally:
        envs.close()
    return returns


def _saved_best(run_dir: str) -> float:
    """The return of the run's best checkpoint so far (-inf if none or unreadable)."""
    try:
        with open(os.path.join(run_dir, "checkpoints", "best.json")) as fh:
            value = float(json.load(fh)["return_mean"])
        return value if np.isfinite(value) else -np.inf
    except (OSError, ValueError, KeyError, TypeError):
        return -np.inf


class Evaluation:
    """Scores published weights; keeps the best as `checkpoints/best.safetensors`."""

    def __init__(self, policy: Policy, cfg, run_dir: str, start_time: float,
                 evaluations: int = 0, best: float = -np.inf):
        self.policy, self.cfg, self.run_dir = policy, cfg, run_dir
        self.start_time = start_time
        # The best checkpoint only improves: a resumed run or a restarted evaluator starts from it.
        self.best = max(best, _saved_best(run_dir))
        self.evaluations = evaluations  # evaluation i plays seeds derived from i

    def evaluate(self, weights: Weights, version: int, env_steps: int = 0) -> dict:
        with tracer().span("evaluate", "evaluation", version=version):
            return self._evaluate(weights, version, env_steps)

    def _evaluate(self, weights: Weights, version: int, env_steps: int) -> dict:
        self.policy.set_weights(weights, version)
        seed = self.cfg.seed + EVAL_SEED_OFFSET + self.evaluations * self.cfg.eval.episodes
        rets = play_greedy(self.policy, self.cfg.env.id, self.cfg.eval.episodes, seed, self.cfg.env.kwargs)
        self.evaluations += 1
        now = time.time()
        mean = float(np.mean(rets))
        target = self.cfg.eval.target_return
        result = {"version": version, "env_steps": env_steps, "return_mean": mean,
                  "return_std": float(np.std(rets)), "episodes": len(rets),
                  "time_s": now - self.start_time,
                  "solved": target is not None and mean >= target}
        if mean > self.best:
            self.best = mean
            ckpt = os.path.join(self.run_dir, "checkpoints")
            save_weights(os.path.join(ckpt, "best.safetensors"), weights, result)
            save_json(os.path.join(ckpt, "best.json"), result)
        result["best_return"] = self.best
        return result


def make_evaluation(cfg, run_dir: str, start_time: float, resume: dict | None = None) -> Evaluation:
    """The evaluator's job with its greedy policy; `resume` carries on a run's evaluations and best."""
    return Evaluation(acting_policy(cfg, -1, 1), cfg, run_dir, start_time, **(resume or {}))
