#!/usr/bin/env bash
# Builds the bridge benchmark (bench/bridge_*.cpp), starts a NATS server on 127.0.0.1, runs
# every case interleaved and keeps the raw output in bench/results/bridge-<date>-<commit>.txt
# (or OUT).
#
#   bash bench/run_bridge.sh [key=value...]     e.g. runs=5 (default), scale=0.5, filter=rtt
#
# The keys go to the driver (build-bench-bridge/bench/bus_bridge; see bench/bridge_bench.cpp).
# Environment: OUT (the raw output's path), BUILD_DIR (default build-bench-bridge), JOBS (default
# 1: the machine has 2 cores and both are measured), NATS_PORT (default 14222), QUIET_WAIT
# (seconds to wait, at most, for the 1-minute load average to fall under 0.5 before starting;
# default 0).
# Installs what it needs (nats-server, libnats-dev: benchmark-only Debian packages); run as root.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/deps.sh nats-server libnats-dev

build=${BUILD_DIR:-build-bench-bridge}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release \
  -DBUS_BUILD_TESTS=OFF -DBUS_BUILD_EXAMPLES=OFF -DBUS_BUILD_BENCH=ON
targets=(bus_bridge bus_bridge_bus bus_bridge_zmq)
# bridge.cmake defines bus_bridge_nats only when it found the NATS C client.
if [[ $(cmake --build "$build" --target help) == *bus_bridge_nats* ]]; then
  targets+=(bus_bridge_nats)
fi
cmake --build "$build" -j "${JOBS:-1}" --target "${targets[@]}"

args=("$@")
port=${NATS_PORT:-14222}
nats_server=$(command -v nats-server || true)
[[ -z $nats_server && -x /usr/sbin/nats-server ]] && nats_server=/usr/sbin/nats-server
nats_pid=
stop_nats() {
  if [[ -n $nats_pid ]]; then
    kill "$nats_pid" 2>/dev/null || true
    wait "$nats_pid" 2>/dev/null || true  # 143: it ended on our SIGTERM
  fi
}
trap stop_nats EXIT
if [[ -n $nats_server ]]; then
  # Not pinned: the broker is a third process and takes whichever core is free.
  "$nats_server" -a 127.0.0.1 -p "$port" >"$build/nats-server.log" 2>&1 &
  nats_pid=$!
  for _ in $(seq 50); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.1
  done
  args=("nats=nats://127.0.0.1:$port" "nats_pid=$nats_pid" "${args[@]}")
else
  echo "run_bridge: nats-server not found: the NATS cases are skipped" >&2
fi

waited=0
while ((waited < ${QUIET_WAIT:-0})) && awk '{exit !($1 >= 0.5)}' /proc/loadavg; do
  ((waited % 30 == 0)) && echo "run_bridge: load average $(cut -d' ' -f1-3 /proc/loadavg), waiting"
  sleep 5
  waited=$((waited + 5))
done

mkdir -p bench/results
# Named by date and commit (OUT overrides), so a partial run (filter=...) does not overwrite the
# kept output of another commit measured the same day.
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
out=${OUT:-bench/results/bridge-$(date +%F)-$commit.txt}
# Other work lands in the tree while benchmarks run: say which bridge was measured.
source_line=$commit
git diff --quiet HEAD -- bus CMakeLists.txt 2>/dev/null ||
  source_line+=" + uncommitted changes under bus/ or CMakeLists.txt"
{
  echo "reproduce: bash bench/run_bridge.sh $*"
  echo "source:    $source_line"
  "$build/bench/bus_bridge" "${args[@]}" 2>&1
} | tee "$out"
echo "run_bridge: raw output in $out"
