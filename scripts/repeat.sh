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
# binary directly, its output kept in a temporary folder. A run fails if the binary
# fails or runs no test at all (a filter that matches nothing). At the end one line gives
# the count, `repeat: <package> <target> [filter]: F of N failed (<mode>, busy|idle)`,
# followed by the first failure's output (its last 200 lines; the whole file's path is
# printed). Ctrl-C (SIGINT), SIGTERM or SIGHUP end the run in progress and the busy
# loops, and print the count so far.
# Exit status: 0 if no run failed, 1 otherwise, 2 on a usage or build error, 130 when
# interrupted.
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
        -n) [ $# -ge 2 ] || { echo "repeat: -n needs a count" >&2; exit 2; }
            runs="$2"; shift 2 ;;
        --busy) busy=1; shift ;;
        --progress)
            [ $# -ge 2 ] || { echo "repeat: --progress needs engine or hybrid" >&2; exit 2; }
            progress="$2"
            case "$progress" in engine|hybrid) ;; *) echo "repeat: --progress engine|hybrid, not '$progress'" >&2; exit 2 ;; esac
            shift 2 ;;
        --release) profile=(--release); shift ;;
        -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
        --) shift; break ;;
        -*) echo "repeat: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) break ;;
    esac
done
if [ $# -lt 2 ]; then
    echo "usage: scripts/repeat.sh [-n RUNS] [--busy] [--progress engine|hybrid] [--release] PACKAGE TARGET [FILTER...] (--help)" >&2
    exit 2
fi
case "$runs" in ''|*[!0-9]*|0) echo "repeat: -n takes a count of 1 or more, not '$runs'" >&2; exit 2 ;; esac
package="$1"
target="$2"
shift 2
filter=("$@")

trap 'rm -f /tmp/repeat-build.$$; echo "repeat: interrupted while building" >&2; exit 130' INT TERM HUP
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
mode="${progress:-${SOFTIWARP_PROGRESS:-hybrid}}"
case "$mode" in engine|hybrid) ;; *) echo "repeat: SOFTIWARP_PROGRESS is '$mode', not engine or hybrid" >&2; exit 2 ;; esac
load=$([ "$busy" = 1 ] && echo "busy" || echo "idle")
failed=0
done_runs=0
first=""
busy_pids=()
test_pid=""
summary() {
    echo "repeat: $package $target${filter[*]:+ ${filter[*]}}: $failed of $done_runs failed ($mode, $load)"
    if [ -n "$first" ]; then
        echo "first failure ($first), last 200 lines:"
        tail -n 200 "$first"
    fi
}
stop_all() {
    [ -n "$test_pid" ] && kill "$test_pid" 2>/dev/null && wait "$test_pid" 2>/dev/null
    test_pid=""
    for pid in "${busy_pids[@]}"; do
        kill "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    busy_pids=()
}
interrupted() {
    stop_all
    echo "repeat: interrupted during run $((done_runs + 1)) of $runs (logs in $out)"
    summary
    exit 130
}
trap interrupted INT TERM HUP
trap stop_all EXIT
if [ "$busy" = 1 ]; then
    for _ in $(seq "$(nproc)"); do
        ( while :; do :; done ) &
        busy_pids+=("$!")
    done
fi

for i in $(seq "$runs"); do
    log="$out/run-$i.log"
    start=$EPOCHREALTIME
    # In the package's folder, as cargo test runs a test binary; in the background, so
    # that a signal to this script is handled at once.
    (cd "$package_dir" && exec env SOFTIWARP_PROGRESS="$mode" RUST_BACKTRACE=1 "$bin" "${filter[@]}") \
        >"$log" 2>&1 &
    test_pid=$!
    wait "$test_pid"
    rc=$?
    test_pid=""
    if [ "$rc" = 0 ] && grep -q '^running 0 tests' "$log"; then
        status="FAILED (no test ran: does the filter match a test?)"
        rc=1
    elif [ "$rc" = 0 ]; then
        status=ok
    else
        status=FAILED
    fi
    if [ "$rc" != 0 ]; then
        failed=$((failed + 1))
        [ -z "$first" ] && first="$log"
    fi
    done_runs=$i
    elapsed=$(( (${EPOCHREALTIME/./} - ${start/./}) / 100000 ))
    printf 'run %d/%d: %s (%d.%d s)\n' "$i" "$runs" "$status" $((elapsed / 10)) $((elapsed % 10))
done
stop_all
summary
if [ -n "$first" ]; then
    exit 1
fi
rm -rf "$out"
exit 0
