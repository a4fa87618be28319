#!/usr/bin/env bash
# Everything decoder-parity needs on a fresh CPU machine, into the current python.
# torch first, pinned to the CPU wheel: an unpinned torch (asked for by the project's extras) would
# otherwise pull a multi-GB CUDA build. A GPU user installs their CUDA torch instead (see README).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
python -m pip install --quiet --disable-pip-version-check -e ".[dev]"
