#!/usr/bin/env bash
# Runs one integration test target (or one test of it) N times and counts the failures:
# the tool that tells a flaky test from a sound one.
#
#   scripts/repeat.sh [-n RUNS] [--busy] [--progress engine|hybrid] [--release] \
#       PACKAGE TARGET [FILTER...]
#
#   PACKAGE   the cargo package (netns-tests, bench, libsoftiwarp, softiwarp, ...)
#   TARGET    the integration test target (the file name under tests/ without .rs)
#   FILTER    passed to the test binary as is (a test name, `--exact`, `--nocapture`...)
#   -n RUNS   how many runs (default 10)
#   --busy    one busy loop per core (`nproc`) for the whole repeat, so the tests run on
#             a machine with no idle core, as CI's can be
#   --progress MODE
#             SOFTIWARP_PROGRESS for every run: `engine` (the engine thread alone drives
#             each device) or `hybrid` (application threads drive inside verbs calls,
#             the default)
#   --release build and run the release profile
#
# The target is built once (`cargo test --no-run`); each run then executes the test
# binary directly, its output kept in a temporary folder. At the end one line gives the
# count, `repeat: <target> [filter]: F of N failed (<mode>, busy|idle)`, followed by
# the first failure's output (its last 200 lines; the whole file's path is printed).
# Exit status: 0 if no run failed, 1 otherwise, 2 on a usage or build error.
#
# Examples (the runs behind the counts in docs/ARCHITECTURE.md, "Tests"):
#   scripts/repeat.sh -n 20 --busy --progress hybrid netns-tests removal_adversarial
#   scripts/repeat.sh -n 20 --busy --progress engine bench iwperf_device_removal
#   scripts/repeat.sh -n 5 --busy netns-tests removal_random
set -uo pipefail
cd "$(dirname "$0")/.."

runs=10
busy=0
progress=""
profile=()
while [ $# -gt 0 ]; do
    case "$1" in
        -n) runs="${2:?-n needs a count}"; shift 2 ;;
        --busy) busy=1; shift ;;
        --progress)
            progress="${2:?--progress needs engine or hybrid}"
            case "$progress" in engine|hybrid) ;; *) echo "repeat: --progress engine|hybrid, not '$progress'" >&2; exit 2 ;; esac
            shift 2 ;;
        --release) profile=(--release); shift ;;
        -h|--help) sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        --) shift; break ;;
        -*) echo "repeat: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) break ;;
    esac
done
if [ $# -lt 2 ]; then
    echo "usage: scripts/repeat.sh [-n RUNS] [--busy] [--progress engine|hybrid] [--release] PACKAGE TARGET [FILTER...]" >&2
    exit 2
fi
case "$runs" in ''|*[!0-9]*) echo "repeat: -n takes a number, not '$runs'" >&2; exit 2 ;; esac
package="$1"
target="$2"
shift 2
filter=("$@")

# Build once; the test binary's path from cargo's JSON messages.
bin=$(cargo test "${profile[@]}" --locked -p "$package" --test "$target" --no-run \
        --message-format=json 2>/tmp/repeat-build.$$ |
    python3 -c '
import json, sys
target = sys.argv[1]
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") \
            and m["target"]["name"] == target and m["profile"]["test"]:
        print(m["executable"])
' "$target")
if [ -z "$bin" ]; then
    echo "repeat: could not build test target '$target' of package '$package':" >&2
    tail -n 30 /tmp/repeat-build.$$ >&2
    rm -f /tmp/repeat-build.$$
    exit 2
fi
rm -f /tmp/repeat-build.$$
package_dir=$(cargo metadata --locked --format-version 1 --no-deps |
    python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    if p["name"] == sys.argv[1]:
        print(p["manifest_path"].rsplit("/", 1)[0])
' "$package")

out=$(mktemp -d /tmp/repeat.XXXXXX)
busy_pids=()
stop_busy() {
    for pid in "${busy_pids[@]}"; do
        kill "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    busy_pids=()
}
trap 'stop_busy; exit 130' INT TERM
trap stop_busy EXIT
if [ "$busy" = 1 ]; then
    for _ in $(seq "$(nproc)"); do
        ( while :; do :; done ) &
        busy_pids+=("$!")
    done
fi

mode="${progress:-${SOFTIWARP_PROGRESS:-hybrid}}"
load=$([ "$busy" = 1 ] && echo "busy" || echo "idle")
failed=0
first=""
for i in $(seq "$runs"); do
    log="$out/run-$i.log"
    start=$(date +%s.%N)
    # In the package's folder, as cargo test runs a test binary.
    if (cd "$package_dir" && SOFTIWARP_PROGRESS="$mode" RUST_BACKTRACE=1 "$bin" "${filter[@]}") \
            >"$log" 2>&1; then
        status=ok
    else
        status=FAILED
        failed=$((failed + 1))
        [ -z "$first" ] && first="$log"
    fi
    printf 'run %d/%d: %s (%.1f s)\n' "$i" "$runs" "$status" "$(echo "$(date +%s.%N) - $start" | bc)"
done
stop_busy

echo "repeat: $target${filter[*]:+ ${filter[*]}}: $failed of $runs failed ($mode, $load)"
if [ -n "$first" ]; then
    echo "first failure ($first), last 200 lines:"
    tail -n 200 "$first"
    exit 1
fi
rm -rf "$out"
exit 0
