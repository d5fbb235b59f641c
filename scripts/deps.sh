#!/usr/bin/env bash
# Installs the Debian 12 packages the build needs, only those that are missing. Run as root.
set -euo pipefail
packages=(g++ make cmake ccache pkg-config
  libabsl-dev libzmq3-dev cppzmq-dev capnproto libcapnp-dev libboost-dev
  googletest libgtest-dev libgmock-dev libbenchmark-dev)
packages+=("$@")
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "deps: installing ${missing[*]}"
  if [[ $(id -u) -ne 0 ]]; then
    echo "deps: missing packages and not root; run: apt-get install ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
