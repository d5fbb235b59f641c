#!/usr/bin/env bash
# Builds bench/queues.cpp (bus_queues), runs it, keeps its raw output in
# bench/results/queues-<date>-<commit>.txt (or OUT) and draws bench/results/queues.png from it
# (gnuplot).
#
#   bash bench/run_queues.sh [items=20000000] [runs=5] [round_trips=200000] [filter]
#
# Environment: OUT (the raw output's path), BUILD_DIR (default build-queues), BUILD_TYPE (default
# RelWithDebInfo, the project's default), JOBS (default 1: the machine has 2 cores and one of them
# is measured).
# Installs the peers (benchmark-only Debian packages) and gnuplot when missing; run as root.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/deps.sh libatomic-queue-dev libreaderwriterqueue-dev libconcurrentqueue-dev \
  libboost-dev cppzmq-dev libzmq3-dev gnuplot-nox

build=${BUILD_DIR:-build-queues}
args=(-DBUS_BUILD_TESTS=OFF -DBUS_BUILD_EXAMPLES=OFF -DBUS_BUILD_BENCH=ON
  "-DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo}")
cmake -S . -B "$build" "${args[@]}"
cmake --build "$build" --target bus_queues -j "${JOBS:-1}"

mkdir -p bench/results
# Named by date and commit (OUT overrides), so a partial run (a filter) does not overwrite the
# kept output of another commit measured the same day.
out=${OUT:-bench/results/queues-$(date +%F)-$(git rev-parse --short HEAD 2>/dev/null || echo unknown).txt}
"$build/bench/bus_queues" "$@" | tee "$out"

if grep -q '^chart|' "$out"; then
  gnuplot -e "datafile='$out'; outfile='bench/results/queues.png'" bench/queues.gnuplot
  echo "run_queues: raw output $out, chart bench/results/queues.png"
else
  echo "run_queues: raw output $out (no throughput rows: no chart)"
fi
