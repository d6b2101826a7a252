#!/usr/bin/env bash
# The project's test command (README.md): build, every test, clippy with warnings as
# errors, and rustfmt. Exits non-zero as soon as any of them fails.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -d ../shared/pcaps ]; then
    echo "error: ../shared/pcaps (the kernel siw captures the wire tests read) is missing" >&2
    exit 1
fi

cargo build --workspace --all-targets --locked
cargo test --workspace --all-targets --locked
cargo test --workspace --doc --locked
# The device's engine, verbs and rdma_cm tests again with the engine thread alone driving
# the device (softiwarp::ProgressMode::Engine; Hybrid, where verbs calls drive too, is
# the default the other runs use).
SOFTIWARP_PROGRESS=engine cargo test --locked -p softiwarp --test engine --test verbs --test rdmacm
# The rdma-cm example a verbs programmer recognises (soft devices on a memory link).
cargo run --locked -p softiwarp --example rdma_write_send
# The loom models (exhaustive interleavings of the destroy / delivery / removal races);
# their own target dir, since --cfg loom rebuilds everything.
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/loom" \
    cargo test -p iw-cm -p rdma-cm -p softiwarp --release --locked --test 'loom_*'
# The crate graph keeps its layering and docs/ARCHITECTURE.md draws it as cargo metadata
# has it; no module circle in any crate of the workspace, and no upward import between
# softiwarp's layer folders (the graph is printed when a check fails).
python3 scripts/crate-graph.py --check docs/ARCHITECTURE.md >/dev/null
python3 scripts/modgraph.py --check --quiet --workspace >/dev/null ||
    python3 scripts/modgraph.py --check --workspace
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo fmt --all -- --check
