#!/usr/bin/env bash
# Instructions per message, publish + dispatch on one thread (bench/instructions.cpp), counted
# with valgrind's callgrind: the internal queue issue's regression figure, stable to a few
# instructions where wall time moves 2-3x. Each case runs at two message counts; the difference
# in instructions over the difference in messages is the per-message figure.
#
#   bash bench/run_instructions.sh   # raw output: bench/results/instructions-<date>-<commit>.txt
#
# Environment: OUT (the raw output's path), BUILD_DIR (default build-queues), N (default 100000:
# the runs use N and 2N).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/deps.sh valgrind bc

build=${BUILD_DIR:-build-queues}
cmake -S . -B "$build" -DBUS_BUILD_TESTS=OFF -DBUS_BUILD_EXAMPLES=OFF -DBUS_BUILD_BENCH=ON \
  "-DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo}" >/dev/null
cmake --build "$build" --target bus_instructions -j "${JOBS:-2}" >/dev/null

n=${N:-100000}
count() {  # instructions of one run: callgrind's "Collected" total
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$build/bench/bus_instructions" "$1" "$2" \
    2>&1 | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
per_message() {
  local a b
  a=$(count "$1" "$n")
  b=$(count "$1" $((2 * n)))
  echo "scale=1; ($b - $a) / $n" | bc
}

mkdir -p bench/results
# Named by date and commit (OUT overrides), as run_queues.sh names its output.
out=${OUT:-bench/results/instructions-$(date +%F)-$(git rev-parse --short HEAD 2>/dev/null || echo unknown).txt}
{
  echo "bus_instructions under callgrind, commit $(git rev-parse --short HEAD), N=$n and $((2 * n))"
  echo "command: bash bench/run_instructions.sh"
  ring64=$(per_message ring64)
  ring1=$(per_message ring1)
  bus=$(per_message bus)
  busbatch=$(per_message busbatch)
  pub=$(per_message pub)
  pubbatch=$(per_message pubbatch)
  busbulk=$(per_message busbulk)
  busalt=$(per_message busalt)
  pubalt=$(per_message pubalt)
  rtt=$(per_message rtt)
  printf '%-52s %10s %10s\n' "case (8-byte messages, 64 per round)" "instr/msg" "x ring"
  printf '%-52s %10s %10s\n' "plain ring, tail per 64" "$ring64" "1.00"
  printf '%-52s %10s %10s\n' "plain ring, tail per item" "$ring1" "1.00"
  printf '%-52s %10s %10s\n' "bus publish per message (vs tail per item)" "$bus" \
    "$(echo "scale=2; $bus / $ring1" | bc)"
  printf '%-52s %10s %10s\n' "bus publish in a Batch (vs tail per 64)" "$busbatch" \
    "$(echo "scale=2; $busbatch / $ring64" | bc)"
  printf '%-52s %10s %10s\n' "bus Publisher per message (vs tail per item)" "$pub" \
    "$(echo "scale=2; $pub / $ring1" | bc)"
  printf '%-52s %10s %10s\n' "bus Publisher in a Batch (vs tail per 64)" "$pubbatch" \
    "$(echo "scale=2; $pubbatch / $ring64" | bc)"
  printf '%-52s %10s %10s\n' "bus publish_bulk -> subscribe_bulk (vs tail per 64)" "$busbulk" \
    "$(echo "scale=2; $busbulk / $ring64" | bc)"
  echo "target (issue 3): at most 2x the plain ring's"
  printf '%-52s %10s\n' "bus publish in a Batch, two topics in turn" "$busalt"
  printf '%-52s %10s\n' "bus Publishers in a Batch, two topics in turn" "$pubalt"
  echo "(one inbox subscribes to both: each message closes the other's run; no peer, a regression figure)"
  echo
  printf '%-52s %10s\n' "request/reply round trip, both sides on one executor" "$rtt"
  echo "(instructions per round trip: request, handler, reply and callback; no peer, a regression figure)"
} | tee "$out"
