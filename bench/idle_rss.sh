#!/usr/bin/env bash
# The resident size of an idle daemon with the default settings: started
# RUNS times on free loopback ports with no SLOTD_* variable but the ports
# and no flag but FLAGS, read from /proc/PID/status (VmRSS, and RssAnon, RssFile)
# SETTLE seconds after /health first answers 200 (the once-a-second trim
# of "Sizing it" has run by then), and stopped.  Prints each run and the
# median VmRSS; checks nothing.
#
#   bench/idle_rss.sh [BUILD_DIR [RUNS [SETTLE [FLAGS...]]]]   (default build/, 5, 3)
#
# Measure a Release build (scripts/build.sh): a Debug or sanitizer build
# is larger.  Worker threads default to the CPUs this process may use.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
runs=${2:-5}
settle=${3:-3}
shift $(($# > 3 ? 3 : $#))
slotd=${SLOTD_BIN:-$build/server/slotd}
. "$root/tests/lib.sh"
[ -x "$slotd" ] || { echo "idle_rss: no daemon at $slotd" >&2; exit 1; }

daemon=""
trap '[ -n "$daemon" ] && kill -KILL "$daemon" 2>/dev/null' EXIT
health() { curl -s -m 1 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$admin/health" | grep -qx 200; }
kib() { awk -v k="$1:" '$1 == k { print $2 }' "/proc/$daemon/status"; }

echo "idle_rss: $slotd ($("$slotd" --version)) $*, $(nproc) CPUs, $runs runs, read ${settle} s after /health"
all=()
for i in $(seq "$runs"); do
  port=$(free_port) && admin=$(free_port "$port") || { echo "idle_rss: no free port" >&2; exit 1; }
  env -i PATH=/usr/bin:/bin SLOTD_PORT="$port" SLOTD_ADMIN_PORT="$admin" "$slotd" "$@" >/dev/null 2>&1 &
  daemon=$!
  wait_for 10 health || { echo "idle_rss: no /health 200 within 10 s" >&2; exit 1; }
  sleep "$settle"
  rss=$(kib VmRSS)
  echo "run $i: VmRSS $rss KiB ($(awk "BEGIN { printf \"%.1f\", $rss / 1024 }") MiB), RssAnon $(kib RssAnon) KiB, RssFile $(kib RssFile) KiB"
  all+=("$rss")
  kill -TERM "$daemon"; wait "$daemon"
  daemon=""
done
printf '%s\n' "${all[@]}" | sort -n | awk '{ v[NR] = $1 } END {
  m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
  printf "median VmRSS %.0f KiB (%.1f MiB), range %.1f to %.1f MiB\n", m, m / 1024, v[1] / 1024, v[NR] / 1024 }'
