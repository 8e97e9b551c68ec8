#!/usr/bin/env bash
# The client's address through real HAProxy: deploy/haproxy.cfg sends each
# instance a PROXY v2 header (send-proxy-v2), and an instance started with
# --proxy-from HAProxy's address shows the client, not HAProxy, in GET
# /sessions and in its log.  One instance (a token set, as the guide
# recommends) stands behind all three server lines; the client connects
# from 127.0.0.3 so that its address differs from HAProxy's.  An instance
# without --proxy-from behind the same file refuses the header's bytes as
# bad input and never shows a client's address it was not given.
#
#   tests/test_haproxy_proxy.sh [BUILD_DIR]   (or SLOTD_BUILD_DIR; default build/)
#
# haproxy and python3 must be installed (scripts/deps.sh --test): a missing
# one is a failure.  Each check prints PASS or FAIL; the exit status is 1 if
# any failed.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-${SLOTD_BUILD_DIR:-$root/build}}
slotd=${SLOTD_BIN:-$build/server/slotd}
. "$root/tests/lib.sh"

passed=0
failed=0
pids=()
work=$(mktemp -d "${TMPDIR:-/tmp}/slotd-haproxy-proxy.XXXXXX") || exit 1
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
die() { fail "$*"; exit 1; }

for t in haproxy python3 curl; do
  command -v $t >/dev/null || die "$t not installed (scripts/deps.sh --test)"
done
[ -x "$slotd" ] || die "no daemon at $slotd"

token=haproxy-proxy-token-0123456789
(umask 077 && echo "$token" >"$work/token")
ports=()
for name in port admin lb_port lb_stats_port; do
  p=$(free_port "${ports[@]}") || die "no free loopback port"
  ports+=("$p")
  printf -v "$name" %s "$p"
done

# start_slotd LOG FLAGS...: an instance on $port/$admin.
start_slotd() {
  local log=$1; shift
  "$slotd" --port "$port" --admin-port "$admin" --auth-token-file "$work/token" \
    --log-level debug "$@" >"$work/$log" 2>&1 &
  pids+=("$!")
  wait_for 10 curl -sf -o /dev/null "http://127.0.0.1:$admin/health" ||
    die "slotd did not answer /health within 10 s"
}

export SLOTD_LB_BIND=127.0.0.1:$lb_port SLOTD_LB_STATS=127.0.0.1:$lb_stats_port \
  SLOTD_LB_SOCKET=$work/haproxy.sock
for i in 1 2 3; do
  export "SLOTD_S$i=127.0.0.1:$port" "SLOTD_S${i}_ADMIN_ADDR=127.0.0.1" \
    "SLOTD_S${i}_ADMIN_PORT=$admin"
done

up() { curl -s -m 2 "http://127.0.0.1:$lb_stats_port/;csv" | grep -q '^slotd,s1,.*,UP,'; }

# client: through HAProxy from 127.0.0.3, auth and a session start; prints
# the client's own "ADDR:PORT", then the peer GET /sessions shows.
client() {
  python3 - "$lb_port" "$admin" "$token" <<'PY'
import json, socket, sys, urllib.request
lb, admin, token = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
s = socket.socket()
s.bind(("127.0.0.3", 0))
s.settimeout(10)
s.connect(("127.0.0.1", lb))
f = s.makefile("rwb")
out = []
for line in ('{"op":"auth","token":"%s"}' % token, '{"op":"start","id":"p","prompt":[1,2]}'):
    f.write(line.encode() + b"\n")
    f.flush()
    out.append(f.readline().decode().strip())
me = "%s:%d" % s.getsockname()
req = urllib.request.Request("http://127.0.0.1:%d/sessions" % admin,
                             headers={"Authorization": "Bearer " + token})
body = json.load(urllib.request.urlopen(req, timeout=5))
peers = [x["connection"]["peer"] for x in body["sessions"]]
print(me, peers[0] if peers else "none", out[0], out[1], sep="\t")
PY
}

# With --proxy-from: the client's address.
start_slotd trusted.log --proxy-from 127.0.0.1
(ulimit -n 4096 && exec haproxy -db -f "$root/deploy/haproxy.cfg") >"$work/haproxy.log" 2>&1 &
pids+=("$!")
wait_for 10 up || die "HAProxy did not mark the instance UP within 10 s"
IFS=$'\t' read -r me peer auth start < <(client) || true
check "through HAProxy, auth is answered: $auth" [ "$auth" = '{"ok":true}' ]
check "and the session starts: $start" test "${start#\{\"id\":\"p\"}" != "$start"
check "/sessions shows the client ($me), not HAProxy: $peer" test -n "$me" -a "$peer" = "$me"
check "the log names the client in the PROXY v2 header" \
  grep -q "PROXY v2 header from 127.0.0.1:[0-9]*: the client is $me" "$work/trusted.log"

# Without --proxy-from, the same file: the header is bad input, the
# address shown is HAProxy's own.
kill -TERM "${pids[0]}"
wait "${pids[0]}" 2>/dev/null
start_slotd untrusted.log
wait_for 10 up || die "HAProxy did not see the instance UP again within 10 s"
IFS=$'\t' read -r me peer auth start < <(client) || true
check "without --proxy-from, the header's bytes are answered as bad input: $auth" \
  test "${auth#\{\"error\"}" != "$auth"
check "and nothing shows the client's address ($me)" [ "$peer" != "$me" ]

echo "haproxy_proxy: $passed passed, $failed failed"
[ $failed -eq 0 ]
