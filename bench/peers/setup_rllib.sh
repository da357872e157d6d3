#!/usr/bin/env bash
# RLlib's own venv for bench/peers/rllib_external.py: ray[rllib] at the Ray version distrl runs on, never a
# dependency of distrl. torch is pinned first: an unpinned one would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")"
python3 -m venv .venv-rllib
.venv-rllib/bin/pip install -q --upgrade pip
.venv-rllib/bin/pip install -q torch==2.13.0
.venv-rllib/bin/pip install -q "ray[rllib]==2.60.*" "gymnasium[classic-control]>=1.1,<2" msgpack msgpack-numpy  # rllink.py imports them
.venv-rllib/bin/python -c 'import ray.rllib.env.external.env_runner_server_for_external_inference'
