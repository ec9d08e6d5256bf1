#!/bin/sh
# Install what a fresh Debian 12 machine lacks for loom, then configure and
# build it into build/. Safe to run again: installs only missing packages
# and rebuilds incrementally. Run as root (or with sudo available).
set -eu
cd "$(dirname "$0")/.."

# libdnnl-dev: oneDNN, the model's matrix products (model.gemm; without it
# they run on OpenBLAS). For the test suite: python3 (an SVG check, checkpoint editing), procps
# (pgrep: finding a rank's process), iproute2 (two network namespaces as
# two nodes), clang and its libFuzzer runtime (the fuzzers), slurm-wlm and
# munge (tests/slurm starts a private one-node Slurm cluster under its
# scratch folder; neither /etc/slurm nor the system's daemons are used).
PACKAGES="build-essential cmake pkg-config libconfig-dev libopenmpi-dev openmpi-bin
libucx-dev ucx-utils libopenblas-dev libdnnl-dev liburing-dev python3 procps iproute2 clang
libclang-rt-14-dev slurm-wlm munge"

missing=""
for p in $PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "setup: installing$missing"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends $missing
fi

cmake -S . -B build -DLOOM_WERROR=ON ${LOOM_CMAKE_ARGS:-}
cmake --build build -j "$(nproc)"
