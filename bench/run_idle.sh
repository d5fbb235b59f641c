#!/usr/bin/env bash
# The idle cost of a full mesh: N bus_fixture_node processes on 127.0.0.1 (each exporting and
# importing one topic, default heartbeat 200 ms), CPU and RSS per node over an idle window once
# every node sees every other (bench/idle_mesh.py). Keeps the raw output in
# bench/results/idle-<date>-<commit>.txt (or OUT).
#
#   bash bench/run_idle.sh [--nodes 2,8,32,64] [--seconds 10] [--heartbeat-ms 200]
#
# Environment: OUT, BUILD_DIR (default build; needs the tests, for bus_fixture_node), JOBS,
# FIXTURE (a bus_fixture_node already built: no build step).
set -euo pipefail
cd "$(dirname "$0")/.."

build=${BUILD_DIR:-build}
fixture=${FIXTURE:-}
if [[ -z $fixture ]]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" -j "${JOBS:-2}" --target bus_fixture_node
  fixture=$build/tests/integration/bus_fixture_node
fi

mkdir -p bench/results
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
out=${OUT:-bench/results/idle-$(date +%F)-$commit.txt}
source_line=$commit
git diff --quiet HEAD -- bus bench CMakeLists.txt 2>/dev/null ||
  source_line+=" + uncommitted changes under bus/, bench/ or CMakeLists.txt"
{
  echo "reproduce: bash bench/run_idle.sh $*"
  echo "source:    $source_line"
  python3 bench/idle_mesh.py "$fixture" "$@" 2>&1
} | tee "$out"
echo "run_idle: raw output in $out"
