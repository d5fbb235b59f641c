#!/usr/bin/env bash
# A network partition under traffic, measured: two "hosts" (network namespaces) joined through
# a third that routes between them. On host a a publisher paces readings at RATE a second to a
# healthy subscriber beside it and to one on host b; after 5 s the router drops everything
# between the hosts (silently, both ways: MODE=silent) or takes b's link down (MODE=link) for
# each partition length, then lets it through again. Per length it prints:
#   - the healthy subscriber's rate during the partition over its rate in the 4 s before it,
#   - the publisher's pace: how long it took for its readings over how long they should take,
#   - how long after the network returned the partitioned subscriber had its next reading,
#   - the publisher's stalls and cuts, and whether every receiver's received + gaps equals what
#     was published and the publisher's count of what far missed equals far's gaps.
# Nodes use the library's defaults (heartbeat 200 ms, dead after 3, send_stall_limit 100 ms),
# over ZeroMQ (the healthy subscriber shares the publisher's socket with the partitioned one).
#
#   bash bench/run_partition.sh [lengths="2 10 30"] [rate=20000] [mode=silent|link] [runs=1]
#
# Environment: OUT (raw output; default bench/results/partition-<date>-<commit>.txt),
# BUILD_DIR (default build), JOBS, BEFORE=<another bus_fixture_node> to measure it too, in turn
# with this tree's (an A/B in one run). Needs root (network namespaces).
set -euo pipefail
cd "$(dirname "$0")/.."

lengths="2 10 30" rate=20000 mode=silent runs=1
for kv in "$@"; do
  case $kv in
    lengths=*) lengths=${kv#*=} ;; rate=*) rate=${kv#*=} ;; mode=*) mode=${kv#*=} ;;
    runs=*) runs=${kv#*=} ;;
    *) echo "run_partition: unknown argument $kv" >&2; exit 1 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "run_partition: needs root (network namespaces)" >&2; exit 1; }

bash scripts/deps.sh
command -v ip >/dev/null || apt-get install -y iproute2
command -v bc >/dev/null || apt-get install -y bc
build=${BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "${JOBS:-2}" --target bus_fixture_node
fixtures=("$PWD/$build/tests/integration/bus_fixture_node")
[ -n "${BEFORE:-}" ] && fixtures+=("$(realpath "$BEFORE")")

work=$(mktemp -d)
ns=bus-bench-$$
cleanup() {
  for n in a b r; do
    ip netns pids "$ns-$n" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns-$n" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

hosts_up() {
  for n in a b r; do ip netns add "$ns-$n"; ip -n "$ns-$n" link set lo up; done
  ip -n "$ns-a" link add veth0 type veth peer name to-a netns "$ns-r"
  ip -n "$ns-b" link add veth0 type veth peer name to-b netns "$ns-r"
  ip -n "$ns-a" addr add 10.200.1.1/24 dev veth0
  ip -n "$ns-b" addr add 10.200.2.2/24 dev veth0
  ip -n "$ns-r" addr add 10.200.1.254/24 dev to-a
  ip -n "$ns-r" addr add 10.200.2.254/24 dev to-b
  for x in "a veth0" "b veth0" "r to-a" "r to-b"; do set -- $x; ip -n "$ns-$1" link set "$2" up; done
  ip -n "$ns-a" route add default via 10.200.1.254
  ip -n "$ns-b" route add default via 10.200.2.254
  ip netns exec "$ns-r" sh -c 'echo 1 > /proc/sys/net/ipv4/ip_forward'
}
hosts_down() { for n in a b r; do ip netns del "$ns-$n" 2>/dev/null || true; done; }
partition_on() {
  if [ "$mode" = link ]; then ip -n "$ns-r" link set to-b down; return; fi
  ip -n "$ns-r" rule add iif to-a to 10.200.2.0/24 blackhole
  ip -n "$ns-r" rule add iif to-b to 10.200.1.0/24 blackhole
}
partition_off() {
  if [ "$mode" = link ]; then ip -n "$ns-r" link set to-b up; return; fi
  ip -n "$ns-r" rule del iif to-a to 10.200.2.0/24 blackhole
  ip -n "$ns-r" rule del iif to-b to 10.200.1.0/24 blackhole
}

# A node: its commands go to $work/NAME.in, its answers to $work/NAME.out.
start_node() {  # fixture name host port flags...
  local fixture=$1 name=$2 host=$3 port=$4; shift 4
  mkfifo "$work/$name.in"
  ip netns exec "$ns-$host" "$fixture" --name="$name" --transport=zmq --heartbeat-ms=200 \
    --dead-after=3 --stall-limit-ms=100 --publish-on="tcp://$(addr "$host"):$port" \
    --requests-on="tcp://$(addr "$host"):$((port + 1))" "$@" \
    <"$work/$name.in" >"$work/$name.out" 2>>"$work/$name.err" &
  eval "exec {fd_$name}>$work/$name.in"
  local waited=0
  while ! grep -q '^ready' "$work/$name.out"; do
    sleep 0.01
    waited=$((waited + 1))
    ((waited < 6000)) || { echo "run_partition: $name did not start" >&2; cat "$work/$name.err" >&2; exit 1; }
  done
}
addr() { [ "$1" = a ] && echo 10.200.1.1 || echo 10.200.2.2; }
send() { local fd=fd_$1; shift; echo "$*" >&"${!fd}"; }
# ask NAME COMMAND: its answer line.
ask() {
  local name=$1; shift
  local before; before=$(wc -l <"$work/$name.out")
  send "$name" "$@"
  while [ "$(wc -l <"$work/$name.out")" -le "$before" ]; do sleep 0.01; done
  sed -n "$((before + 1))p" "$work/$name.out"
}
field() { grep -o " $1=[0-9]*" <<<"$2" | head -1 | cut -d= -f2; }
now() { date +%s.%N; }

one_run() {  # fixture length
  local fixture=$1 length=$2
  hosts_up
  start_node "$fixture" pub a 7101 --export-readings --peer=tcp://10.200.1.1:7111 \
    --peer=tcp://10.200.2.2:7121
  start_node "$fixture" near a 7111 --import-readings --peer=tcp://10.200.1.1:7101
  start_node "$fixture" far b 7121 --import-readings --peer=tcp://10.200.1.1:7101
  ask pub wait-peers 2 >/dev/null
  ask far wait-peers 1 >/dev/null
  ask pub wait-subscribers 2 >/dev/null
  local total=$((rate * (5 + length + 10)))
  local t0; t0=$(now)
  send pub publish-at "$total" "$rate"
  sleep 1
  local n1 t1 n2 t2; n1=$(field received "$(ask near report)"); t1=$(now)
  sleep 4
  n2=$(field received "$(ask near report)"); t2=$(now)
  partition_on
  local n3 t3; n3=$(field received "$(ask near report)"); t3=$(now)
  sleep "$length"
  local n4 t4 f4; n4=$(field received "$(ask near report)"); t4=$(now)
  f4=$(field received "$(ask far report)")
  partition_off
  local tu; tu=$(now)
  local back="" tp=""
  while [ -z "$back" ]; do
    # The publisher may finish before far is back: its end is taken when it answers.
    [ -z "$tp" ] && grep -q '^published' "$work/pub.out" && tp=$(now)
    if [ "$(field received "$(ask far report)")" -gt "$f4" ]; then back=$(printf '%.2f' "$(echo "$(now) - $tu" | bc)"); fi
    sleep 0.01
    [ "$(echo "$(now) - $tu > 120" | bc)" = 1 ] && back=never
  done
  while [ -z "$tp" ]; do
    grep -q '^published' "$work/pub.out" && tp=$(now)
    sleep 0.01
  done
  sleep 3
  local p n f; p=$(ask pub report); n=$(ask near report); f=$(ask far report)
  local before_rate during_rate
  before_rate=$(echo "($n2 - $n1) / ($t2 - $t1)" | bc -l)
  during_rate=$(echo "($n4 - $n3) / ($t4 - $t3)" | bc -l)
  local nearsum farsum
  nearsum=$(( $(field received "$n") + $(field readings.gaps "$n") ))
  farsum=$(( $(field received "$f") + $(field readings.gaps "$f") ))
  printf '%-9s partition %3s s: healthy %6.0f/s during vs %6.0f/s before (%.2fx); publisher %5.1f s for %3d s of readings (%.2fx); far back %s s after the network; stalls %s cuts %s; far lost %s returned %s (pub: %s/%s); received+gaps==published near %s far %s; missed_by==gaps %s\n' \
    "$3" "$length" "$during_rate" "$before_rate" "$(echo "$during_rate / $before_rate" | bc -l)" \
    "$(echo "$tp - $t0" | bc)" "$((5 + length + 10))" \
    "$(echo "($tp - $t0) / (5 + $length + 10)" | bc -l)" "$back" \
    "$(field publish_stalls "$p")" "$(field publish_cuts "$p")" \
    "$(field peers_lost "$f")" "$(field peers_returned "$f")" \
    "$(field peers_lost "$p")" "$(field peers_returned "$p")" \
    "$([ "$nearsum" = "$total" ] && echo yes || echo "NO ($nearsum of $total)")" \
    "$([ "$farsum" = "$total" ] && echo yes || echo "NO ($farsum of $total)")" \
    "$([ "$(field missed_by.far "$p")" = "$(field readings.gaps "$f")" ] && echo yes || echo NO)"
  for name in pub near far; do send "$name" quit; done
  wait
  for name in pub near far; do
    local fd=fd_$name; exec {fd}>&-
    rm -f "$work/$name.in" "$work/$name.out"
  done
  hosts_down
}

mkdir -p bench/results
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
out=${OUT:-bench/results/partition-$(date +%F)-$commit.txt}
source_line=$commit
git diff --quiet HEAD -- bus schemas bench tests/integration CMakeLists.txt 2>/dev/null ||
  source_line+=" + uncommitted changes under bus/, schemas/, bench/, tests/integration/ or CMakeLists.txt"
{
  echo "reproduce: bash bench/run_partition.sh $*"
  echo "source:    $source_line"
  echo "mode=$mode rate=$rate/s; nodes: heartbeat 200 ms, dead after 3, send_stall_limit 100 ms"
  echo "this:      ${fixtures[0]}"
  [ ${#fixtures[@]} -gt 1 ] && echo "before:    ${fixtures[1]} (${BEFORE_SOURCE:-its source not given: BEFORE_SOURCE=<commit>})"
  for length in $lengths; do
    for ((i = 0; i < runs; i++)); do
      label=this
      one_run "${fixtures[0]}" "$length" "$label"
      if [ ${#fixtures[@]} -gt 1 ]; then one_run "${fixtures[1]}" "$length" before; fi
    done
  done
} | tee "$out"
echo "run_partition: raw output in $out"
