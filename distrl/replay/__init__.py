"""Replay storage: sum tree, (prioritized) ring buffer and n-step targets."""

from distrl.replay.buffer import ReplayBuffer
from distrl.replay.nstep import nstep_transitions
from distrl.replay.sumtree import SumTree

__all__ = ["SumTree", "ReplayBuffer", "nstep_transitions"]
