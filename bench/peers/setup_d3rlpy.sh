#!/usr/bin/env bash
# The d3rlpy peer's own venv: d3rlpy pins gymnasium 1.0, so it cannot share distrl's. torch is pinned first:
# an unpinned one would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")"
python3 -m venv .venv-d3rlpy
.venv-d3rlpy/bin/pip install -q --upgrade pip
.venv-d3rlpy/bin/pip install -q torch==2.13.0
.venv-d3rlpy/bin/pip install -q d3rlpy==2.8.1 h5py
