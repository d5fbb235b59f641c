#!/usr/bin/env bash
# Builds the same-host benchmark (bench/shm_bench.cpp and its role programs), starts iceoryx's
# RouDi with bench/shm_roudi.toml, runs every case interleaved, stops RouDi, keeps the raw output
# in bench/results/shm-<date>-<commit>.txt (or OUT) and draws bench/results/shm-<...>.png.
#
#   bash bench/run_shm.sh [key=value...]      e.g. runs=5 (default), scale=0.5, filter=rtt64B
#
# The keys go to the driver (build-bench-bridge/bench/bus_shm; see bench/shm_bench.cpp).
# Environment: OUT, BUILD_DIR (default build-bench-bridge, shared with run_bridge.sh), JOBS
# (default 1: both cores are measured).
# Installs what it needs (iceoryx, libiceoryx-posh-dev, python3-matplotlib: benchmark-only
# Debian packages); run as root.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/deps.sh iceoryx libiceoryx-posh-dev python3-matplotlib

build=${BUILD_DIR:-build-bench-bridge}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release \
  -DBUS_BUILD_TESTS=OFF -DBUS_BUILD_EXAMPLES=OFF -DBUS_BUILD_BENCH=ON >/dev/null
targets=(bus_shm bus_bridge_bus bus_shm_raw)
if [[ $(cmake --build "$build" --target help) == *bus_shm_iceoryx* ]]; then
  targets+=(bus_shm_iceoryx)
fi
cmake --build "$build" -j "${JOBS:-1}" --target "${targets[@]}"

args=("$@")
roudi_pid=
stop_roudi() {
  if [[ -n $roudi_pid ]]; then
    # SIGTERM: RouDi removes its shared memory (/dev/shm/iceoryx_mgmt and the segment) itself.
    kill -TERM "$roudi_pid" 2>/dev/null || true
    wait "$roudi_pid" 2>/dev/null || true
  fi
}
trap stop_roudi EXIT
roudi=$(command -v iox-roudi || true)
if [[ -n $roudi && -x $build/bench/bus_shm_iceoryx ]]; then
  # Not pinned: RouDi's discovery loop only makes the connections; it is idle while cases run.
  "$roudi" -c bench/shm_roudi.toml >"$build/roudi.log" 2>&1 &
  roudi_pid=$!
  for _ in $(seq 50); do
    grep -q "RouDi is ready" "$build/roudi.log" 2>/dev/null && break
    sleep 0.1
  done
else
  echo "run_shm: iox-roudi or bus_shm_iceoryx missing: the iceoryx cases are skipped" >&2
  args=("iceoryx=0" "${args[@]}")
fi

mkdir -p bench/results
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
out=${OUT:-bench/results/shm-$(date +%F)-$commit.txt}
source_line=$commit
git diff --quiet HEAD -- bus CMakeLists.txt 2>/dev/null ||
  source_line+=" + uncommitted changes under bus/ or CMakeLists.txt"
{
  echo "reproduce: bash bench/run_shm.sh $*"
  echo "source:    $source_line"
  "$build/bench/bus_shm" "${args[@]}" 2>&1
} | tee "$out"
# Debian's interpreter: the package above installs matplotlib for it, not for another python3
# that may come first on PATH.
/usr/bin/python3 bench/shm_chart.py "$out" "${out%.txt}.png"
echo "run_shm: raw output in $out, chart in ${out%.txt}.png"
