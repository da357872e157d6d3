"""Bytes a replay allocates per unit of ``replay.capacity``, from the env's spaces, before any is built.

The same arithmetic as the stores' arrays (`ReplayBuffer`, its `FrameRing`, `SequenceReplay`), so a
capacity the machine cannot hold is refused by what the replay would really take: observations as
stored (floats as float32, uint8 and bool as themselves, a structured observation's leaves summed), each
frame once when observations stack frames or are a structured observation's image leaves, and the per-item
fields, generation and sum-tree share next to them.
"""
from __future__ import annotations

import numpy as np

from distrl import tree
from distrl.replay.frames import is_frame_leaf

_LINK = 8           # a frame's int64 link to the frame before it
_FRAME_REFS = 3 * 8  # a framed item's obs, next-obs and oldest frame (int64)
_FLAT_FIELDS = 4 + 4 + 4 + 8  # rewards, discounts (float32), version (int32), generation (int64)
_STEP_FIELDS = 4 + 4 + 4  # rewards, discount, mask (float32)
_CHUNK_META = 3 * 8  # a chunk slot's key, length and refcount (int64)


def stored_bytes(space) -> int:
    """Bytes of one value of a space as replay stores it: floats as float32, else its own dtype (a Discrete
    as int64); a structured observation's leaves summed."""
    return sum(_leaf_bytes(s) for _, s in tree.leaf_spaces(space))


def _leaf_bytes(space) -> int:
    dtype = np.dtype(getattr(space, "dtype", None) or np.float32)
    return int(np.prod(getattr(space, "shape", None) or (1,))) * (4 if dtype.kind == "f" else dtype.itemsize)


def _image_leaves(space) -> list[int]:
    """Bytes of each image leaf (uint8, 3 dims) of a structured observation, which replay keeps as frames."""
    if not tree.is_structured(space):
        return []
    return [_leaf_bytes(s) for _, s in tree.leaf_spaces(space)
            if is_frame_leaf(getattr(s, "shape", None) or (), getattr(s, "dtype", None))]


def action_bytes(space) -> int:
    """A stored action: a Discrete one as the int64 the policies emit, a Box as float32."""
    return 8 if not getattr(space, "shape", None) else stored_bytes(space)


def tree_bytes(capacity: int) -> float:
    """A sum tree's share per leaf: 2L float64 nodes, L the power of two >= capacity."""
    leaves = 1 << max(0, (int(capacity) - 1).bit_length())
    return 2 * leaves * 8 / capacity


def flat_item_bytes(obs_space, action_space, capacity: int, frame_stack: int = 0, num_agents: int = 1,
                    prioritized: bool = True) -> int:
    """Bytes per item of a flat replay of ``capacity`` items (Ape-X DQN, SAC): obs and next_obs, or with
    ``frame_stack`` > 0 one frame and its link (the ring holds about one frame per item) and refs; a
    structured observation's image leaves each as one frame, link and refs, its other leaves twice."""
    obs = stored_bytes(obs_space) * num_agents
    per = action_bytes(action_space) + _FLAT_FIELDS + (tree_bytes(capacity) if prioritized else 0)
    if frame_stack > 0:
        ring = capacity + 2 * frame_stack  # FrameRing's capacity in ReplayBuffer
        return int(np.ceil(per + _FRAME_REFS + (obs // frame_stack + _LINK) * ring / capacity))
    images = _image_leaves(obs_space)
    ring = capacity + 2  # a ring of single frames
    per += 2 * (obs - sum(images)) + sum(_FRAME_REFS + (b + _LINK) * ring / capacity for b in images)
    return int(np.ceil(per))


def sequence_step_bytes(obs_space, action_space, chunk_length: int, frame_stack: int = 0,
                        num_agents: int = 1) -> int:
    """Bytes per stored step of sequence replay (R2D2, DHC): its obs, or with ``frame_stack`` > 0 its
    newest frame plus its share of its chunk's first stack, and the step fields. Items (a few per
    ``period`` steps) come on top."""
    obs = stored_bytes(obs_space) * num_agents
    if frame_stack > 0:
        obs = obs // frame_stack * (chunk_length + frame_stack - 1) / chunk_length
    per = obs + action_bytes(action_space) * num_agents + _STEP_FIELDS + _CHUNK_META / chunk_length
    return int(np.ceil(per))
