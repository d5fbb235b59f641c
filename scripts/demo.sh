#!/usr/bin/env bash
# The main job: builds the multi-process demo and runs it (three programs on one bus: a producer,
# a stateful aggregator service, a monitor that calls it; shared memory between them, ZeroMQ to
# find each other; DEMO_TRANSPORT=zmq for ZeroMQ only).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build-demo -DBUS_BUILD_TESTS=OFF -DBUS_BUILD_BENCH=OFF -DBUS_BUILD_EXAMPLES=ON >/dev/null
cmake --build build-demo -j2 --target demo_producer demo_aggregator demo_monitor
bash examples/demo/run.sh build-demo/examples "$@"
