#!/usr/bin/env bash
# The main job: builds and runs the in-process demo (typed pub/sub, a service, a request).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -DBUS_BUILD_TESTS=OFF -DBUS_BUILD_BENCH=OFF >/dev/null
cmake --build build -j2 --target hello_pubsub
./build/examples/hello_pubsub
