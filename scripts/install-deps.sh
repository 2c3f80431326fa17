#!/usr/bin/env bash
# Installs the Debian packages dlock needs to build, test and benchmark.
# Does nothing when they are all present (so it also works offline then).
set -euo pipefail

packages=(
  build-essential cmake g++ clang libclang-rt-14-dev pkg-config
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev
  libzookeeper-mt-dev zookeeper default-jre-headless python3-kazoo
  libcurator-recipes-java default-jdk-headless
  libhiredis-dev redis-server python3-redis
  procps iproute2
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "install-deps: installing ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
