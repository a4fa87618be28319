#!/usr/bin/env bash
# Everything decoder-parity needs on a fresh CPU machine, into the current python.
# torch first, pinned to the CPU wheel: an unpinned torch (asked for by the project's extras) would
# otherwise pull a multi-GB CUDA build. A GPU user installs their CUDA torch instead (see README).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
# ml_dtypes below 0.7: 0.7.0's extension takes 1.2 s to load (0.6.0: 0.05 s, measured 2026-12-01 on an AMD EPYC), and
# every process that imports JAX or the safetensors reader loads it: the test suite starts many of them (tensor- and
# expert-parallel ranks, CLI runs). Both satisfy jax's ml_dtypes>=0.5; users are not pinned.
python -m pip install --quiet --disable-pip-version-check -e ".[dev]" "ml_dtypes>=0.5,<0.7"
