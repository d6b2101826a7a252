#!/usr/bin/env bash
# The long device-removal run (root): 500 iterations of
# netns-tests/tests/removal_random.rs (seeded removal moments under load: before
# connect, during address resolution, during the MPA exchange, under full load, during
# disconnect, during destroy; `ip link del` and `ip link set down`, either side). Every
# iteration checks: no hang (a watchdog dumps both processes' stacks and fails), no
# lost completion, no leaked object, the removed side exits within 2 s, the device
# notices within 100 ms, the other side hears Disconnected within its TCP timeout.
# Prints each iteration and the latency / exit-time distributions at the end.
#
#   scripts/removal-long.sh [ITERATIONS [SEED]]     # defaults: 500, 0x5eed0008
#
# Environment: CARGO_TARGET_DIR as usual; REMOVAL_FROM=N starts at iteration N (to
# replay one failing iteration of a seed: REMOVAL_FROM=N scripts/removal-long.sh 1 SEED).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
    echo "error: needs root (network namespaces and TAPs)" >&2
    exit 1
fi
export REMOVAL_ITERATIONS="${1:-500}"
export REMOVAL_SEED="$(( ${2:-0x5eed0008} ))"
cargo build --locked -p netns-tests --bin removal-peer --test removal_random
exec cargo test --locked -p netns-tests --test removal_random -- --nocapture --test-threads 1
