#!/usr/bin/env bash
# The systemd units of deploy/ (slotd.service, slotd@.service), without a
# running systemd: systemd-analyze verifies each in a scratch root holding
# the built daemon at the unit's ExecStart path; docs/operations.md prints
# deploy/slotd.service as it is; and each unit's ExecStart is run as
# systemd would run it (its Environment= lines, then an EnvironmentFile
# moving the ports and the token to this test's, User= or nobody,
# LimitNOFILE=), refused without a usable token with a status that
# RestartPreventExitStatus= keeps from a restart loop, and, with the token,
# serving /health and a session and draining to status 0 on KillSignal=.
#
#   tests/test_units.sh [BUILD_DIR]   (or SLOTD_BUILD_DIR; default build/)
#
# SLOTD_BIN names the daemon if it is not BUILD_DIR/server/slotd.  Each check
# prints PASS or FAIL; the exit status is 1 if any failed.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-${SLOTD_BUILD_DIR:-$root/build}}
slotd=${SLOTD_BIN:-$build/server/slotd}
cli=$(dirname "$slotd")/slotd-cli
. "$root/tests/lib.sh"

passed=0
failed=0
daemon=""
work=$(mktemp -d "${TMPDIR:-/tmp}/slotd-units.XXXXXX") || exit 1
cleanup() {
  if [ -n "$daemon" ] && kill -0 "$daemon" 2>/dev/null; then
    kill -KILL "$daemon" 2>/dev/null
    wait "$daemon" 2>/dev/null
  fi
  if [ $failed -gt 0 ] && [ -s "$work/daemon.log" ]; then
    echo "--- daemon log"; tail -n 20 "$work/daemon.log"
  fi
  rm -rf "$work"
  echo "units: $passed passed, $failed failed"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

[ -x "$slotd" ] || { fail "no daemon at $slotd (build first: scripts/build.sh)"; exit 1; }
command -v systemd-analyze >/dev/null || { fail "systemd-analyze not installed (scripts/deps.sh --test)"; exit 1; }
units=("$root/deploy/slotd.service" "$root/deploy/slotd@.service")
for u in "${units[@]}"; do
  [ -f "$u" ] || { fail "no $u"; exit 1; }
done

# key UNIT NAME: the values of NAME= in UNIT, one a line.
key() { sed -n "s/^$2=//p" "$1"; }

# ---- systemd-analyze verify ----
# A root with systemd's own units (verify loads the targets a unit names)
# and the daemon where ExecStart looks for it.  verify exits 0 after a
# warning about an unknown key or a bad value, so any output fails.
sysroot=$work/root
mkdir -p "$sysroot/usr/lib/systemd" "$sysroot/etc/systemd/system" || exit 1
for d in /usr/lib/systemd/system /lib/systemd/system; do
  [ -d "$d" ] && { cp -a "$d" "$sysroot/usr/lib/systemd/" && break; }
done
verify() { # UNIT_FILE: prints what verify says; fails on any output
  local exe out
  exe=$(key "$1" ExecStart | head -n 1)
  exe=${exe%% *}
  mkdir -p "$sysroot$(dirname "$exe")" && cp "$slotd" "$sysroot$exe" || return 1
  cp "$1" "$sysroot/etc/systemd/system/" || return 1
  out=$(systemd-analyze --root="$sysroot" verify "$sysroot/etc/systemd/system/$(basename "$1")" 2>&1)
  local rc=$?
  [ -n "$out" ] && echo "$out"
  [ $rc -eq 0 ] && [ -z "$out" ]
}
for u in "${units[@]}"; do
  check "systemd-analyze verify $(basename "$u")" verify "$u"
done
# The check can fail: a value systemd cannot parse is caught.
sed 's/^Restart=.*/Restart=sometimes/' "${units[0]}" >"$work/broken.service"
verify_fails() { ! verify "$1" >/dev/null; }
check "systemd-analyze verify catches a bad value (Restart=sometimes)" verify_fails "$work/broken.service"

# ---- The guide prints the unit as it is ----
body=$(sed -n '/^\[Unit\]/,$p' "${units[0]}" | sed 's/^\(.\)/    \1/')
check "docs/operations.md prints deploy/slotd.service from [Unit] on" \
  python3 -c 'import sys; sys.exit(0 if sys.argv[1] + "\n" in open(sys.argv[2]).read() else 1)' \
  "$body" "$root/docs/operations.md"

# ---- ExecStart as systemd runs it ----
# A token file as the guide makes it: mode 600, owned by the unit's user.
user_uid() { # USER: its uid, or nobody's if it does not exist here
  id -u "$1" 2>/dev/null || echo 65534
}
token=units-test-token-0123456789abcdef
chmod 711 "$work"

run_unit() { # UNIT ENVFILE_CONTENT...: runs ExecStart in the background, pid in $daemon
  local u=$1; shift
  local envs=() line uid
  while IFS= read -r line; do
    [[ $line == *[\"\']* ]] && { fail "Environment= with quotes, not parsed here: $line"; return 1; }
    read -r -a kv <<<"$line"; envs+=("${kv[@]}")
  done < <(key "$u" Environment)
  # EnvironmentFile= comes after Environment= and overrides it.
  envs+=("$@")
  read -r -a argv <<<"$(key "$u" ExecStart | head -n 1)"
  argv[0]=$slotd
  local runas=() nofile
  uid=$(user_uid "$(key "$u" User)")
  [ "$(id -u)" = 0 ] && runas=(setpriv --reuid="$uid" --regid="$uid" --clear-groups)
  nofile=$(key "$u" LimitNOFILE)
  env -i PATH=/usr/bin:/bin "${envs[@]}" prlimit --nofile="$nofile:$nofile" -- "${runas[@]}" "${argv[@]}" \
    >"$work/daemon.log" 2>&1 &
  daemon=$!
}

for u in "${units[@]}"; do
  name=$(basename "$u")
  ef=$(key "$u" EnvironmentFile)
  if [[ $name == *@* ]]; then
    check "$name: EnvironmentFile=$ef names the instance and is not optional" \
      bash -c '[[ $1 == /* && $1 == *%i* ]]' _ "$ef"
  fi
  uid=$(user_uid "$(key "$u" User)")
  printf '%s\n' "$token" >"$work/token"
  chmod 600 "$work/token"
  [ "$(id -u)" = 0 ] && chown "$uid:$uid" "$work/token"
  port=$(free_port) && admin=$(free_port "$port") || { fail "no free port"; exit 1; }
  # The instance's own file: this test's ports and token, sessions on
  # every interface (not loopback, so protected mode applies), a small pool.
  own=(SLOTD_LISTEN=0.0.0.0 SLOTD_PORT="$port" SLOTD_ADMIN_PORT="$admin" SLOTD_CACHE_MB=64)

  # With the unit's own settings on a non-loopback address, the daemon
  # looks for the token the unit names (missing on this machine), rather
  # than refusing for protected mode as a unit without one would.
  run_unit "$u" SLOTD_LISTEN=0.0.0.0 SLOTD_PORT="$port" SLOTD_ADMIN_PORT="$admin" SLOTD_CACHE_MB=64 &&
    wait_for 10 bash -c "! kill -0 $daemon 2>/dev/null"
  [ -n "$daemon" ] && { kill -KILL "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null; daemon=""; }
  named=$(key "$u" Environment | grep -o 'SLOTD_AUTH_TOKEN_FILE=[^ ]*' | cut -d= -f2)
  check "$name: names a token file (${named:-none}), which the daemon reads: $(head -c 160 "$work/daemon.log")" \
    bash -c '[ -n "$1" ] && grep -qF "$1" "$2" && ! grep -q "protected mode" "$2"' _ "$named" "$work/daemon.log"

  # Without a usable token: refused, with a status that is not restarted.
  prevent=" $(key "$u" RestartPreventExitStatus | tr '\n' ' ') "
  for bad in missing open; do
    if [ $bad = missing ]; then tf=$work/no-such-token; else tf=$work/open-token; fi
    printf '%s\n' "$token" >"$work/open-token"
    chmod 644 "$work/open-token"
    run_unit "$u" "${own[@]}" SLOTD_AUTH_TOKEN_FILE="$tf" || continue
    rc=timeout
    wait_for 10 bash -c "! kill -0 $daemon 2>/dev/null" && { wait "$daemon"; rc=$?; }
    [ "$rc" = timeout ] && kill -KILL "$daemon"
    daemon=""
    check "$name: token file $bad: refused with status $rc, which RestartPreventExitStatus=$(trim "$prevent") keeps from restarting: $(head -c 160 "$work/daemon.log")" \
      bash -c '[[ $1 =~ ^[1-9][0-9]*$ ]] && [[ $2 == *" $1 "* ]]' _ "$rc" "$prevent"
  done

  run_unit "$u" "${own[@]}" SLOTD_AUTH_TOKEN_FILE="$work/token" || continue
  health() { curl -s -m 1 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$admin/health" | grep -qx 200; }
  check "$name: ExecStart with the token answers /health 200" wait_for 10 health
  cli_token() { SLOTD_AUTH_TOKEN_FILE="$work/token" "$cli" -p "$port" -a "$admin" -t 5 "$@" >/dev/null; }
  check "$name: slotd-cli with the token: stats on the session port" cli_token stats
  check "$name: slotd-cli with the token: metrics on the admin port" cli_token metrics slotd_sessions
  replies=()
  if exec 3<>"/dev/tcp/127.0.0.1/$port"; then
    printf '%s\n' "{\"op\":\"auth\",\"token\":\"$token\"}" '{"op":"start","id":"u","prompt":[0,1,2]}' \
      '{"op":"finish","id":"u"}' >&3
    for _ in 1 2 3; do
      IFS= read -r -t 5 line <&3 || break
      replies+=("$line")
    done
    exec 3>&-
  fi
  check "$name: a session with the token: ${replies[*]:-no reply}" \
    test "${replies[*]:-}" = '{"ok":true} {"id":"u","model":"tiny","entries":3,"cached":0} {"id":"u","released":3}'
  sig=$(key "$u" KillSignal)
  stop=$(key "$u" TimeoutStopSec)
  kill -s "${sig#SIG}" "$daemon"
  rc=timeout
  wait_for "${stop:-90}" bash -c "! kill -0 $daemon 2>/dev/null" && { wait "$daemon"; rc=$?; }
  check "$name: KillSignal=$sig drains and exits 0 within TimeoutStopSec=$stop (got $rc)" test "$rc" = 0
  daemon=""
done

[ $failed -eq 0 ]
