"""The evaluator's job without its process: greedy episodes, scores, best checkpoint."""
from __future__ import annotations

import json
import os
import time

import numpy as np
from gymnasium import spaces

from distrl import tree
from distrl.checkpoint import CheckpointError, load_weights, save_json, save_weights
from distrl.core import Policy, Weights
from distrl.observe.trace import tracer
from distrl.registry import algorithm
from distrl.roles.factory import acting_policy, make_vector_env
from distrl.sampling import MASKED, Factors, factored_act

EVAL_SEED_OFFSET = 10_000


def random_actions(space, rows: int, rng: np.random.Generator, mask: np.ndarray | None = None) -> np.ndarray:
    """Uniform random actions of `space`; with an action `mask` (rows, entries; 1 = legal) uniform among the
    legal ones: the argmax of uniform noise with the illegal entries' at MASKED, per factor for a
    MultiDiscrete or MultiBinary (its mask one factor's entries after another)."""
    if mask is not None and not isinstance(space, spaces.Box):
        noise = np.where(np.asarray(mask).reshape(rows, -1) != 0, rng.random((rows, np.size(mask) // rows)), MASKED)
        if isinstance(space, spaces.Discrete):
            return space.start + noise.argmax(axis=1)
        factors = Factors(space.nvec if isinstance(space, spaces.MultiDiscrete) else np.full(space.shape, 2),
                          getattr(space, "start", 0), space.shape, space.dtype)
        return factors.to_env(factored_act(noise, factors.index, None)[0])
    if isinstance(space, spaces.Discrete):
        return space.start + rng.integers(0, int(space.n), rows)
    if isinstance(space, (spaces.MultiDiscrete, spaces.MultiBinary)):
        nvec = space.nvec if isinstance(space, spaces.MultiDiscrete) else np.full(space.shape, 2)
        start = getattr(space, "start", 0)
        return (start + rng.integers(0, nvec, (rows, *space.shape))).astype(space.dtype)
    low, high = np.broadcast_to(space.low, space.shape), np.broadcast_to(space.high, space.shape)
    return rng.uniform(low, high, (rows, *space.shape)).astype(space.dtype)


def with_random_actions(actions: np.ndarray, epsilon: float, space, rng: np.random.Generator,
                        mask: np.ndarray | None = None) -> np.ndarray:
    """`actions` with each row replaced by a uniform random action of `space` (a legal one, with the
    observations' `mask`) with probability `epsilon`."""
    if epsilon <= 0.0:
        return actions
    rows = len(actions)
    swap = rng.random(rows) < epsilon
    return np.where(swap.reshape(-1, *[1] * (np.ndim(actions) - 1)), random_actions(space, rows, rng, mask), actions)


def play_greedy(policy: Policy, env_id: str, episodes: int, seed: int, env_kwargs: dict | None = None,
                max_steps: int = 1_000_000, multi_agent: bool = False, *, wrappers: list | None = None,
                preset: str = "none", epsilon: float = 0.0, normalize=None, obs_keys: list | None = None,
                action_mask: str = "none") -> tuple[np.ndarray, list[dict]]:
    """Returns of `episodes` greedy episodes, one env each, with batched inference, and each episode's
    metrics (multi-agent envs report them: success, makespan, ...; gymnasium ones none). The envs are
    evaluation envs: without the train-only wrappers (whole games, the game's own rewards). `epsilon`: the
    probability of a uniform random action instead of the greedy one (single-agent envs). `normalize` (the
    env.normalize section): observations normalized with the policy's statistics, frozen."""
    envs = make_vector_env(env_id, episodes, seed, env_kwargs, multi_agent, wrappers=wrappers, preset=preset,
                           training=False, normalize=normalize, statistics=policy.statistics, obs_keys=obs_keys,
                           action_mask=action_mask)
    rng = np.random.default_rng(seed)
    policy.episodes_ended(np.ones(episodes, bool))  # each greedy episode starts from a fresh state
    returns = np.full(episodes, np.nan)
    infos: list[dict] = [{} for _ in range(episodes)]
    running = np.ones(episodes, bool)
    try:
        for _ in range(max_steps):
            actions, _ = policy.act(envs.obs, explore=False)
            actions = with_random_actions(actions, epsilon, envs.action_space, rng, tree.mask_of(envs.obs))
            # Finished envs keep stepping (auto-reset) but only the first episode counts;
            # an episode cut short by an env exception doesn't count and is played again.
            _, rewards, term, trunc, _ = envs.step(actions)
            policy.episodes_ended(term | trunc)
            done_now = running & (term | trunc) & ~envs.errored
            if done_now.any():
                returns[done_now] = envs.episode_return_at_end[done_now]
                for i in np.flatnonzero(done_now):
                    infos[i] = dict(getattr(envs, "episode_info", infos)[i])
                running &= ~done_now
            if not running.any():
                break
    finally:
        envs.close()
    return returns, infos


def episode_metrics(infos: list[dict]) -> dict[str, float]:
    """Means over episodes of the numeric metrics they reported; `success` becomes `success_rate`."""
    keys = sorted({k for info in infos for k, v in info.items() if isinstance(v, (int, float)) and k != "return_mean"})
    out = {k: float(np.mean([info[k] for info in infos if k in info])) for k in keys}
    if "success" in out:
        out["success_rate"] = out.pop("success")
    return out


LOWEST = (-np.inf, -np.inf)


def rank(result: dict) -> tuple:
    """How good an evaluation is: success rate first where the env reports one, then the return."""
    metrics = result.get("metrics") or {}
    success = metrics.get("success_rate", -np.inf)
    return (float(success), float(result["return_mean"]))


BEST_WEIGHTS, BEST_RESULT = "best.safetensors", "best.json"  # under RUN_DIR/checkpoints/


def saved_rank(run_dir: str) -> tuple:
    """The rank of the run's best checkpoint so far: from best.json, else from the result stored with
    the weights (a kill between the two writes); lowest if there is none."""
    ckpt = os.path.join(run_dir, "checkpoints")
    try:
        with open(os.path.join(ckpt, BEST_RESULT)) as fh:
            key = rank(json.load(fh))
    except (OSError, ValueError, KeyError, TypeError):
        try:
            key = rank(load_weights(os.path.join(ckpt, BEST_WEIGHTS))[1])
        except (CheckpointError, KeyError, TypeError, ValueError):
            return LOWEST
    return LOWEST if np.isnan(key).any() else key


def save_best(run_dir: str, weights: Weights, result: dict) -> None:
    """The best weights so far, with their result inside and beside them (best.json is what users read)."""
    ckpt = os.path.join(run_dir, "checkpoints")
    os.makedirs(ckpt, exist_ok=True)
    save_weights(os.path.join(ckpt, BEST_WEIGHTS), weights, result)
    save_json(os.path.join(ckpt, BEST_RESULT), result)


class Evaluation:
    """Scores published weights. A result that beats `best` (by `rank`) carries its weights under
    "weights", for the driver to keep as the run's best checkpoint: the evaluator writes no file, so it
    may run on any node."""

    def __init__(self, policy: Policy, env, eval_cfg, seed: int, multi_agent: bool, start_time: float,
                 evaluations: int = 0, best: tuple = LOWEST):
        self.policy, self.env, self.eval_cfg, self.seed, self.multi_agent = policy, env, eval_cfg, seed, multi_agent
        self.start_time = start_time
        self.best = tuple(best)  # the run's best when this process started; the driver keeps the true one
        self.evaluations = evaluations  # evaluation i plays seeds derived from i
        self.video_every_s = getattr(eval_cfg, "video_every_s", None)
        self.last_video: float | None = None  # when the last evaluation video was filmed (time.monotonic)

    def evaluate(self, weights: Weights, version: int, env_steps: int = 0) -> dict:
        with tracer().span("evaluate", "evaluation", version=version):
            return self._evaluate(weights, version, env_steps)

    def _evaluate(self, weights: Weights, version: int, env_steps: int) -> dict:
        self.policy.set_weights(weights, version)
        seed = self.seed + EVAL_SEED_OFFSET + self.evaluations * self.eval_cfg.episodes
        rets, infos = play_greedy(self.policy, self.env.id, self.eval_cfg.episodes, seed, self.env.kwargs,
                                  multi_agent=self.multi_agent, wrappers=self.env.wrappers, preset=self.env.preset,
                                  epsilon=self.eval_cfg.epsilon, normalize=self.env.normalize,
                                  obs_keys=self.env.obs_keys, action_mask=self.env.action_mask)
        self.evaluations += 1
        now = time.time()
        mean = float(np.mean(rets))
        metrics = episode_metrics(infos)
        result = {"version": version, "env_steps": env_steps, "return_mean": mean,
                  "return_std": float(np.std(rets)), "episodes": len(rets),
                  "time_s": now - self.start_time, "metrics": metrics, "solved": self._solved(mean, metrics)}
        if rank(result) > self.best:
            self.best = rank(result)
            result["weights"] = weights
        every, last = self.video_every_s, self.last_video
        if every is not None and (last is None or time.monotonic() - last >= every):
            result["video"] = self._film(seed)
        return result

    def _film(self, seed: int) -> dict:
        """The first episode of this evaluation again, filmed (`eval.video_every_s`); a failure is reported
        in the result, once, and ends the filming (the run goes on)."""
        from distrl.roles.filming import evaluation_video

        self.last_video = time.monotonic()
        try:
            return evaluation_video(self.policy, self.env, seed, self.multi_agent)
        except Exception as e:  # noqa: BLE001 - a video is never worth a run
            self.video_every_s = None
            return {"error": " ".join(str(e).split())[:300] or type(e).__name__}


    def _solved(self, mean: float, metrics: dict) -> bool:
        """Every target that is set is reached (and at least one is set)."""
        ev = self.eval_cfg
        targets = [(ev.target_return, mean), (ev.target_success, metrics.get("success_rate"))]
        set_ = [(t, v) for t, v in targets if t is not None]
        return bool(set_) and all(v is not None and v >= t for t, v in set_)


def make_evaluation(cfg, start_time: float, resume: dict | None = None) -> Evaluation:
    """The evaluator's job with its greedy policy; `resume` carries on a run's evaluations and best rank."""
    return Evaluation(acting_policy(cfg, -1, 1), cfg.env, cfg.eval, cfg.seed, algorithm(cfg.algo).multi_agent,
                      start_time, **(resume or {}))
