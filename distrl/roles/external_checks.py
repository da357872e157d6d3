"""What the simulator server checks in every value a client sends before it reaches the run: observations
and actions against the declared spaces, finite numbers, episode ids, and local inference's steps against
what the run's own policy would have recorded (its acting rule's extras, their shapes and dtypes)."""
from __future__ import annotations

import numpy as np
from gymnasium import spaces

from distrl.client.wire import ProtocolError, unpack_array


def episode_id(value) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)) or len(str(value)) > 128:
        raise ProtocolError("bad_value", f"an episode id is a string or an integer, got {str(value)[:40]!r}")
    return str(value)


def reward(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        raise ProtocolError("bad_value", f"a reward is a finite number, got {str(value)[:40]!r}")
    return float(value)


def _finite(a: np.ndarray, what: str) -> np.ndarray:
    if a.dtype.kind == "f" and not np.isfinite(a).all():
        raise ProtocolError("bad_value", f"{what} holds NaN or inf")
    return a


class Checks:
    """The checks of one run's spaces and policy (`policy`: the server's, with weights, for the extras)."""

    def __init__(self, spec, policy):
        self.obs_space, self.act_space, self.policy = spec.observation_space, spec.action_space, policy
        self.discrete = isinstance(self.act_space, spaces.Discrete)
        self.recorded: dict[str, tuple[tuple, np.dtype]] | None = None

    def observations(self, value, rows: int | None) -> np.ndarray:
        """One observation (`rows` None) or `rows` of them, as the space's dtype."""
        shape = tuple(self.obs_space.shape) if rows is None else (rows, *self.obs_space.shape)
        a = unpack_array(value, np.dtype(self.obs_space.dtype))
        if a.shape != shape:
            raise ProtocolError("bad_value", f"observations shaped {shape} expected, got {a.shape}")
        return _finite(a, "an observation")

    def actions(self, value, rows: int) -> np.ndarray:
        """`rows` actions in the action space (integers in [0, n), or finite Box values)."""
        if self.discrete:
            a = unpack_array(value)
            if a.shape != (rows,) or a.dtype.kind not in "iu" or (rows and (a.min() < 0 or a.max() >= self.act_space.n)):
                raise ProtocolError("bad_value", f"{rows} integer actions in [0, {self.act_space.n}) expected")
            return a.astype(np.int64)
        a = unpack_array(value, np.dtype(self.act_space.dtype))
        if a.shape != (rows, *self.act_space.shape):
            raise ProtocolError("bad_value", f"actions shaped {(rows, *self.act_space.shape)} expected, got {a.shape}")
        return _finite(a, "an action")

    def action_to_wire(self, action: np.ndarray):
        return int(action) if self.discrete else np.asarray(action).tolist()

    def extras(self) -> dict[str, tuple[tuple, np.dtype]]:
        """What the policy records per step (name -> per-step shape, dtype), from one act of its own."""
        if self.recorded is None:
            obs = np.zeros((1, *self.obs_space.shape), self.obs_space.dtype)
            rule = self.policy.acting_rule()
            _, extras = rule.act(self.policy.forward(obs, None)[0], np.random.default_rng(0), True)
            self.recorded = {k: (v.shape[1:], v.dtype) for k, v in extras.items()}
        return self.recorded

    def segment(self, seg, episodes, max_open: int, newest_version: int) -> tuple:
        """A local client's segment of one episode, checked: (episode, start, rows or None, end or None)."""
        if not isinstance(seg, dict):
            raise ProtocolError("bad_value", "an experience segment is a map")
        episode, start = episode_id(seg.get("episode")), seg.get("start", False)
        if not isinstance(start, bool):
            raise ProtocolError("bad_value", f"start is true or false, got {start!r}")
        if start and episode in episodes.open:
            raise ProtocolError("out_of_order", f"episode {episode!r} is already open")
        if not start and episode not in episodes.open:
            raise ProtocolError("unknown_episode", f"episode {episode!r} is not open (start: true opens it)")
        rows = None if seg.get("obs") is None else self.rows(seg, newest_version)
        end = seg.get("end")
        if end is not None:
            truncated = end.get("truncated", False) if isinstance(end, dict) else None
            if not isinstance(truncated, bool):
                raise ProtocolError("bad_value", "end is null or {obs, truncated}")
            end = (self.observations(end.get("obs"), None), truncated)
        return episode, start, rows, end

    def rows(self, seg: dict, newest_version: int) -> dict:
        rewards = unpack_array(seg.get("rewards"), np.dtype(np.float64))
        if rewards.ndim != 1:
            raise ProtocolError("bad_value", f"rewards are one number per step, got shape {rewards.shape}")
        k = len(rewards)
        versions = unpack_array(seg.get("versions"))
        if versions.shape != (k,) or versions.dtype.kind not in "iu":
            raise ProtocolError("bad_value", f"{k} integer versions expected")
        extras, expected = seg.get("extras"), self.extras()
        if not isinstance(extras, dict) or set(extras) != set(expected):
            raise ProtocolError("bad_value", f"extras {sorted(expected)} expected (the run's acting rule records them)")
        checked = {}
        for name, (shape, dtype) in expected.items():
            checked[name] = _finite(unpack_array(extras[name], dtype), f"extras {name!r}")
            if checked[name].shape != (k, *shape):
                raise ProtocolError("bad_value", f"extras {name!r} shaped {(k, *shape)} expected")
        return {"obs": self.observations(seg.get("obs"), k), "actions": self.actions(seg.get("actions"), k),
                "rewards": _finite(rewards, "a reward"), "versions": np.clip(versions, 0, max(0, newest_version)),
                "extras": checked}
