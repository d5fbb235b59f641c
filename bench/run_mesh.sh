#!/usr/bin/env bash
# The full mesh from 2 to 64 nodes (bench/mesh.py), found from static peer lists and from etcd:
# time to full membership, idle CPU and RSS per node, fan-out deliveries/s from one publisher to
# the N-1 others; RUNS runs of each, then the medians and a PNG chart (bench/mesh_chart.py).
# Starts its own etcd on 127.0.0.1 (Debian's etcd-server), installed when missing.
#
#   bash bench/run_mesh.sh [NODES=2,4,8,16,32,64] [RUNS=3] [SECONDS=10] [FANOUT=100000]
#
# Raw output: bench/results/mesh-<date>-<commit>.txt and .png (or OUT, without extension).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh etcd-server etcd-client python3-matplotlib

nodes=${NODES:-2,4,8,16,32,64}
runs=${RUNS:-3}
seconds=${SECONDS_IDLE:-10}
fanout=${FANOUT:-100000}
build=${BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "${JOBS:-2}" --target bus_fixture_node
fixture=$build/tests/integration/bus_fixture_node

mkdir -p bench/results
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
out=${OUT:-bench/results/mesh-$(date +%F)-$commit}
source_line=$commit
git diff --quiet HEAD -- bus bench CMakeLists.txt 2>/dev/null ||
  source_line+=" + uncommitted changes under bus/, bench/ or CMakeLists.txt"

etcd_dir=$(mktemp -d /tmp/bus-mesh-etcd-XXXXXX)
port=$((23000 + RANDOM % 2000))
etcd --name mesh --data-dir "$etcd_dir/data" --listen-client-urls "http://127.0.0.1:$port" \
  --advertise-client-urls "http://127.0.0.1:$port" \
  --listen-peer-urls "http://127.0.0.1:$((port + 1))" \
  --initial-advertise-peer-urls "http://127.0.0.1:$((port + 1))" \
  --initial-cluster "mesh=http://127.0.0.1:$((port + 1))" >"$etcd_dir/etcd.log" 2>&1 &
etcd_pid=$!
trap 'kill $etcd_pid 2>/dev/null; wait $etcd_pid 2>/dev/null; rm -rf "$etcd_dir"' EXIT
for _ in $(seq 100); do
  curl -s "http://127.0.0.1:$port/health" | grep -q true && break
  sleep 0.1
done

{
  echo "reproduce: NODES=$nodes RUNS=$runs SECONDS_IDLE=$seconds FANOUT=$fanout bash bench/run_mesh.sh"
  echo "source:    $source_line"
  for run in $(seq "$runs"); do
    for membership in static etcd; do
      echo "# run $run, $membership"
      python3 bench/mesh.py "$fixture" --membership "$membership" --nodes "$nodes" \
        --seconds "$seconds" --fanout "$fanout" --etcd "http://127.0.0.1:$port" 2>&1
    done
  done
} | tee "$out.txt"
python3 bench/mesh_chart.py "$out.txt" "$out.png" | tee -a "$out.txt"
echo "run_mesh: raw output in $out.txt, chart in $out.png"
