#!/usr/bin/env bash
# Settings from flags and SLOTD_* environment variables, as server/config.c
# and docs/operations.md describe them: every variable reaches the daemon
# and changes what it does, a flag beats (and replaces) its variable, a bad
# value stops start-up with status 2, and the operator's table lists every setting.
#
#   tests/test_config_env.sh [BUILD_DIR]   (or SLOTD_BUILD_DIR; default build/)
#
# SLOTD_BIN names the daemon if it is not BUILD_DIR/server/slotd.  Each check
# prints PASS or FAIL; the exit status is 1 if any failed.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-${SLOTD_BUILD_DIR:-$root/build}}
slotd=${SLOTD_BIN:-$build/server/slotd}
doc=$root/docs/operations.md
. "$root/tests/lib.sh"

passed=0
failed=0
pids=()
work=$(mktemp -d "${TMPDIR:-/tmp}/slotd-config.XXXXXX") || exit 1
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  wait 2>/dev/null
  if [ $failed -gt 0 ]; then
    for f in "$work"/*.log; do [ -s "$f" ] && { echo "--- $(basename "$f")"; tail -n 10 "$f"; }; done
  fi
  rm -rf "$work"
  echo "config: $passed passed, $failed failed"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

[ -x "$slotd" ] || { fail "no daemon at $slotd (build first: scripts/build.sh)"; exit 1; }
help=$("$slotd" --help)

num() { grep -o "\"$1\": *[0-9]*" | head -n 1 | grep -o '[0-9]*$'; }
stat() { curl -s -m 2 "http://127.0.0.1:$1/stats" | num "$2"; }
health_code() { curl -s -m 2 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1/health"; }
healthy() { [ "$(health_code "$1")" = 200 ]; }

# talk PORT LINE...: the lines on one connection; prints one reply a line.
talk() {
  local port=$1 fd line; shift
  exec {fd}<>"/dev/tcp/127.0.0.1/$port" || return 1
  printf '%s\n' "$@" >&"$fd"
  for _ in "$@"; do
    IFS= read -r -t 5 line <&"$fd" || break
    echo "$line"
  done
  exec {fd}>&-
}

# daemon NAME ENV... -- FLAGS...: starts slotd with only these variables;
# its pid in $dpid, output in NAME.log.
daemon() {
  local name=$1; shift
  local envs=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  env -i PATH="$PATH" HOME="${HOME:-/}" "${envs[@]}" "$slotd" "$@" >"$work/$name.log" 2>&1 &
  dpid=$!
  pids+=("$dpid")
}

# ---- Every variable on its own ----

p=$(free_port) && a=$(free_port "$p") || { fail "no free port"; exit 1; }
daemon env SLOTD_LISTEN=127.0.0.1 SLOTD_PORT="$p" SLOTD_ADMIN_PORT="$a" SLOTD_THREADS=3 \
  SLOTD_CACHE_MB=64 SLOTD_MAX_SESSIONS=5 SLOTD_MAX_CONNECTION_SHARE=1 SLOTD_MAX_CONNECTIONS=4 \
  SLOTD_MAX_LINE=200 \
  SLOTD_IDLE_TIMEOUT=1 SLOTD_SHUTDOWN_TIMEOUT=1 SLOTD_WEDGE_TIMEOUT=1 \
  SLOTD_MODELS=tiny,hash,small SLOTD_DEFAULT_MODEL=hash SLOTD_LOG_LEVEL=debug SLOTD_PRELOAD=small
envd=$dpid
if ! wait_for 10 healthy "$a"; then
  fail "SLOTD_LISTEN, SLOTD_PORT, SLOTD_ADMIN_PORT: no /health on 127.0.0.1:$a"
  exit 1
fi
reply=$(talk "$p" '{"op":"stats"}')
check "SLOTD_LISTEN, SLOTD_PORT, SLOTD_ADMIN_PORT: sessions on 127.0.0.1:$p, admin on $a" \
  test -n "$reply"
check "SLOTD_THREADS=3: /stats threads is $(stat "$a" threads)" test "$(stat "$a" threads)" = 3
check "SLOTD_CACHE_MB=64: pool_bytes_total is $(stat "$a" pool_bytes_total)" \
  test "$(stat "$a" pool_bytes_total)" = $((64 << 20))

mapfile -t r < <(talk "$p" '{"op":"start","id":"d","prompt":[1,2]}' \
  '{"op":"start","id":"s","model":"small","prompt":[1,2]}')
check "SLOTD_DEFAULT_MODEL=hash: a start without a model gets ${r[0]:-nothing}" \
  test "${r[0]:-}" = '{"id":"d","model":"hash","entries":2,"cached":0}'
check "SLOTD_MODELS=tiny,hash,small: a small session starts: ${r[1]:-nothing}" \
  test "${r[1]:-}" = '{"id":"s","model":"small","entries":2,"cached":0}'

mapfile -t r < <(talk "$p" '{"op":"start","id":"a1","prompt":[1]}' '{"op":"start","id":"a2","prompt":[1]}' \
  '{"op":"start","id":"a3","prompt":[1]}' '{"op":"start","id":"a4","prompt":[1]}' \
  '{"op":"start","id":"a5","prompt":[1]}' '{"op":"start","id":"a6","prompt":[1]}')
ok=0
for k in 0 1 2 3 4; do [[ ${r[$k]:-} == *'"entries":1,"cached":0}' ]] || ok=1; done
[[ ${r[5]:-} == *'"code":"cache_full"'* ]] || ok=1
check "SLOTD_MAX_SESSIONS=5 with SLOTD_MAX_CONNECTION_SHARE=1: five starts on one connection pass, the sixth is ${r[5]:-nothing}" test $ok -eq 0

# The connections above must be gone first: a socket counts against the
# limit until the daemon has seen its end and closed it.
closed0() { [ "$(stat "$a" connections)" = 0 ]; }
wait_for 5 closed0
sleep 0.3
fds=()
for k in 1 2 3 4; do exec {fd}<>"/dev/tcp/127.0.0.1/$p" && fds+=("$fd"); done
open4() { [ "$(stat "$a" connections)" = 4 ]; }
wait_for 5 open4
line=""
if exec {fd}<>"/dev/tcp/127.0.0.1/$p"; then
  IFS= read -r -t 5 line <&"$fd"
  exec {fd}>&-
fi
for fd in "${fds[@]}"; do exec {fd}>&-; done
check "SLOTD_MAX_CONNECTIONS=4: a fifth connection gets ${line:-nothing}" \
  bash -c '[[ $1 == *"\"code\":\"too_many_connections\""* ]]' _ "$line"

pad=$(printf '%0250d' 0)
reply=$(talk "$p" "{\"op\":\"stats\",\"pad\":\"$pad\"}")
check "SLOTD_MAX_LINE=200: a 270-byte line gets ${reply:-nothing}" \
  bash -c '[[ $1 == *"\"code\":\"line_too_long\""* ]]' _ "$reply"

idle0=$(curl -s -m 2 "http://127.0.0.1:$a/stats" | grep -o '"idle":[0-9]*' | grep -o '[0-9]*$')
exec {fd}<>"/dev/tcp/127.0.0.1/$p"
printf '%s\n' '{"op":"start","id":"i","prompt":[1]}' >&"$fd"
IFS= read -r -t 5 line <&"$fd"
idled() { [ "$(curl -s -m 2 "http://127.0.0.1:$a/stats" | grep -o '"idle":[0-9]*' | grep -o '[0-9]*$')" -gt "${idle0:-0}" ]; }
t0=$(now_ms)
if wait_for 5 idled; then
  pass "SLOTD_IDLE_TIMEOUT=1: an idle session is released after $(($(now_ms) - t0)) ms"
else
  fail "SLOTD_IDLE_TIMEOUT=1: the idle session is still held after 5 s"
fi
exec {fd}>&-

check "SLOTD_LOG_LEVEL=debug: the log has debug lines" grep -q ' debug ' "$work/env.log"
check "SLOTD_PRELOAD=small: small is built at start, tiny is not" \
  eval "grep -q 'model small: built at start' '$work/env.log' && ! grep -q 'model tiny: built' '$work/env.log'"

# A worker that makes no progress for the wedge timeout turns /health to
# 503 while it is stuck.  Test builds wedge a job on purpose
# (--fault-wedge-after: the N-th job holds its worker before its first
# position, until SIGUSR1), on a daemon of its own so that the count starts
# at its first job.  Elsewhere nothing can stand in: a long job runs in
# slices and counts its progress, so an uncached generate of 500 small
# steps (2.3 s in a Release build) must leave /health at 200 while it runs
# past the timeout.
wedged() { [ "$(health_code "$1")" = 503 ]; }
if grep -q -- '--fault-wedge-after' <<<"$help"; then
  pw=$(free_port) && aw=$(free_port "$pw") || { fail "no free port"; exit 1; }
  daemon wedge SLOTD_PORT="$pw" SLOTD_ADMIN_PORT="$aw" SLOTD_WEDGE_TIMEOUT=1 SLOTD_FAULT_WEDGE_AFTER=1
  wpid=$dpid
  wait_for 10 healthy "$aw" || fail "the wedge daemon did not come up"
  check "SLOTD_WEDGE_TIMEOUT=1: /health is 200 before any job" healthy "$aw"
  exec {fd}<>"/dev/tcp/127.0.0.1/$pw"
  printf '%s\n' '{"op":"start","id":"w","prompt":[1]}' >&"$fd"
  check "SLOTD_WEDGE_TIMEOUT=1: /health turns 503 while a job is held past 1 s" \
    wait_for 8 wedged "$aw"
  kill -USR1 "$wpid"
  IFS= read -r -t 5 line <&"$fd" || line=""
  check "the released job is answered: ${line:-nothing}" test "$line" = '{"id":"w","model":"tiny","entries":1,"cached":0}'
  check "SLOTD_WEDGE_TIMEOUT=1: /health is 200 again once the job ends" wait_for 5 healthy "$aw"
  exec {fd}>&-
  kill -TERM "$wpid"; wait "$wpid"
else
  exec {fd}<>"/dev/tcp/127.0.0.1/$p"
  printf '%s\n' '{"op":"generate","model":"small","tokens":[1],"steps":500}' >&"$fd"
  t0=$(now_ms)
  # The reply's arrival, in ms since the request, from a reader of its own.
  ( IFS= read -r -t 120 _ <&"$fd" && echo $(($(now_ms) - t0)) >"$work/long.ms" ) &
  pids+=("$!")
  not200=""
  while [ $(($(now_ms) - t0)) -lt 1500 ] && [ ! -s "$work/long.ms" ]; do
    code=$(health_code "$a")
    [ "$code" = 200 ] || not200+=" $code"
    sleep 0.1
  done
  took=$(cat "$work/long.ms" 2>/dev/null)
  if [ -n "$not200" ]; then
    fail "SLOTD_WEDGE_TIMEOUT=1: /health answered$not200 while a long job progressed"
  elif [ -n "$took" ] && [ "$took" -lt 1000 ]; then
    echo "SKIP: the long generate took $took ms, under SLOTD_WEDGE_TIMEOUT=1: no test of it"
  else
    pass "SLOTD_WEDGE_TIMEOUT=1: /health is 200 while a job that progresses runs past 1 s"
  fi
  exec {fd}>&-
fi

# A client that writes and never reads holds the drain open: with
# SLOTD_SHUTDOWN_TIMEOUT=1 the daemon gives up after 1 s with status 1.
# (A step on an unknown id with a tag that the error reply echoes: output
# for no work, in lines within this daemon's --max-line of 200.)
bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1; exec yes "$2" >&3' _ "$p" \
  "{\"op\":\"step\",\"id\":\"none\",\"tag\":\"$(printf '%0150d' 0)\"}" 2>/dev/null &
holder=$!
pids+=("$holder")
# The holder has filled the daemon: it stopped reading and its output is
# stuck in a full socket buffer (tx_queue of its end in /proc/net/tcp above
# 0 and steady), so nothing it answers during a drain can be written.
stalled() {
  local x y u v
  x=$(stat "$a" requests_total); u=$(unsent "$p")
  sleep 0.5
  y=$(stat "$a" requests_total); v=$(unsent "$p")
  [ -n "$x" ] && [ "$x" = "$y" ] && [ "$x" -gt 100 ] && [ "$u" -gt 0 ] && [ "$u" = "$v" ]
}
wait_for 15 stalled || fail "the holding client did not fill the daemon's buffers within 15 s"
kill -TERM "$envd"
t0=$(now_ms)
gone() { ! kill -0 "$envd" 2>/dev/null; }
if wait_for 5 gone; then
  wait "$envd"; rc=$?
  check "SLOTD_SHUTDOWN_TIMEOUT=1: a held drain ends after $(($(now_ms) - t0)) ms with status 1 (got $rc)" \
    test $rc -eq 1
else
  fail "SLOTD_SHUTDOWN_TIMEOUT=1: the daemon is still draining 5 s after SIGTERM"
fi
{ kill -KILL "$holder" && wait "$holder"; } 2>/dev/null

# --audit-rate exists in builds with the cache audit.
if grep -q -- '--audit-rate' <<<"$help"; then
  p=$(free_port) && a=$(free_port "$p")
  daemon audit SLOTD_PORT="$p" SLOTD_ADMIN_PORT="$a" SLOTD_AUDIT_RATE=1 --
  wait_for 10 healthy "$a"
  talk "$p" '{"op":"start","id":"a","prompt":[1,2]}' '{"op":"step","id":"a","n":3}' >/dev/null
  audits=$(curl -s -m 2 "http://127.0.0.1:$a/metrics" | sed -n 's/^slotd_cache_audits_total \([0-9]*\)$/\1/p')
  check "SLOTD_AUDIT_RATE=1: a step is audited (slotd_cache_audits_total ${audits:-absent})" \
    test "${audits:-0}" -ge 1
  kill -TERM "$dpid"; wait "$dpid"
fi

# ---- Flags win ----

pe=$(free_port) && ae=$(free_port "$pe") && pf=$(free_port "$pe" "$ae") && af=$(free_port "$pe" "$ae" "$pf") || { fail "no free port"; exit 1; }
daemon flags SLOTD_PORT="$pe" SLOTD_ADMIN_PORT="$ae" SLOTD_THREADS=3 SLOTD_CACHE_MB=64 \
  SLOTD_DEFAULT_MODEL=hash -- --port "$pf" --admin-port="$af" --threads 2 --cache-mb=32 --default-model tiny
if wait_for 10 healthy "$af"; then
  check "--port and --admin-port=V beat SLOTD_PORT and SLOTD_ADMIN_PORT (nothing on $ae)" \
    test "$(health_code "$ae")" = 000
  check "--threads 2 beats SLOTD_THREADS=3" test "$(stat "$af" threads)" = 2
  check "--cache-mb=32 beats SLOTD_CACHE_MB=64" test "$(stat "$af" pool_bytes_total)" = $((32 << 20))
  reply=$(talk "$pf" '{"op":"start","id":"d","prompt":[1]}')
  check "--default-model tiny beats SLOTD_DEFAULT_MODEL=hash: $reply" \
    test "$reply" = '{"id":"d","model":"tiny","entries":1,"cached":0}'
else
  fail "flags over variables: no /health on the flags' admin port $af"
fi
kill -TERM "$dpid"
wait "$dpid"
rc=$?
check "SIGTERM: exit status 0 (got $rc)" test $rc -eq 0

# ---- --models without tiny: the default model is the first listed ----

pm=$(free_port) && am=$(free_port "$pm") || { fail "no free port"; exit 1; }
daemon models -- --port "$pm" --admin-port "$am" --threads 1 --cache-mb 16 --models small
if wait_for 10 healthy "$am"; then
  reply=$(talk "$pm" '{"op":"start","id":"d","prompt":[1]}')
  check "--models small alone: a start without a model gets small: $reply" \
    test "$reply" = '{"id":"d","model":"small","entries":1,"cached":0}'
  kill -TERM "$dpid"; wait "$dpid"
else
  fail "--models small alone: no /health on $am: $(tail -n 2 "$work/models.log")"
fi

# ---- Bad values stop start-up with status 2 and name their source ----

refuses() { # WHAT ENV... -- FLAGS...: exit 2 within 5 s, stderr naming WHAT
  local what=$1; shift
  daemon bad "$@"
  local d=$dpid
  wait_for 5 eval "! kill -0 $d 2>/dev/null" || return 1
  wait "$d"
  local rc=$?
  [ $rc -eq 2 ] && grep -q -- "$what" "$work/bad.log"
}
check "SLOTD_THREADS=0 is refused" refuses SLOTD_THREADS SLOTD_THREADS=0 -- --port 0 --admin-port 0
check "an empty SLOTD_CACHE_MB is refused" refuses SLOTD_CACHE_MB SLOTD_CACHE_MB= -- --port 0 --admin-port 0
check "SLOTD_LOG_LEVEL=loud is refused" refuses SLOTD_LOG_LEVEL SLOTD_LOG_LEVEL=loud -- --port 0 --admin-port 0
check "SLOTD_DEFAULT_MODEL=small without small in --models is refused, saying how to fix it" \
  refuses "SLOTD_DEFAULT_MODEL: 'small' is not among --models; add it to --models, or name one" \
  SLOTD_DEFAULT_MODEL=small -- --models tiny,hash --port 0 --admin-port 0
check "--default-model small without small in --models is refused, saying how to fix it" \
  refuses "--default-model: 'small' is not among --models; add it to --models, or name one" \
  -- --models tiny,hash --default-model small --port 0 --admin-port 0
check "SLOTD_PRELOAD=base without base in --models is refused" \
  refuses preload SLOTD_PRELOAD=base -- --models tiny,hash --port 0 --admin-port 0
check "a malformed SLOTD_PORT is refused when no --port replaces it" \
  refuses SLOTD_PORT SLOTD_PORT=http -- --admin-port 0
# A flag replaces its variable, so a malformed one it replaces is never read.
pg=$(free_port) && ag=$(free_port "$pg") || { fail "no free port"; exit 1; }
daemon override SLOTD_PORT=http -- --port "$pg" --admin-port "$ag"
check "a malformed SLOTD_PORT is ignored when --port $pg replaces it" wait_for 10 healthy "$ag"
kill -TERM "$dpid"; wait "$dpid"
check "--threads=0 is refused" refuses --threads -- --threads=0 --port 0 --admin-port 0

# ---- The operator's table lists every setting ----

if [ -f "$doc" ]; then
  missing=()
  while read -r flag _ rest; do
    name=${flag#--}
    case $name in help | version) continue ;; esac
    case $rest in "test build:"*) continue ;; esac
    var=SLOTD_$(tr 'a-z-' 'A-Z_' <<<"$name")
    def=$(sed -n 's/.*(\([^()]*\))$/\1/p' <<<"$rest")
    row=$(grep -F "| \`--$name\` |" "$doc" | head -n 1)
    IFS='|' read -r _ _ c_var c_def _ <<<"$row"
    c_var=$(trim "$c_var") c_def=$(trim "$c_def")
    if [ -z "$row" ] || [ "$c_var" != "\`$var\`" ] || { [ "$c_def" != "\`$def\`" ] && [ "$c_def" != "$def" ]; }; then
      missing+=("--$name ($var, default '$def')")
    fi
  done < <(sed -n 's/^  \(--[a-z-]*\)\( V\)\{0,1\} *\(.*\)$/\1 x \3/p' <<<"$help")
  check "docs/operations.md has a row for every setting in slotd --help, with its variable and default${missing:+: missing ${missing[*]}}" \
    test ${#missing[@]} -eq 0
else
  fail "no $doc"
fi

[ $failed -eq 0 ]
