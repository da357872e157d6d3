"""Experience storage: sum tree, (prioritized) ring buffer, n-step targets, the on-policy FIFO."""

from distrl.replay.buffer import ReplayBuffer
from distrl.replay.fifo import FragmentQueue
from distrl.replay.nstep import nstep_transitions
from distrl.replay.sumtree import SumTree

__all__ = ["FragmentQueue", "ReplayBuffer", "SumTree", "nstep_transitions"]
