#!/usr/bin/env bash
# scripts/run.sh, README's first command, as a fresh checkout runs it: in a
# scratch tree (this checkout's files linked, scripts/ copied, deps.sh
# replaced by a stand-in that installs nothing) with no build/ yet, it
# says what it is doing, one line per phase (packages, configuring,
# building, starting, with the addresses), builds slotd and slotd-cli and
# nothing else (no test, no benchmark), and starts the daemon, here on free
# ports, which then stops on SIGTERM with status 0.
#
#   tests/test_run_sh.sh
#
# It builds from scratch (about a minute on two cores), so CTest labels it
# heavy.  Each check prints PASS or FAIL; the exit status is 1 if any
# failed.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/tests/lib.sh"

# The daemon must take its defaults and the flags given here, nothing else.
for v in $(compgen -e | grep '^SLOTD_'); do unset "$v"; done

passed=0
failed=0
daemon=""
work=$(mktemp -d "${TMPDIR:-/tmp}/slotd-run-sh.XXXXXX") || exit 1
cleanup() {
  if [ -n "$daemon" ]; then
    # The whole group: a run.sh still building has cmake and compilers
    # under it.
    kill -TERM -- "-$daemon" 2>/dev/null
    wait "$daemon" 2>/dev/null
  fi
  if [ $failed -gt 0 ]; then
    echo "--- run.sh's stderr (last lines)"
    tail -n 20 "$work/err"
  fi
  rm -rf "$work"
  echo "run_sh: $passed passed, $failed failed"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

tree=$work/src
mkdir -p "$tree" || exit 1
for e in "$root"/* "$root"/.clang-format; do
  name=$(basename "$e")
  case $name in scripts | build*) continue ;; esac
  [ -e "$e" ] && ln -s "$e" "$tree/$name"
done
cp -r "$root/scripts" "$tree/scripts"
printf '#!/bin/sh\necho "deps.sh $*" >>"%s"\n' "$work/deps.calls" >"$tree/scripts/deps.sh"
chmod +x "$tree/scripts/deps.sh"

port=$(free_port) && admin=$(free_port "$port") || { fail "no free port"; exit 1; }
setsid "$tree/scripts/run.sh" --port "$port" --admin-port="$admin" >"$work/out" 2>"$work/err" &
daemon=$!

# Built beyond what running needs: any test or benchmark binary.
extra() { find "$tree/build/tests" "$tree/build/bench" -type f -perm -u+x 2>/dev/null | head -n 3; }
up() { (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; }
up_or_extra() { up || [ -n "$(extra)" ] || ! kill -0 "$daemon" 2>/dev/null; }
wait_for 540 up_or_extra
got_extra=$(extra)
check "nothing but slotd and slotd-cli is built (no test or benchmark binary${got_extra:+: $(echo $got_extra)})" \
  test -z "$got_extra"
check "build/server/slotd and build/server/slotd-cli are built" \
  test -x "$tree/build/server/slotd" -a -x "$tree/build/server/slotd-cli"
check "the daemon started by run.sh answers on the session port $port" up
check "run.sh installed through scripts/deps.sh" test -s "$work/deps.calls"

# One line per phase, in order, before the daemon's own log.
phases=$(grep '^run.sh: ' "$work/err")
want=("installing packages" "configuring build/" "building slotd and slotd-cli"
  "starting build/server/slotd: sessions on 127.0.0.1:$port, admin HTTP on 127.0.0.1:$admin")
at=0 ok=0
while IFS= read -r line; do
  [ $at -lt ${#want[@]} ] && [[ $line == "run.sh: ${want[at]}"* ]] && at=$((at + 1))
done <<<"$phases"
[ $at -eq ${#want[@]} ] || ok=1
check "run.sh says each phase, in order: $(echo "$phases" | tr '\n' '|')" test $ok -eq 0
check "its first line comes before anything is built: '$(head -n 1 "$work/err")'" \
  bash -c '[[ $1 == "run.sh: installing packages"* ]]' _ "$(head -n 1 "$work/err")"

kill -TERM "$daemon" 2>/dev/null
wait "$daemon"
rc=$?
daemon=""
check "the daemon run.sh started stops on SIGTERM with status 0 (got $rc)" test $rc -eq 0

[ $failed -eq 0 ]
