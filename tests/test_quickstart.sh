#!/usr/bin/env bash
# The README's quick start, as a fresh machine runs it: what it runs
# besides the built binaries (nc, curl) is installed by scripts/deps.sh
# without --test (the path of scripts/run.sh), and its `nc` session, run
# word for word against a daemon (on a free port instead of 7070),
# prints exactly the lines the README shows.
#
#   tests/test_quickstart.sh [BUILD_DIR]   (or SLOTD_BUILD_DIR; default build/)
#
# SLOTD_BIN names the daemon if it is not BUILD_DIR/server/slotd.  Each check
# prints PASS or FAIL; the exit status is 1 if any failed.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-${SLOTD_BUILD_DIR:-$root/build}}
slotd=${SLOTD_BIN:-$build/server/slotd}
readme=$root/README.md
. "$root/tests/lib.sh"

passed=0
failed=0
daemon=""
work=$(mktemp -d "${TMPDIR:-/tmp}/slotd-quickstart.XXXXXX") || exit 1
cleanup() {
  if [ -n "$daemon" ]; then
    kill -TERM "$daemon" 2>/dev/null
    wait "$daemon" 2>/dev/null
  fi
  rm -rf "$work"
  echo "quickstart: $passed passed, $failed failed"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

[ -x "$slotd" ] || { fail "no daemon at $slotd (build first: scripts/build.sh)"; exit 1; }

# The packages of the run path: the first pkgs=(...) of scripts/deps.sh,
# over one line or several.
run_pkgs=" $(awk '/^pkgs=\(/ { on = 1 } on { print } on && /\)/ { exit }' "$root/scripts/deps.sh" |
  tr '\n' ' ' | sed 's/^pkgs=(//; s/).*$//') "
for need in "nc:netcat-openbsd" "curl:curl"; do
  tool=${need%%:*} pkg=${need#*:}
  if grep -Eq "(^    |\| )$tool " "$readme"; then
    check "the quick start's $tool comes with scripts/deps.sh (package $pkg)" \
      bash -c '[[ $1 == *" $2 "* ]]' _ "$run_pkgs" "$pkg"
  fi
done

# The `nc` block: the indented lines after "With plain `nc`:", a command
# ("$ " and its continuation lines) and then its output.
awk '/With plain `nc`/ { on = 1; next }
     on && /^    / { print; seen = 1; next }
     on && seen && !/^    / { exit }' "$readme" >"$work/block"
cmd=$(awk '/^    \$ / { c = 1; sub(/^    \$ /, "") } c { sub(/^    /, ""); print; if (!/\\$/) exit }' "$work/block")
awk 'BEGIN { c = 0 } /^    \$ / { c = 1 } c == 2 { sub(/^    /, ""); print } c == 1 && !/\\$/ { c = 2 }' \
  "$work/block" >"$work/want"
if [ -z "$cmd" ] || [ ! -s "$work/want" ]; then
  fail "README.md has no nc session after \"With plain \`nc\`:\""
  exit 1
fi
case $cmd in *"127.0.0.1 7070"*) ;; *) fail "the nc session does not connect to 127.0.0.1 7070: $cmd"; exit 1 ;; esac

port=$(free_port) && admin=$(free_port "$port") || { fail "no free port"; exit 1; }
"$slotd" --port "$port" --admin-port "$admin" >"$work/daemon.log" 2>&1 &
daemon=$!
up() { (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; }
wait_for 10 up || { fail "the daemon did not come up"; cat "$work/daemon.log"; exit 1; }

timeout 10 bash -c "${cmd//127.0.0.1 7070/127.0.0.1 $port}" >"$work/got" 2>"$work/err"
rc=$?
check "the README's nc session runs (exit $rc$( [ -s "$work/err" ] && echo ": $(head -c 200 "$work/err")"))" \
  test $rc -eq 0
check "it prints what the README shows: $(tr '\n' ' ' <"$work/got")" cmp -s "$work/want" "$work/got"

[ $failed -eq 0 ]
