"""Who may hear whom: a multi-agent env's communication mask from its agents' positions (k nearest within a
square view), where the positions come from, and why given limits cannot apply to an env."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


def comm_mask_from_positions(positions: np.ndarray, active: np.ndarray, k: int | None = None,
                             view_radius: float | None = None) -> np.ndarray:
    """mask[i, j]: j is one of the k nearest active agents of i (Euclidean; ties to the lower index)
    among those inside i's square view (|dx|, |dy| <= view_radius, a symmetric relation).

    Not symmetric in general: j may be among i's k nearest while i is not among j's.
    `k=None` keeps every candidate; `view_radius=None` means no view limit.
    """
    pos = np.asarray(positions, np.float64)
    n = len(pos)
    diff = pos[:, None, :] - pos[None, :, :]
    cand = active[:, None] & active[None, :] & ~np.eye(n, dtype=bool)
    if view_radius is not None:
        cand &= np.abs(diff).max(axis=-1) <= view_radius
    if k is None or k >= n - 1:
        return cand
    d2 = np.where(cand, (diff * diff).sum(axis=-1), np.inf)
    order = np.argsort(d2, axis=1, kind="stable")  # stable: equal distances keep index order
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(n)[None, :].repeat(n, 0), axis=1)
    return cand & (rank < k)


def env_positions(env: Any) -> np.ndarray | None:
    """(N, D) positions of `env.possible_agents` if the env exposes them, else None (NaN rows: unknown)."""
    if callable(getattr(env, "agent_positions", None)):
        return np.asarray(env.agent_positions(), np.float64)
    world = getattr(getattr(env, "unwrapped", None), "world", None)
    agents = getattr(world, "agents", None)
    if not agents or not hasattr(agents[0], "state"):
        return None
    by_name = {a.name: np.asarray(a.state.p_pos, np.float64) for a in agents}
    dim = len(next(iter(by_name.values())))
    return np.stack([by_name.get(a, np.full(dim, np.nan)) for a in env.possible_agents])


def comm_limits_problem(env: Any, comm_k: Any, comm_radius: Any, comm_fn: Callable | None = None) -> str | None:
    """Why `comm_k` / `comm_radius` cannot shape `env`'s communication mask, or None."""
    if comm_k is None and comm_radius is None:
        return None
    if comm_k is not None and (isinstance(comm_k, bool) or not isinstance(comm_k, int) or comm_k < 0):
        return f"comm_k must be an integer >= 0, got {comm_k!r}"
    if comm_radius is not None and (isinstance(comm_radius, bool) or not isinstance(comm_radius, (int, float))
                                    or not comm_radius > 0 or not np.isfinite(comm_radius)):
        return f"comm_radius must be a finite number > 0, got {comm_radius!r}"
    if comm_fn is not None or callable(getattr(env, "comm_mask", None)):
        return "the env computes its own communication mask: comm_k and comm_radius do not apply"
    if env_positions(env) is None:
        return f"comm_k={comm_k}, comm_radius={comm_radius} need agent positions, and {env} exposes none"
    return None
