#!/usr/bin/env bash
# Starts the three demo programs on one bus, lets them run, stops them with SIGTERM and checks
# that each stopped cleanly. They find each other over ZeroMQ (tcp on 127.0.0.1) and, being on
# one host, link over shared memory; DEMO_TRANSPORT=zmq keeps them on ZeroMQ.
#   usage: run.sh <folder with demo_producer, demo_aggregator, demo_monitor> [seconds]
set -euo pipefail
bin=${1:?usage: run.sh <bin folder> [seconds]}
seconds=${2:-${DEMO_SECONDS:-6}}
base=${DEMO_PORT_BASE:-7400}
transport=${DEMO_TRANSPORT:-auto}
prod="tcp://127.0.0.1:$((base + 1))"
agg="tcp://127.0.0.1:$((base + 11))"
agg_req="tcp://127.0.0.1:$((base + 12))"
mon="tcp://127.0.0.1:$((base + 21))"

for program in demo_producer demo_aggregator demo_monitor; do
  [[ -x "$bin/$program" ]] || { echo "run.sh: $bin/$program is missing (build it first)" >&2; exit 1; }
done

pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

echo "== demo: producer -> aggregator (a service) <- monitor, for ${seconds}s (ports from $base, transport $transport)"
"$bin/demo_aggregator" --publish="$agg" --requests="$agg_req" --peers="$prod,$mon" --transport="$transport" &
pids+=($!)
"$bin/demo_monitor" --publish="$mon" --peers="$prod,$agg" --transport="$transport" &
pids+=($!)
"$bin/demo_producer" --publish="$prod" --peers="$agg,$mon" --rate=200 --transport="$transport" &
pids+=($!)

sleep "$seconds"
echo "== stopping (SIGTERM)"
# Producer first, so the others see its last readings before they stop.
kill -TERM "${pids[2]}"
wait "${pids[2]}" && rc_p=0 || rc_p=$?
sleep 0.5
kill -TERM "${pids[0]}" "${pids[1]}"
wait "${pids[0]}" && rc_a=0 || rc_a=$?
wait "${pids[1]}" && rc_m=0 || rc_m=$?
pids=()
if ((rc_p || rc_a || rc_m)); then
  echo "== demo FAILED: exit codes producer=$rc_p aggregator=$rc_a monitor=$rc_m"
  exit 1
fi
echo "== demo done: all three stopped cleanly"
