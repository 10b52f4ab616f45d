#!/usr/bin/env bash
# Run here once, before a device check: downloads the pure-Python wheels that the GPU
# image lacks (it has torch, transformers and peft, but no gymnasium or omegaconf, and
# it cannot reach a package index) into .wheels/ (git-ignored; carry it to the device).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .wheels
python -m pip download -q --no-deps --only-binary=:all: -d .wheels \
    "gymnasium>=1.0" farama-notifications "omegaconf>=2.4"
ls -l .wheels
