#!/usr/bin/env bash
# The JavaScript tools, pinned by tools/npm/package-lock.json: @redocly/cli lints the OpenAPI
# document and ajv checks JSON against its schemas (tests/endpoint/openapi_test.cpp), and
# swagger-ui-dist holds the Swagger UI files greeting_server serves at /docs. Installs Node.js
# and npm from Debian when there is no npm, then the tools into tools/npm/node_modules when they
# are missing or older than the lock file.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v npm >/dev/null || bash scripts/deps.sh nodejs npm
cd tools/npm
if [[ ! -f node_modules/.package-lock.json || package-lock.json -nt node_modules/.package-lock.json ]]; then
  echo "npm_tools: installing $(tr -d '\n ' <package.json | grep -o '"dependencies":{[^}]*}')"
  # No install scripts: none of these needs one, and swagger-ui-dist's analytics dependency
  # (@scarf/scarf) would report the install.
  npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
fi
