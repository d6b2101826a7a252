#!/usr/bin/env bash
# Runs every fuzz target for N seconds each (default 600), one after another, and prints
# each target's final status line. Needs cargo-fuzz (`cargo install cargo-fuzz`) and a
# C++ compiler; the stable toolchain is enough with RUSTC_BOOTSTRAP=1 (set here).
# Corpora are seeded from ../shared/pcaps (fuzz/seeds.py) when empty. Crashes land in
# fuzz/artifacts/<target>/, full logs in /tmp/fuzz-<target>.log.
#   fuzz/run.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")"
known=(mpa_frame mpa_deframer ddp_rdmap_ulpdu rx_path)
secs=${1:-600}; shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${known[@]}")
for t in "${targets[@]}"; do
    case " ${known[*]} " in *" $t "*) ;; *) echo "unknown target '$t' (known: ${known[*]})" >&2; exit 2;; esac
done
[ -n "$(ls -A corpus/mpa_frame 2>/dev/null)" ] && [ -n "$(ls -A corpus/rx_path 2>/dev/null)" ] || python3 seeds.py
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    echo "== $t for ${secs}s"
    if ! RUSTC_BOOTSTRAP=1 cargo fuzz run "$t" "corpus/$t" -- -max_total_time="$secs" \
        -max_len=4096 -rss_limit_mb=8192 > "/tmp/fuzz-$t.log" 2>&1; then
        echo "$t failed; see /tmp/fuzz-$t.log and fuzz/artifacts/$t/" >&2
        tail -5 "/tmp/fuzz-$t.log" >&2
        exit 1
    fi
    grep -E '^#[0-9]+.*DONE' "/tmp/fuzz-$t.log" | tail -1
done
