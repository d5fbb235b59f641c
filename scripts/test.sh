#!/usr/bin/env bash
# The whole test suite: builds everything (tests, examples, benchmarks) and runs ctest.
# BUILD_DIR, CMAKE_ARGS and CTEST_ARGS adjust it (the sanitizer builds in .ci/run use them).
set -euo pipefail
cd "$(dirname "$0")/.."
# The interop test runs a Python peer (pyzmq); the separate-hosts test uses ip netns; the HTTP
# tests check /metrics with promtool (Debian's prometheus package) and call the example with curl;
# the web page test drives headless Chromium through chromedriver; the HTTPS tests make
# certificates with openssl, and the token tests mint JWTs with PyJWT (an implementation other
# than the server's); the membership tests start a real etcd and read it with etcdctl.
bash scripts/deps.sh python3 python3-zmq iproute2 prometheus curl chromium chromium-driver \
  openssl python3-jwt python3-cryptography etcd-server etcd-client
# The OpenAPI tests lint the document with Redocly's CLI and check its schemas with Ajv; the
# greeting example serves Swagger UI's files (npm, pinned in tools/npm/package-lock.json).
bash scripts/npm_tools.sh
build=${BUILD_DIR:-build}
# CMAKE_ARGS may hold quoted values (compiler flags with spaces): let the shell parse it.
# Explicit defaults first, so a cache left by another configuration cannot turn the tests off.
eval "cmake -S . -B \"$build\" -DBUS_BUILD_TESTS=ON -DBUS_BUILD_EXAMPLES=ON -DBUS_BUILD_BENCH=ON ${CMAKE_ARGS:-}" >/dev/null
cmake --build "$build" -j2
# shellcheck disable=SC2086
ctest --test-dir "$build" --output-on-failure --no-tests=error -j2 ${CTEST_ARGS:-}
