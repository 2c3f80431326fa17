#!/usr/bin/env bash
# Installs the Debian packages dlock needs to build, test, package and
# benchmark (dpkg-dev and file: cpack -G DEB; man-db: the man page test;
# clang-format and clang-tidy: scripts/lint.sh).
#
# The etcd store (docs/etcd.md): etcd-server and etcd-client (etcd, etcdctl)
# for the tests; gRPC++ and protoc with its gRPC plugin to generate the v3
# API stubs at build time; golang-etcd-server-dev for etcd's own .proto files
# (rpc.proto, kv.proto, auth.proto under /usr/share/gocode), with
# golang-github-gogo-protobuf-dev (gogoproto/gogo.proto) and
# golang-github-grpc-ecosystem-grpc-gateway-dev (google/api/annotations.proto)
# for what they import; golang-go builds Go's own concurrency.Mutex from
# those sources, offline: the interop tests' driver
# (tests/etcd/go_mutex_driver.go) and the benchmark's peer
# (bench/peers/go_mutex.go). Nothing is downloaded at build time.
# Does nothing when they are all present (so it also works offline then).
set -euo pipefail

packages=(
  build-essential cmake g++ clang libclang-rt-14-dev pkg-config clang-format clang-tidy
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev
  libzookeeper-mt-dev zookeeper default-jre-headless python3-kazoo
  libcurator-recipes-java default-jdk-headless
  libhiredis-dev redis-server python3-redis
  etcd-server etcd-client golang-go libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  golang-etcd-server-dev golang-github-gogo-protobuf-dev golang-github-grpc-ecosystem-grpc-gateway-dev
  libasio-dev
  procps iproute2 gdb openssl
  dpkg-dev file man-db
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "install-deps: installing ${missing[*]} and what they need (a few minutes on a fresh machine)" >&2
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
echo "install-deps: apt-get update" >&2
$sudo apt-get update -qq
# One line per package as it is set up, so that a long install shows progress.
if ! $sudo apt-get install -y -q --no-install-recommends "${missing[@]}" 2>&1 |
  { grep --line-buffered -E '^(Setting up|E:|W:)' || true; } | sed -u 's/^/install-deps: /' >&2; then
  echo "install-deps: apt-get install failed" >&2
  exit 1
fi
echo "install-deps: done" >&2
