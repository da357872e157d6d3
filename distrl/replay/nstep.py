"""Vectorised n-step return targets from time-major rollout fragments."""

from __future__ import annotations

import numpy as np


def _check(obs, actions, rewards, terminated, truncated, next_obs, gamma: float, n: int) -> None:
    if rewards.ndim != 2:
        raise ValueError(f"rewards must be (T, E), got {rewards.shape}")
    for name, arr in (("obs", obs), ("actions", actions), ("terminated", terminated),
                      ("truncated", truncated), ("next_obs", next_obs)):
        if arr.shape[:2] != rewards.shape:
            raise ValueError(f"{name} leading dims {arr.shape[:2]} != {rewards.shape}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")


def nstep_transitions(
    obs: np.ndarray,
    actions: np.ndarray,
    rewards: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    next_obs: np.ndarray,
    gamma: float,
    n: int,
) -> dict[str, np.ndarray]:
    """Turn a (T, E, ...) fragment into T*E flat n-step transitions.

    For each (t, e) the window sums ``k <= n`` rewards, stopping after the
    first step that ends the episode (terminated or truncated) or at the end
    of the fragment. ``next_obs`` is the true next observation of the last
    included step and ``discounts = gamma**k`` (0 if that step terminated).
    Outputs are flattened in (t, e) order; ``obs``/``actions`` may be views
    of the inputs.
    """
    rewards = np.asarray(rewards)
    terminated = np.asarray(terminated, dtype=bool)
    truncated = np.asarray(truncated, dtype=bool)
    obs, actions, next_obs = np.asarray(obs), np.asarray(actions), np.asarray(next_obs)
    _check(obs, actions, rewards, terminated, truncated, next_obs, gamma, n)
    t_len, n_env = rewards.shape

    # Pad the time axis so offset j can be read as a plain slice [j, j+T);
    # padded steps count as "episode ended" and are masked out anyway.
    pad = n - 1
    r_pad = np.concatenate([rewards.astype(np.float64), np.zeros((pad, n_env))])
    done_pad = np.concatenate([terminated | truncated, np.ones((pad, n_env), dtype=bool)])
    t_idx = np.broadcast_to(np.arange(t_len)[:, None], (t_len, n_env))

    ret = np.zeros((t_len, n_env), dtype=np.float64)
    k = np.zeros((t_len, n_env), dtype=np.int64)
    last = t_idx.copy()
    alive = np.ones((t_len, n_env), dtype=bool)
    for j in range(n):
        valid = alive & (t_idx + j < t_len)
        ret += np.where(valid, gamma**j * r_pad[j : j + t_len], 0.0)
        k += valid
        last = np.where(valid, t_idx + j, last)
        alive = valid & ~done_pad[j : j + t_len]

    env_idx = np.broadcast_to(np.arange(n_env)[None, :], (t_len, n_env))
    boot_obs = next_obs[last, env_idx]
    discounts = np.power(gamma, k) * ~terminated[last, env_idx]
    flat = t_len * n_env
    return {
        "obs": obs.reshape(flat, *obs.shape[2:]),
        "actions": actions.reshape(flat, *actions.shape[2:]),
        "rewards": ret.reshape(flat).astype(np.float32),
        "next_obs": boot_obs.reshape(flat, *next_obs.shape[2:]),
        "discounts": discounts.reshape(flat).astype(np.float32),
        "nsteps": k.reshape(flat),
    }
