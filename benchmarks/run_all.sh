#!/usr/bin/env bash
# Prints every benchmark's numbers; not part of the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
taskset -c 0 python benchmarks/bench_env.py "$@" 2>/dev/null || python benchmarks/bench_env.py
python benchmarks/bench_rollout_train.py
python benchmarks/bench_search.py
python benchmarks/bench_scoring.py
python benchmarks/bench_tools.py
python benchmarks/bench_servers.py
python benchmarks/bench_scaling.py
