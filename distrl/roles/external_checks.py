"""What the simulator server checks in every value a client sends before it reaches the run: observations
and actions against the declared spaces, finite numbers, episode ids, and local inference's steps against
what the run's own policy would have recorded (its acting rule's extras, their shapes and dtypes). A
structured observation is read leaf by leaf against the space (`distrl.client.spaces`): a leaf missing or
extra, of the wrong shape, out of an integer leaf's range, or a mask that allows no action is `bad_value`."""
from __future__ import annotations

import numpy as np
from gymnasium import spaces

from distrl import tree
from distrl.algos.actor_critic import action_factors
from distrl.client import spaces as wire_spaces
from distrl.client.wire import ProtocolError, unpack_array
from distrl.envs.spaces import space_to_data
from distrl.sampling import Factors


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


def _text(bound: np.ndarray) -> str:
    """A range's bound for a message: one number when every element has it."""
    values = np.unique(bound)
    return str(values[0]) if len(values) == 1 else str(bound.tolist())


class Checks:
    """The checks of one run's spaces and policy (`policy`: the server's, with weights, for the extras)."""

    def __init__(self, spec, policy):
        self.obs_space, self.act_space, self.policy = spec.observation_space, spec.action_space, policy
        self.obs_data = space_to_data(self.obs_space)
        self.discrete = isinstance(self.act_space, spaces.Discrete)
        # Discrete actions as one factor: the same range and mask checks as MultiDiscrete's; None for a Box
        self.factors = Factors([self.act_space.n], 0, (), np.int64) if self.discrete else action_factors(self.act_space)
        self.offsets = None if self.factors is None else self.factors.index[:, 0]  # each factor's first mask entry
        self.recorded: dict[str, tuple[tuple, np.dtype]] | None = None

    def observations(self, value, rows: int | None) -> tree.Tree:
        """One observation (`rows` None) or `rows` of them (each leaf with `rows` rows), shaped like the space
        (`distrl.client.spaces`), every leaf in its stored dtype; a mask allows an action in every row."""
        try:
            obs = wire_spaces.read(self.obs_data, value, lambda name, space, v: self._leaf(name, space, v, rows))
        except ValueError as e:
            raise ProtocolError("bad_value", str(e)) from None
        mask = tree.mask_of(obs)
        if mask is not None and self.factors is not None:
            legal = np.logical_or.reduceat(mask.reshape(-1, mask.shape[-1]) != 0, self.offsets, axis=1)
            if not legal.all():
                row, factor = np.argwhere(~legal)[0]
                where = f"row {row}'s" if rows is not None else "the"
                which = "action" if len(self.offsets) == 1 else f"value of factor {factor}"
                raise ProtocolError("bad_value", f"{where} {tree.MASK_KEY} allows no {which}")
        return obs

    def _leaf(self, name: str, space: dict, value, rows: int | None) -> np.ndarray:
        what = f"observation leaf {name!r}" if name else "an observation"
        shape = (*(() if rows is None else (rows,)), *wire_spaces.leaf_shape(space))
        bounds = wire_spaces.leaf_range(space)
        try:
            a = unpack_array(value, wire_spaces.leaf_dtype(space) if bounds is None else None)
        except ProtocolError as e:
            raise ProtocolError(e.code, f"{what}: {e}") from None
        if a.shape != shape:
            raise ProtocolError("bad_value", f"{what}: shaped {shape} expected, got {a.shape}")
        if bounds is None:
            return _finite(a, what)
        if a.dtype.kind == "f" and not (np.isfinite(a).all() and (a == np.round(a)).all()):
            raise ProtocolError("bad_value", f"{what}: integers expected")
        low, high = bounds
        if (a < low).any() or (a >= high).any():  # a Discrete leaf out of range would break its one-hot code
            raise ProtocolError("bad_value", f"{what}: values in [{_text(low)}, {_text(high)}) expected")
        return a.astype(wire_spaces.leaf_dtype(space))

    def actions(self, value, rows: int, obs) -> np.ndarray:
        """`rows` actions in the action space (integers in its range that `obs`' mask allows, or finite Box values)."""
        if self.factors is None:
            a = unpack_array(value, np.dtype(self.act_space.dtype))
            if a.shape != (rows, *self.act_space.shape):
                raise ProtocolError("bad_value", f"actions shaped {(rows, *self.act_space.shape)} expected, got {a.shape}")
            return _finite(a, "an action")
        f, a = self.factors, unpack_array(value)
        choices = a.reshape(rows, len(f.nvec)).astype(np.int64) - f.start if a.shape == (rows, *f.shape) else None
        if choices is None or a.dtype.kind not in "iub" or (choices < 0).any() or (choices >= f.nvec).any():
            space = f"[0, {self.act_space.n})" if self.discrete else f"{self.act_space}"
            raise ProtocolError("bad_value", f"{rows} integer actions in {space} expected")
        mask = tree.mask_of(obs)
        if mask is not None:
            allowed = np.take_along_axis(mask, self.offsets + choices, axis=1).all(axis=1)
            if not allowed.all():
                raise ProtocolError("bad_value",
                                    f"the action of row {np.argmin(allowed)} is one its {tree.MASK_KEY} forbids")
        return a.astype(f.dtype)

    def action_to_wire(self, action: np.ndarray):
        return int(action) if self.discrete else np.asarray(action).tolist()

    def extras(self) -> dict[str, tuple[tuple, np.dtype]]:
        """What the policy records per step (name -> per-step shape, dtype), from one act of its own; a
        recurrent policy's `state` too (the one each step's action was taken from)."""
        if self.recorded is None:
            state = self.policy.initial_state(1)
            rule = self.policy.acting_rule() if state is None else self.policy.sampling_rule()
            _, extras = rule.act(self.policy.forward(self.example(), state)[0], np.random.default_rng(0), True)
            self.recorded = {k: (v.shape[1:], v.dtype) for k, v in extras.items()}
            if state is not None:
                self.recorded["state"] = (state.shape[1:], state.dtype)
        return self.recorded

    def example(self) -> tree.Tree:
        """A batch of one observation: zeros, its mask (if any) all legal."""
        def leaf(name: str, space: dict) -> np.ndarray:
            fill = np.ones if name == tree.MASK_KEY else np.zeros
            return fill((1, *wire_spaces.leaf_shape(space)), wire_spaces.leaf_dtype(space))
        return wire_spaces.nest(self.obs_data, {name: leaf(name, s) for name, s in wire_spaces.leaf_spaces(self.obs_data)})

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
            if "state" in expected and not (isinstance(extras, dict) and "state" in extras):
                raise ProtocolError("bad_value", f"this run's policy is recurrent: each step's extras carry 'state', "
                                                 f"the state {expected['state'][0]} its action was taken from "
                                                 f"(zeros at its episode's start; extras {sorted(expected)})")
            raise ProtocolError("bad_value", f"extras {sorted(expected)} expected (the run's acting rule records them)")
        checked = {}
        for name, (shape, dtype) in expected.items():
            checked[name] = _finite(unpack_array(extras[name], dtype), f"extras {name!r}")
            if checked[name].shape != (k, *shape):
                raise ProtocolError("bad_value", f"extras {name!r} shaped {(k, *shape)} expected")
        obs = self.observations(seg.get("obs"), k)
        return {"obs": obs, "actions": self.actions(seg.get("actions"), k, obs),
                "rewards": _finite(rewards, "a reward"), "versions": np.clip(versions, 0, max(0, newest_version)),
                "extras": checked}
