#!/usr/bin/env bash
# Runs every fuzz target for N seconds each (default 600), one after another, and prints
# each target's last status line. Needs cargo-fuzz (`cargo install cargo-fuzz`); the
# stable toolchain is enough with RUSTC_BOOTSTRAP=1.
#   fuzz/run.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-600}; shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(mpa_frame mpa_deframer ddp_rdmap_ulpdu)
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    echo "== $t for ${secs}s"
    RUSTC_BOOTSTRAP=1 cargo fuzz run "$t" "corpus/$t" -- -max_total_time="$secs" \
        -max_len=4096 -rss_limit_mb=8192 2>&1 | tee "/tmp/fuzz-$t.log" | grep -E '^#[0-9]+.*(DONE|pulse)|SUMMARY|panicked|Done' | tail -3
done
