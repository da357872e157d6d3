#!/usr/bin/env bash
# BenchMARL's own venv for bench/peers/benchmarl_mappo.py: benchmarl 1.5.2 (torchrl 0.11, tensordict 0.11,
# hydra-core, torchvision, av) is never a dependency of distrl. torch is pinned first, and kept pinned while the
# rest resolves: an unpinned one would pull a multi-GB CUDA build.
#
# The env: BenchMARL's pettingzoo/simple_spread task is TorchRL's PettingZooEnv(task="simple_spread_v3"), which
# imports pettingzoo.mpe. PettingZoo 1.25.0 is the last release with pettingzoo.mpe (1.26 moved MPE to the mpe2
# package distrl uses), so it is pinned, with its `mpe` extra (pygame) rather than BenchMARL's `pettingzoo` extra
# (pettingzoo[all]: Atari, Box2D, chess, ... none of which the task needs). `python -m bench.peers.benchmarl_mappo
# --check-env` (from distrl's venv) checks that it steps as mpe2's simple_spread_v3 does.
set -euo pipefail
cd "$(dirname "$0")"
python3 -m venv .venv-benchmarl
.venv-benchmarl/bin/pip install -q --upgrade pip
.venv-benchmarl/bin/pip install -q torch==2.13.0
.venv-benchmarl/bin/pip install -q benchmarl==1.5.2 "pettingzoo[mpe]==1.25.0" torch==2.13.0
.venv-benchmarl/bin/python -W ignore -c 'from benchmarl.environments import PettingZooTask
from pettingzoo.mpe import simple_spread_v3
task = PettingZooTask.SIMPLE_SPREAD.get_from_yaml()
task.config.update(max_cycles=25)
env = task.get_env_fun(num_envs=1, continuous_actions=False, seed=0, device="cpu")()
assert env.group_map == {"agent": ["agent_0", "agent_1", "agent_2"]}, env.group_map
env.rollout(3)
env.close()'
