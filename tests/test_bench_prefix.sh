#!/usr/bin/env bash
# slotd-bench's shared-prefix workload against real daemons: every prompt
# opens with the same 200 tokens (--shared-prefix), then 8 of its own.
# With the prefix cache on, --verify finds no token or logit that differs
# from the uncached reference, and the starts' `cached` shows the sharing
# really happened: at least half of all prompt entries were reused (only
# the first starts, in flight together, can miss).  The same workload
# against a daemon with --prefix-cache off is the pair: 0 mismatches and
# 0 cached, so a cache that shares nothing fails the first half.
#
#   tests/test_bench_prefix.sh [BUILD_DIR]   (or SLOTD_BUILD_DIR; default build/)
#
# SLOTD_TEST_PREFIX_CACHE (on) sets the first daemon's --prefix-cache: off
# shows the test failing.  python3 must be installed.  Each check prints
# PASS or FAIL; the exit status is 1 if any failed.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-${SLOTD_BUILD_DIR:-$root/build}}
slotd=${SLOTD_BIN:-$build/server/slotd}
bench=${SLOTD_BENCH:-$build/bench/slotd-bench}
. "$root/tests/lib.sh"

passed=0
failed=0
pids=()
work=$(mktemp -d "${TMPDIR:-/tmp}/slotd-bench-prefix.XXXXXX") || exit 1
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  wait 2>/dev/null
  if [ $failed -gt 0 ]; then
    for f in "$work"/*.log; do [ -s "$f" ] && { echo "--- $(basename "$f")"; tail -n 20 "$f"; }; done
  fi
  rm -rf "$work"
}
trap cleanup EXIT
command -v python3 >/dev/null || { fail "python3 not installed (scripts/deps.sh --test)"; exit 1; }

# run NAME PREFIX_CACHE: a daemon, the workload against it, its JSON in NAME.json.
run() {
  local name=$1 port
  port=$(free_port) || { fail "$name: no free port"; return 1; }
  "$slotd" --port "$port" --admin-port 0 --prefix-cache "$2" >"$work/$name-daemon.log" 2>&1 &
  pids+=($!)
  wait_for 10 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port" 2>/dev/null ||
    { fail "$name: the daemon did not listen"; return 1; }
  "$bench" -p "$port" -m small --shared-prefix 200 --prompt-len 8 -n 2 -c 2 -P 2 -r 60 \
    --verify -q -j >"$work/$name.json" 2>"$work/$name-bench.log"
  echo $? >"$work/$name.rc"
}

# field NAME KEY: a member of the run's JSON.
field() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' \
  "$work/$1.json" "$2" 2>/dev/null; }

run on "${SLOTD_TEST_PREFIX_CACHE:-on}"
check "cache on: slotd-bench --verify exits 0" test "$(cat "$work/on.rc" 2>/dev/null)" = 0
check "cache on: 0 mismatches" test "$(field on mismatches)" = 0
check "cache on: tokens were checked" test "$(field on checked_tokens)" -gt 0
cached=$(field on cached_entries)
prompt=$(field on prompt_entries)
echo "cache on: ${cached:-?} of ${prompt:-?} prompt entries cached"
check "cache on: the shared prefix was reused (cached > 0)" test "${cached:-0}" -gt 0
check "cache on: at least half the prompt entries cached" \
  test $((2 * ${cached:-0})) -ge "${prompt:-1}"

run off off
check "cache off: slotd-bench --verify exits 0" test "$(cat "$work/off.rc" 2>/dev/null)" = 0
check "cache off: 0 mismatches" test "$(field off mismatches)" = 0
check "cache off: nothing cached" test "$(field off cached_entries)" = 0

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
