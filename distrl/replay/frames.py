"""Stacked observations and image leaves stored as their frames, each frame once (the worker's half).

An env with ``EnvSpec.frame_stack = k`` emits observations that are stacks of k frames, each
step's stack the previous one shifted by a frame. Storing every transition's ``obs`` and
``next_obs`` stacks keeps each frame 2k times (56 KB per 84x84x4 Atari transition); storing
each frame once, with the stacks rebuilt at sample time, keeps it once (~7 KB).

Layout. Frames form linked chains: every frame names the frame before it in its stack
(``kind`` PREV: the frame written just before it), or says what lies before it when the stack
starts there: SELF (the frame repeats, gymnasium's ``padding_type="reset"``) or ZERO (zero
frames, ``"zero"`` padding, or nothing needed). A stack is named by its newest frame and
rebuilt by following the links k - 1 times (`stack_indices`, `take_stacks`). So a step whose
stack continues the previous one costs one frame, and an episode's first stack costs the
frames that are not padding (usually one).

Each env's fragment becomes one chain (`FrameEncoder.encode`): the first stack in full, then
per step only what is new. Whether a stack continues the one before is read from the frames
themselves (bit for bit), so a stack is never rebuilt across an episode start or any other
discontinuity, and a rebuilt stack always equals the emitted one. Chains carry a stream key
(one per env of this encoder) so the replay can join a fragment's first stack to the same
env's previous fragment instead of storing it again (`distrl.replay.frame_ring`).

Image leaves. A structured observation's image leaf (uint8, 3 dims: MiniGrid's ``image``, VizDoom's
``screen``) is one frame per step, not a stack: it is kept the same way as a stack of one (``frame_stack``
0 in the encoder and the message), so the obs and next obs of a transition share the frame stored once,
where storing both would copy it twice. The observation's other leaves travel per item as they are. A message names each
observation column it keeps as frames (`framed_key`): the bare keys are a flat observation's stacks
(column ``obs``), ``<key>/<column>`` an image leaf's (``frames/obs.image``, ``obs_frame/obs.image``).
"""
from __future__ import annotations

import functools
import os

import numpy as np

from distrl.replay.nstep import nstep_transitions

# Message keys: the frames, how each links to the one before, and per env chain its stream key,
# its first stack's newest frame (head) and its last frame (tail); the stack size (one value).
FRAMES, KINDS, CHAIN_KEY, CHAIN_HEAD, CHAIN_TAIL, STACK = (
    "frames", "frame_kind", "chain_key", "chain_head", "chain_tail", "frame_stack")
MESSAGE_KEYS = (FRAMES, KINDS, CHAIN_KEY, CHAIN_HEAD, CHAIN_TAIL, STACK)
# Item keys: the newest frame of the obs stack and of the (n-step) next-obs stack.
OBS_REF, NEXT_REF = "obs_frame", "next_obs_frame"
PREV, SELF, ZERO = 0, 1, 2
FLAT = "obs"  # the column of a flat observation (a structured one's leaves: `obs.<key>`, `distrl.tree.to_columns`)


@functools.cache  # called per key and message on the replay's add path: a lookup, not a format
def framed_key(key: str, column: str) -> str:
    """A message's (or a replay's) `key` for the frames of observation column `column`."""
    return key if column == FLAT else f"{key}/{column}"


def framed_columns(msg) -> list[str]:
    """The observation columns whose frames a message (or a replay's state) holds."""
    if FRAMES in msg:  # a flat observation's stacks: its one column (a structured observation has no `obs` column)
        return [FLAT]
    return [k[len(FRAMES) + 1:] for k in msg if k.startswith(FRAMES + "/")]


def is_frame_leaf(shape: tuple, dtype) -> bool:
    """Whether a structured observation's leaf of this (per-step) shape and dtype is an image replay keeps as
    frames: uint8 and 3 dims."""
    return dtype == np.uint8 and len(shape) == 3


def frame_stacks(columns: dict[str, np.ndarray], frame_stack: int) -> dict[str, int]:
    """The observation columns (T, E, ...) replay keeps as frames, with their stack sizes: a flat observation
    of stacks (``frame_stack`` > 0), else a structured observation's image leaves (uint8, 3 dims), each a
    single frame (0)."""
    if frame_stack:
        return {FLAT: frame_stack}
    return {c: 0 for c, v in columns.items() if c != FLAT and is_frame_leaf(v.shape[2:], v.dtype)}


def local_links(kinds: np.ndarray) -> np.ndarray:
    """The frame before each frame of a message (its index, itself when repeated, -1 for zeros)."""
    i = np.arange(len(kinds), dtype=np.int64)
    return np.where(kinds == PREV, i - 1, np.where(kinds == SELF, i, -1))


def stack_indices(links: np.ndarray, newest: np.ndarray, k: int, ring: int = 0) -> np.ndarray:
    """(..., k) frame indices of the stacks ending at ``newest``, oldest first, -1 for zero frames.

    ``links[i]`` is the frame before frame i; with ``ring`` > 0 indices are absolute and
    ``links`` is a ring of that size.
    """
    newest = np.asarray(newest, np.int64)
    idx = np.empty((*newest.shape, k), np.int64)
    idx[..., -1] = newest
    for j in range(k - 2, -1, -1):  # k - 1 vectorised hops, not a loop over items
        cur = idx[..., j + 1]
        at = np.maximum(cur, 0)
        idx[..., j] = np.where(cur >= 0, links[at % ring if ring else at], -1)
    return idx


def take_stacks(frames: np.ndarray, idx: np.ndarray, ring: int = 0) -> np.ndarray:
    """The frames at ``idx`` (..., k) as stacks (..., k, *frame), zeros where ``idx`` is -1."""
    at = np.maximum(idx, 0)
    out = np.take(frames, at % ring if ring else at, axis=0)
    out[idx < 0] = 0
    return out


def as_bytes(a: np.ndarray) -> np.ndarray:
    """The array's bytes on its last axis: comparisons bit for bit (-0.0 is not 0.0, NaN is itself)."""
    return a if a.dtype == np.uint8 else np.ascontiguousarray(a)[..., None].view(np.uint8)


def _equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per leading (T, E) position: are the trailing arrays equal (compared as bytes)?"""
    return (a == b).reshape(*a.shape[:2], int(np.prod(a.shape[2:]))).all(axis=-1)


def _lead(flags: np.ndarray) -> np.ndarray:
    """Length of the leading run of True along the last axis."""
    return np.where(flags.all(axis=-1), flags.shape[-1], flags.argmin(axis=-1))


def _padding(stacks: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """For whole stacks (M, k, ...) to be written: the first slot worth storing and its kind.

    Leading copies of the first frame collapse to one SELF frame; leading zero frames to a ZERO link.
    """
    flat = stacks.reshape(len(stacks), k, int(np.prod(stacks.shape[2:])))
    repeats = _lead((flat == flat[:, :1]).all(axis=-1))
    zeros = np.minimum(_lead(~flat.any(axis=-1)), k - 1)
    use_zero = (zeros >= 1) & (k - zeros < k - repeats + 1)
    return np.where(use_zero, zeros, repeats - 1), np.where(use_zero, ZERO, SELF).astype(np.int8)


class FrameEncoder:
    """Encodes a worker's (T, E) fragments of stacked observations (``frame_stack`` k >= 1 frames each) or
    single frames (``frame_stack`` 0: an image leaf) as frame chains, one per env."""

    def __init__(self, frame_stack: int, seed: int = 0):
        if frame_stack < 0:
            raise ValueError(f"frame_stack must be >= 0 (0: single frames), got {frame_stack}")
        self.stack = int(frame_stack)
        self.k = max(1, self.stack)  # a single frame is a stack of one without its stack axis
        self._rng = np.random.Generator(np.random.PCG64(seed))
        self.keys: np.ndarray | None = None

    def _stream_keys(self, n_env: int) -> np.ndarray:
        # Seeded, mixed with OS entropy: a restarted worker (same seed) must not claim its old streams.
        if self.keys is None or len(self.keys) != n_env:
            seeded = self._rng.integers(0, 2**62, n_env)
            fresh = np.frombuffer(os.urandom(8 * n_env), np.int64) & (2**62 - 1)
            self.keys = (seeded ^ fresh).astype(np.int64)
        return self.keys

    def encode(self, obs: np.ndarray, next_obs: np.ndarray, done: np.ndarray
               ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """(message frames, obs_ref, next_ref): refs (T, E) are the newest frame of each step's obs
        and next-obs stack within the message's frames. Frames are ordered env by env, in time."""
        obs, next_obs, done = np.asarray(obs), np.asarray(next_obs), np.asarray(done, bool)
        if not self.stack:
            obs, next_obs = obs[:, :, None], next_obs[:, :, None]
        T, E, k = done.shape[0], done.shape[1], self.k
        if obs.shape[:3] != (T, E, k) or next_obs.shape != obs.shape:
            raise ValueError(f"obs and next_obs must be (T, E, {k}, ...) stacks, got {obs.shape}, {next_obs.shape}")
        ob, nb = as_bytes(obs), as_bytes(next_obs)
        fresh = np.ones((T, E), bool)  # the obs stack is written whole: fragment or episode start, or a jump
        fresh[1:] = done[:-1] | ~_equal(ob[1:], nb[:-1])
        cont = _equal(nb[:, :, :-1], ob[:, :, 1:])  # next stack = obs stack shifted by one frame
        fresh, cont = fresh.T, cont.T  # env-major from here: one chain per env
        obs_first, obs_kind = np.zeros((E, T), np.int64), np.zeros((E, T), np.int8)
        nxt_first, nxt_kind = np.full((E, T), k - 1, np.int64), np.zeros((E, T), np.int8)
        obs_first[fresh], obs_kind[fresh] = _padding(ob.swapaxes(0, 1)[fresh], k)
        nxt_first[~cont], nxt_kind[~cont] = _padding(nb.swapaxes(0, 1)[~cont], k)
        c_obs = np.where(fresh, k - obs_first, 0)
        c_next = k - nxt_first
        end = np.cumsum(c_obs + c_next).reshape(E, T)
        base = end - c_obs - c_next
        obs_ref = np.where(fresh, base + c_obs - 1, base - 1)  # else: the previous step's next stack
        next_ref = end - 1
        frames = np.empty((int(end[-1, -1]) if T else 0, *obs.shape[3:]), obs.dtype)
        kinds = np.zeros(len(frames), np.int8)
        _place(frames, obs, base, c_obs, obs_first, T)
        _place(frames, next_obs, base + c_obs, c_next, nxt_first, T)
        kinds[base[fresh]], kinds[(base + c_obs)[~cont]] = obs_kind[fresh], nxt_kind[~cont]
        msg = {FRAMES: frames, KINDS: kinds, CHAIN_KEY: self._stream_keys(E).copy(),
               CHAIN_HEAD: obs_ref[:, 0].copy(), CHAIN_TAIL: next_ref[:, -1].copy(),
               STACK: np.array([self.stack], np.int64)}
        return msg, obs_ref.T, next_ref.T


def _place(out: np.ndarray, stacks: np.ndarray, at: np.ndarray, counts: np.ndarray, first: np.ndarray,
           T: int) -> None:
    """Copy slots [first, k) of each env-major step's stack (T, E, k, ...) to ``out[at:at + count]``."""
    counts, at, first = counts.ravel(), at.ravel(), first.ravel()
    seg = np.repeat(np.arange(len(counts)), counts)
    within = np.arange(len(seg)) - np.repeat(np.cumsum(counts) - counts, counts)
    out[at[seg] + within] = stacks[seg % T, seg // T, first[seg] + within]


def frame_transitions(encoders: dict[str, FrameEncoder], obs: dict[str, np.ndarray], actions, rewards, terminated,
                      truncated, next_obs: dict[str, np.ndarray], gamma: float, n: int
                      ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """A (T, E) fragment's n-step transitions, the observation columns in ``encoders`` as frames: (message,
    rows, boot_rows).

    ``obs`` and ``next_obs`` map observation columns (``obs``, or a structured observation's ``obs.<key>``)
    to (T, E, ...) arrays. The message holds, per encoded column, its frames (`MESSAGE_KEYS`) and per item
    its refs `OBS_REF`/`NEXT_REF` (each under `framed_key`); per item the other columns (``<column>``,
    ``next_<column>``), actions, rewards and discounts. Items are ordered env by env like the frames, so
    later items never need older frames. ``rows``/``boot_rows`` are each item's step and bootstrap step as
    flat indices into the (T, E) arrays (for the worker's own priorities).
    """
    terminated, truncated = np.asarray(terminated, bool), np.asarray(truncated, bool)
    T, E = terminated.shape
    steps = np.arange(T * E).reshape(T, E)
    tr = nstep_transitions(steps, actions, rewards, terminated, truncated, steps, gamma, n)
    order = steps.T.ravel()
    rows, boot = tr["obs"][order], tr["next_obs"][order]
    msg = {"actions": tr["actions"][order], "rewards": tr["rewards"][order], "discounts": tr["discounts"][order]}
    for column, x in obs.items():
        enc, nxt = encoders.get(column), next_obs[column]
        if enc is None:  # stored per item, as a replay without frames stores it
            msg[column] = x.reshape(T * E, *x.shape[2:])[rows]
            msg["next_" + column] = nxt.reshape(T * E, *nxt.shape[2:])[boot]
            continue
        frames, obs_ref, next_ref = enc.encode(x, nxt, terminated | truncated)
        msg.update({framed_key(k, column): v for k, v in frames.items()})
        msg[framed_key(OBS_REF, column)] = obs_ref.ravel()[rows]
        msg[framed_key(NEXT_REF, column)] = next_ref.ravel()[boot]
    return msg, rows, boot
