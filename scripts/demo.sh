#!/usr/bin/env bash
# The main job: builds and runs the in-process demo (typed pub/sub, a service, a request).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build-demo -DBUS_BUILD_TESTS=OFF -DBUS_BUILD_BENCH=OFF -DBUS_BUILD_EXAMPLES=ON >/dev/null
cmake --build build-demo -j2 --target hello_pubsub
./build-demo/examples/hello_pubsub
