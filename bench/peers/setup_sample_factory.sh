#!/usr/bin/env bash
# The Sample Factory peer's own venv: sample-factory 2.1 pins gymnasium < 1.0 and numpy < 2, so it cannot share
# distrl's. torch is pinned first: an unpinned one would pull a multi-GB CUDA build.
#
# Atari: sample-factory's `atari` extra is gymnasium[atari,accept-rom-license], i.e. ale-py 0.8 plus AutoROM, which
# downloads the ROMs from the internet at install time. ale-py 0.9 ships the ROMs inside its wheel and needs no
# gymnasium at install (0.10+ is built for gymnasium 1.x), so it is installed directly instead of the extra. It has
# no gymnasium entry point: its envs are registered by `import ale_py` (sample_factory_atari.py does that).
#
# VizDoom (sample_factory_vizdoom.py): sample-factory's `vizdoom` extra is vizdoom < 2.0 plus gymnasium[classic_control]
# (pygame, for rendering only); vizdoom 1.3.2's manylinux wheel needs gymnasium >= 0.28 and any numpy, so it sits
# beside the pins above (it pulls pygame-ce). Its wheel carries the engine and freedoom2.wad; SF's scenarios ship
# inside sf_examples.
set -euo pipefail
cd "$(dirname "$0")"
python3 -m venv .venv-sf
.venv-sf/bin/pip install -q --upgrade pip
.venv-sf/bin/pip install -q torch==2.13.0
.venv-sf/bin/pip install -q sample-factory==2.1.1 gymnasium==0.29.1 numpy==1.26.4 ale-py==0.9.1 vizdoom==1.3.2
.venv-sf/bin/python -c 'import ale_py, gymnasium as gym
for env_id in ("ALE/Breakout-v5", "BreakoutNoFrameskip-v4"):
    gym.make(env_id).close()'
# in a temp dir: a DoomGame writes _vizdoom.ini and _vizdoom/ into the working directory
python="$PWD/.venv-sf/bin/python"; check_dir="$(mktemp -d)"
(cd "$check_dir" && "$python" -c 'from sf_examples.vizdoom.doom.doom_utils import make_doom_env
from sf_examples.vizdoom.train_vizdoom import parse_vizdoom_cfg
make_doom_env("doom_basic", parse_vizdoom_cfg(argv=["--env=doom_basic", "--device=cpu"]), None).close()')
rm -rf "$check_dir"
