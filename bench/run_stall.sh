#!/usr/bin/env bash
# Builds the stall benchmark (bench/bridge_stall.cpp) and runs it: one publisher, three
# subscribers in their own processes, the third stopped (SIGSTOP) for part of every other run.
# Keeps the raw output in bench/results/stall-<date>-<commit>.txt (or OUT).
#
#   bash bench/run_stall.sh [key=value...]     e.g. runs=5 (default), rate=200000, size=64
#
# The keys go to the driver (build-bench-bridge/bench/bus_bridge_stall; see its header).
# Environment: OUT, BUILD_DIR (default build-bench-bridge, shared with run_bridge.sh), JOBS.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/deps.sh
build=${BUILD_DIR:-build-bench-bridge}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release \
  -DBUS_BUILD_TESTS=OFF -DBUS_BUILD_EXAMPLES=OFF -DBUS_BUILD_BENCH=ON >/dev/null
cmake --build "$build" -j "${JOBS:-1}" --target bus_bridge_stall

mkdir -p bench/results
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
out=${OUT:-bench/results/stall-$(date +%F)-$commit.txt}
source_line=$commit
git diff --quiet HEAD -- bus bench CMakeLists.txt 2>/dev/null ||
  source_line+=" + uncommitted changes under bus/, bench/ or CMakeLists.txt"
{
  echo "reproduce: bash bench/run_stall.sh $*"
  echo "source:    $source_line"
  "$build/bench/bus_bridge_stall" "$@" 2>&1
} | tee "$out"
echo "run_stall: raw output in $out"
