#!/usr/bin/env bash
# Three slotd instances behind HAProxy, on loopback, driven by slotd-bench
# through the balancer: the deployment of docs/operations.md, checked end to
# end.  It builds nothing.  As the guide recommends, the instances run with
# a token (--auth-token-file): slotd-bench, the TLS session and the holding
# client present it on the session port, Prometheus and the admin queries
# here as Bearer.
#
#   tests/scaleout.sh [BUILD_DIR]      (or SLOTD_BUILD_DIR; default build/)
#
# SLOTD_BIN and SLOTD_BENCH name the binaries if they are not under
# BUILD_DIR (CTest passes them).  HAProxy runs on the committed
# deploy/haproxy.cfg, which reads its addresses from the environment.
# Prometheus and Alertmanager run on copies of deploy/prometheus.yml,
# deploy/slotd_alerts.yml and deploy/alertmanager.yml in which only the
# addresses and the intervals are changed (1 s instead of 5 s and more, to
# keep the test short); a few lines of Python stand for the webhook
# receiver.
#
# What it checks, in order:
#   1. the three instances come up; HAProxy starts on the file's defaults
#      under `ulimit -n 20000` and marks all three UP; Prometheus scrapes
#      all three; a session runs through HAProxy's TLS frontend (a
#      self-signed certificate made here with openssl) to an instance;
#   2. slotd-bench without the token, or with a wrong one, stops at once
#      with status 2 and says why; with it, slotd-bench --verify through
#      HAProxy finds no mismatch, every instance gets a fair share of the
#      connections and requests, and every instance's cache is empty
#      afterwards;
#   3. kill -9 of one instance during a run: the clients on it lose their
#      connections (and nothing else goes wrong), HAProxy marks it DOWN within
#      3 s, new sessions land on the two survivors and pass --verify, and
#      SlotdDown reaches the webhook receiver (the page route) about 30 s
#      after the kill;
#   4. the instance restarted on the same ports is marked UP again and gets
#      its share of a new run;
#   5. SIGTERM to an instance held open by a client that does not read: its
#      /health answers 503, HAProxy marks it DOWN for that reason and sends it
#      nothing, and once the client goes the instance exits with status 0;
#   6. the guide's drain through HAProxy's runtime API (the stats socket
#      haproxy.cfg declares): an instance set to drain gets no new
#      connection, and is UP again when set ready.
# Each check prints PASS or FAIL; the exit status is 1 if any failed.  Every
# wait is bounded, and every process started here is stopped on exit.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-${SLOTD_BUILD_DIR:-$root/build}}
slotd=${SLOTD_BIN:-$build/server/slotd}
bench=${SLOTD_BENCH:-$build/bench/slotd-bench}
cfg=$root/deploy/haproxy.cfg
. "$root/tests/lib.sh"

# Settings the operator's environment may hold must not reach the daemons.
for v in $(compgen -e | grep '^SLOTD_'); do
  case $v in SLOTD_BIN | SLOTD_BENCH | SLOTD_BUILD_DIR) ;; *) unset "$v" ;; esac
done

passed=0
failed=0
pids=()
work=$(mktemp -d "${TMPDIR:-/tmp}/slotd-scaleout.XXXXXX") || exit 1

die() {
  fail "$*"
  exit 1
}

cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for _ in $(seq 20); do
    local alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ $alive -eq 0 ] && break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  wait 2>/dev/null
  if [ $failed -gt 0 ] && [ -n "$(ls -A "$work")" ]; then
    echo "--- logs (kept in $work) ---"
    for f in "$work"/*.log "$work"/*.err; do
      [ -s "$f" ] && { echo "--- $(basename "$f") (last lines)"; tail -n 15 "$f"; }
    done
  else
    rm -rf "$work"
  fi
  echo "scaleout: $passed passed, $failed failed"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

# ---- Helpers ----


# num KEY < JSON: the first integer member KEY.
num() { grep -o "\"$1\": *-\?[0-9]*" | head -n 1 | grep -o -- '-\?[0-9]*$'; }

# stat I KEY: an integer of instance I's /stats ("" if it does not answer),
# asked with the token (the header from a file, so no command line shows it).
stat() { curl -s -m 2 -H @"$work/bearer" "http://127.0.0.1:${admin[$1]}/stats" | num "$2"; }
health_code() { curl -s -m 2 -o /dev/null -w '%{http_code}' "http://127.0.0.1:${admin[$1]}/health"; }
healthy() { [ "$(health_code "$1")" = 200 ]; }

# lb SERVER COLUMN: one column of HAProxy's stats CSV for server s1..s3.
lb() {
  curl -s -m 2 "http://$lb_stats/;csv" | awk -F, -v s="$1" -v c="$2" '
    NR == 1 { sub(/^# /, ""); for (i = 1; i <= NF; i++) col[$i] = i; next }
    $1 == "slotd" && $2 == s { print $(col[c]) }'
}
lb_is() { [ "$(lb "$1" status)" = "$2" ]; }

# The session ports on 127.0.0.2, the admin ports where they are by
# default (127.0.0.1): HAProxy's checks reach each instance's admin address.
start_instance() { # I: on its fixed ports, logging to sI.log
  "$slotd" --listen 127.0.0.2 --port "${port[$1]}" --admin-port "${admin[$1]}" \
    --threads 2 --shutdown-timeout 60 --auth-token-file "$work/slotd_token" >>"$work/s$1.log" 2>&1 &
  pid[$1]=$!
  pids+=("$!")
  wait_for 10 healthy "$1"
}

# run_bench NAME ARGS...: slotd-bench through HAProxy with the instances'
# token, JSON in NAME.json, diagnostics in NAME.err; returns its exit status.
run_bench() {
  local name=$1; shift
  timeout 60 "$bench" -h 127.0.0.1 -p "$lb_port" -q -j --auth-token-file "$work/slotd_token" "$@" \
    >"$work/$name.json" 2>"$work/$name.err"
}

before_req=()
before_conn=()
snapshot() { # every instance's requests_total and HAProxy's stot, now
  local i
  for i in 1 2 3; do
    before_req[i]=$(stat $i requests_total)
    before_conn[i]=$(lb "s$i" stot)
  done
}

# spread LABEL I...: every listed instance got at least 10 % of the requests
# and at least a sixth of the connections since the `before` snapshot.
spread() {
  local label=$1; shift
  local i total=0 conns=0 ok=0 line=""
  declare -A dr dc
  for i in "$@"; do
    dr[$i]=$(($(stat "$i" requests_total) - before_req[i]))
    dc[$i]=$(($(lb "s$i" stot) - before_conn[i]))
    total=$((total + dr[$i]))
    conns=$((conns + dc[$i]))
  done
  for i in "$@"; do
    line+=" s$i: ${dc[$i]} connections, ${dr[$i]} requests ($((total > 0 ? dr[$i] * 100 / total : 0)) %);"
    if [ "${dr[$i]}" -le 0 ] || [ $((dr[$i] * 10)) -lt $total ] || [ $((dc[$i] * 6)) -lt $conns ] ||
       [ "${dc[$i]}" -le 0 ]; then
      ok=1
    fi
  done
  check "$label:$line" test $ok -eq 0
}

drained() { # I...: cache_entries and live_sessions 0 on each
  local i
  for i in "$@"; do
    [ "$(stat "$i" cache_entries)" = 0 ] && [ "$(stat "$i" live_sessions)" = 0 ] || return 1
  done
}
check_drained() { # LABEL I...
  local label=$1; shift
  if wait_for 3 drained "$@"; then
    pass "$label: cache_entries and live_sessions are 0 on$(printf ' s%s' "$@")"
  else
    local i detail=""
    for i in "$@"; do detail+=" s$i: $(stat "$i" cache_entries) entries, $(stat "$i" live_sessions) sessions;"; done
    fail "$label: cache not empty after 3 s:$detail"
  fi
}

bench_ok() { # LABEL NAME RC: exit 0, no mismatch, no error reply
  local label=$1 name=$2 rc=$3
  local mm err
  mm=$(num mismatches <"$work/$name.json")
  err=$(num total <"$work/$name.json")
  if [ "$rc" -eq 0 ] && [ "$mm" = 0 ] && [ "$err" = 0 ]; then
    pass "$label: slotd-bench --verify exit 0, $(num checked_tokens <"$work/$name.json") tokens checked, 0 mismatches"
  else
    fail "$label: slotd-bench exit $rc, mismatches '${mm}', error replies '${err}' (see $name.err)"
  fi
}

# ---- Preflight ----

for tool in haproxy curl socat python3 prometheus prometheus-alertmanager amtool promtool; do
  command -v $tool >/dev/null || die "$tool is not installed (scripts/deps.sh --test installs it)"
done
[ -x "$slotd" ] || die "no daemon at $slotd (build first: scripts/build.sh)"
[ -x "$bench" ] || die "no slotd-bench at $bench (build first: scripts/build.sh)"
[ -f "$cfg" ] || die "no $cfg"

declare -a port admin pid
taken=()
for i in 1 2 3; do
  port[$i]=$(free_port "${taken[@]}") && taken+=("${port[$i]}") &&
    admin[$i]=$(free_port "${taken[@]}") && taken+=("${admin[$i]}") || die "no free loopback port"
done
for name in lb_port lb_stats_port prom_port am_port hook_port; do
  p=$(free_port "${taken[@]}") || die "no free loopback port"
  taken+=("$p")
  printf -v "$name" %s "$p"
done
lb_stats=127.0.0.1:$lb_stats_port
lb_sock=$work/haproxy.sock

# deploy/haproxy.cfg sends each instance a PROXY header: the instances
# (started below) accept it from HAProxy's loopback addresses.
export SLOTD_PROXY_FROM=127.0.0.0/8
export SLOTD_LB_BIND=127.0.0.1:$lb_port SLOTD_LB_STATS=$lb_stats SLOTD_LB_SOCKET=$lb_sock
unset SLOTD_LB_MAXCONN # the file's default is under test
tls_port=$(free_port "${taken[@]}") || die "no free loopback port"
taken+=("$tls_port")
command -v openssl >/dev/null || die "openssl not installed (scripts/deps.sh --test)"
(umask 077 && openssl req -x509 -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -days 1 \
  -keyout "$work/key.pem" -out "$work/cert.pem" 2>"$work/openssl.err" &&
  cat "$work/cert.pem" "$work/key.pem" >"$work/slotd.pem") || die "openssl could not make a certificate"
export SLOTD_LB_TLS_BIND=127.0.0.1:$tls_port SLOTD_LB_TLS_CERT=$work/slotd.pem
for i in 1 2 3; do
  export "SLOTD_S$i=127.0.0.2:${port[$i]}" "SLOTD_S${i}_ADMIN_ADDR=127.0.0.1" \
    "SLOTD_S${i}_ADMIN_PORT=${admin[$i]}"
done
echo "scaleout: instances on ${port[1]}, ${port[2]}, ${port[3]} (admin ${admin[1]}, ${admin[2]}, ${admin[3]});" \
  "HAProxy on $lb_port, its stats on $lb_stats_port; Prometheus on $prom_port, Alertmanager on" \
  "$am_port, the webhook receiver on $hook_port; logs in $work"

# ---- Monitoring: the committed files with test addresses and intervals ----

# edit FILE SED-SCRIPT: applies the script in place; the test stops if the
# file did not change (the committed file no longer has that line).
edit() {
  local before
  before=$(cksum <"$1")
  sed -i "$2" "$1"
  [ "$(cksum <"$1")" != "$before" ] || die "$(basename "$1"): no line matched '$2'"
}
cp "$root/deploy/prometheus.yml" "$root/deploy/slotd_alerts.yml" "$root/deploy/alertmanager.yml" "$work/"
# The token of the instances (--auth-token-file), which the file presents
# as Bearer; bearer and auth_line carry it for curl and the shell clients.
token=scaleout-token-$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')
(umask 077 && echo "$token" >"$work/slotd_token" && echo "Authorization: Bearer $token" >"$work/bearer")
auth_line="{\"op\":\"auth\",\"token\":\"$token\"}"
edit "$work/prometheus.yml" 's/^\(  *scrape_interval:\) .*/\1 1s/'
edit "$work/prometheus.yml" 's/^\(  *evaluation_interval:\) .*/\1 1s/'
edit "$work/prometheus.yml" "s/- targets: \[\"127.0.0.1:7171\".*/- targets: [\"127.0.0.1:${admin[1]}\", \"127.0.0.1:${admin[2]}\", \"127.0.0.1:${admin[3]}\"]/"
edit "$work/prometheus.yml" "s/- targets: \[\"127.0.0.1:9093\"\]/- targets: [\"127.0.0.1:$am_port\"]/"
edit "$work/alertmanager.yml" "s#http://127.0.0.1:9095/#http://127.0.0.1:$hook_port/#"
edit "$work/alertmanager.yml" 's/^\(  *group_wait:\) .*/\1 1s/'
edit "$work/alertmanager.yml" 's/^\(  *group_interval:\) .*/\1 1s/'
if promtool check config "$work/prometheus.yml" >"$work/promtool.log" 2>&1 &&
   amtool check-config "$work/alertmanager.yml" >"$work/amtool.log" 2>&1; then
  pass "the monitoring configurations, at test addresses and 1 s intervals, are valid"
else
  die "promtool or amtool rejects the test's copies (see promtool.log, amtool.log)"
fi

# The webhook receiver: the path and body of each POST on one line of
# webhook.log.
: >"$work/webhook.log"
python3 -c '
import http.server, sys
class Hook(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with open(sys.argv[2], "ab") as f:
            f.write(self.path.encode() + b" " + body.replace(b"\n", b" ") + b"\n")
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Hook).serve_forever()
' "$hook_port" "$work/webhook.log" >"$work/webhook.err" 2>&1 &
pids+=("$!")
prometheus-alertmanager --config.file="$work/alertmanager.yml" --storage.path="$work/am" \
  --web.listen-address="127.0.0.1:$am_port" --cluster.listen-address= >"$work/alertmanager.log" 2>&1 &
pids+=("$!")
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port" >"$work/prometheus.log" 2>&1 &
pids+=("$!")
ready() { curl -sf -m 2 -o /dev/null "http://127.0.0.1:$1/-/ready"; }
# prom_up: how many of the three instances Prometheus last saw up.
prom_up() {
  curl -s -m 2 "http://127.0.0.1:$prom_port/api/v1/query" --data-urlencode 'query=sum(up{job="slotd"})' |
    grep -o '"value":\[[^]]*\]' | grep -o '"[0-9]*"\]' | tr -dc 0-9
}
prom_sees() { [ "$(prom_up)" = "$1" ]; }

# ---- 1. Start ----

if haproxy -c -q -f "$cfg" >"$work/haproxy-check.log" 2>&1; then
  pass "deploy/haproxy.cfg is valid (haproxy -c)"
else
  die "haproxy -c rejects deploy/haproxy.cfg (see haproxy-check.log)"
fi

for i in 1 2 3; do
  start_instance $i || die "instance s$i did not answer /health within 10 s"
done
pass "three instances answer /health 200"

# Under `ulimit -n 20000`, with no maxconn set: it must start (a maxconn of
# 20000 needs twice as many descriptors, and HAProxy refused to start).
(ulimit -n 20000 && exec haproxy -db -f "$cfg") >"$work/haproxy.log" 2>&1 &
pids+=("$!")
# lb_cmd COMMAND: one command to HAProxy's runtime API, as the guide sends it.
lb_cmd() { echo "$1" | socat stdio "$lb_sock"; }
lb_info() { lb_cmd "show info" 2>/dev/null | sed -n "s/^$1: //p"; }
lb_started() { [ -n "$(lb_info Maxconn)" ]; }
if wait_for 10 lb_started; then
  pass "HAProxy starts on the file's defaults under ulimit -n 20000 (its show info: Ulimit-n" \
    "$(lb_info Ulimit-n), Maxconn $(lb_info Maxconn)), its runtime API answering on SLOTD_LB_SOCKET"
else
  die "HAProxy did not start under ulimit -n 20000, or its runtime API does not answer (see haproxy.log)"
fi
all_up() { lb_is s1 UP && lb_is s2 UP && lb_is s3 UP; }
if wait_for 10 all_up; then
  pass "HAProxy marks s1, s2, s3 UP"
else
  die "HAProxy did not mark all three UP within 10 s: s1 '$(lb s1 status)', s2 '$(lb s2 status)', s3 '$(lb s3 status)'"
fi
if wait_for 20 ready "$am_port" && wait_for 20 ready "$prom_port" && wait_for 10 prom_sees 3; then
  pass "Alertmanager is ready, and Prometheus scrapes all three instances (up = 1)"
else
  die "Prometheus sees '$(prom_up)' of 3 instances up, or it or Alertmanager is not ready (see prometheus.log, alertmanager.log)"
fi

# A session over TLS: openssl s_client checks the certificate against the
# one made above and carries the lines; the replies come back decrypted.
tls_session() {
  local line out=()
  coproc TLS { exec openssl s_client -quiet -verify_return_error -CAfile "$work/cert.pem" \
    -connect "127.0.0.1:$tls_port" 2>>"$work/tls.err"; }
  printf '%s\n' "$auth_line" '{"op":"start","id":"t","prompt":[0,1,2]}' \
    '{"op":"step","id":"t","n":2}' '{"op":"finish","id":"t"}' >&"${TLS[1]}"
  for _ in 1 2 3 4; do
    IFS= read -r -t 10 line <&"${TLS[0]}" || break
    out+=("$line")
  done
  kill "$TLS_PID" 2>/dev/null
  wait "$TLS_PID" 2>/dev/null
  echo "${out[*]}"
}
reply=$(tls_session)
check "a session through HAProxy's TLS frontend: ${reply:-no reply (see tls.err)}" \
  bash -c '[[ $1 == "{\"ok\":true} {\"id\":\"t\",\"model\":\"tiny\",\"entries\":3,\"cached\":0} {\"id\":\"t\",\"tokens\":[4,0],"*"\"entries\":5} {\"id\":\"t\",\"released\":5}" ]]' _ "$reply"

# ---- 2. Load through HAProxy ----

# Without the token, or with a wrong one, slotd-bench stops at the first
# refusal (it used to loop on auth_required for the whole -d 30) with
# status 2 and a message that says what to do.
timeout 20 "$bench" -h 127.0.0.1 -p "$lb_port" -q -c 4 -d 30 >"$work/notoken.out" 2>"$work/notoken.err"
rc=$?
check "slotd-bench without the token: exit $rc (want 2), '$(head -c 160 "$work/notoken.err")'" \
  bash -c '[ "$1" -eq 2 ] && grep -q "auth_required.*--auth-token-file" "$2"' _ "$rc" "$work/notoken.err"
(umask 077 && echo "scaleout-wrong-$token" >"$work/wrong_token")
timeout 20 "$bench" -h 127.0.0.1 -p "$lb_port" -q -c 4 -d 30 --auth-token-file "$work/wrong_token" \
  >"$work/wrongtoken.out" 2>"$work/wrongtoken.err"
rc=$?
check "slotd-bench with a wrong token: exit $rc (want 2), '$(head -c 160 "$work/wrongtoken.err")'" \
  bash -c '[ "$1" -eq 2 ] && grep -q "auth_failed" "$2"' _ "$rc" "$work/wrongtoken.err"

snapshot
run_bench spread -c 48 -P 4 -d 5 --verify
bench_ok "balanced run" spread $?
spread "balanced run spreads over all three" 1 2 3
check_drained "balanced run" 1 2 3

# ---- 3. kill -9 during a run ----

run_bench lossy -c 48 -P 4 -d 8 --verify --no-check-drain &
lossy=$!
pids+=("$lossy")
on_s2() { [ "$(stat 2 connections)" -ge 1 ] 2>/dev/null; }
wait_for 5 on_s2 || fail "no bench connection reached s2 within 5 s"
sleep 1
victims=$(stat 2 connections)
kill -KILL "${pid[2]}"
t0=$(now_ms)
killed_at=$t0
wait "${pid[2]}" 2>/dev/null
if wait_for 3 lb_is s2 DOWN; then
  pass "HAProxy marks the killed s2 DOWN after $(($(now_ms) - t0)) ms ($(lb s2 check_status))"
else
  fail "HAProxy still shows s2 as '$(lb s2 status)' 3 s after kill -9"
fi

wait "$lossy"
rc=$?
lost=$(num connection <"$work/lossy.json")
mm=$(num mismatches <"$work/lossy.json")
err=$(num total <"$work/lossy.json")
proto=$(num protocol <"$work/lossy.json")
# Exit 1 is how slotd-bench reports lost connections (bench/README.md).
if [ "$rc" -eq 1 ] && [ "${lost:-0}" -ge "${victims:-1}" ] && [ "$mm" = 0 ] && [ "$err" = 0 ] &&
   [ "$proto" = 0 ] && ! grep -q '"fatal": *"' "$work/lossy.json"; then
  pass "clients on s2 saw their connections close: $lost lost ($victims were on s2), 0 mismatches, 0 error replies, run completed"
else
  fail "run across the kill: exit $rc (want 1), lost '$lost' (want >= $victims), mismatches '$mm', error replies '$err', unreadable '$proto' (see lossy.err)"
fi

snapshot
run_bench survivors -c 24 -P 4 -d 3 --verify
bench_ok "after the kill" survivors $?
check "the killed s2 gets no connection from HAProxy" test "$(lb s2 stot)" = "${before_conn[2]}"
spread "new sessions land on s1 and s3" 1 3
check_drained "after the kill" 1 3

# The alert, end to end: up == 0 for 30 s fires SlotdDown for s2,
# Prometheus sends it to Alertmanager, which routes severity page to the
# slotd-page receiver: the webhook above.
hook_alert() {
  grep -F '"receiver":"slotd-page"' "$work/webhook.log" | grep -F '"status":"firing"' |
    grep -F '"alertname":"SlotdDown"' | grep -qF "\"instance\":\"127.0.0.1:${admin[2]}\""
}
if wait_for 90 hook_alert; then
  pass "SlotdDown for the killed s2 reached the webhook receiver $(($(now_ms) - killed_at)) ms after the" \
    "kill: $(grep -F SlotdDown "$work/webhook.log" | head -n 1 | cut -c 1-200)..."
else
  fail "no SlotdDown for s2 at the webhook receiver 90 s after the kill (see webhook.log, prometheus.log, alertmanager.log)"
fi

# ---- 4. Restart on the same ports ----

start_instance 2 || die "s2 did not restart on ports ${port[2]}/${admin[2]}"
t0=$(now_ms)
if wait_for 5 lb_is s2 UP; then
  pass "restarted s2 is marked UP after $(($(now_ms) - t0)) ms"
else
  fail "restarted s2 is '$(lb s2 status)' after 5 s"
fi
snapshot
run_bench rejoined -c 48 -P 4 -d 4 --verify
bench_ok "after the restart" rejoined $?
spread "a new run spreads over all three again" 1 2 3
check_drained "after the restart" 1 2 3

# ---- 5. Drain: SIGTERM with a client holding the instance open ----

# The client writes requests and never reads: the instance fills its socket
# and output buffers, stops reading, and cannot finish answering, so its
# drain lasts until the client goes (or --shutdown-timeout, 60 s here).
# Each request is a step on an unknown id with a 16 KB tag, which the error
# reply echoes: 16 KB of output for no work, a few hundred fill the buffers.
# It connects from loopback, which SLOTD_PROXY_FROM lists: a PROXY header
# first, as HAProxy sends, then the token.
bash -c 'exec 3<>"/dev/tcp/127.0.0.2/$1" || exit 1; printf "PROXY UNKNOWN\r\n%s\n" "$3" >&3
  exec yes "$2" >&3' _ "${port[3]}" \
  "{\"op\":\"step\",\"id\":\"none\",\"tag\":\"$(printf '%016000d' 0)\"}" \
  "$auth_line" 2>"$work/holder.err" &
holder=$!
pids+=("$holder")
# The holder has filled s3: it stopped reading (requests_total steady) and
# its output is stuck in a full socket buffer (tx_queue above 0 and steady),
# so what it answers during a drain cannot be written either.
stalled() {
  local a b u v
  a=$(stat 3 requests_total); u=$(unsent "${port[3]}")
  sleep 0.5
  b=$(stat 3 requests_total); v=$(unsent "${port[3]}")
  [ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" -gt 100 ] && [ "$u" -gt 0 ] && [ "$u" = "$v" ]
}
wait_for 15 stalled || fail "the holding client did not fill s3's buffers within 15 s"

kill -TERM "${pid[3]}"
t0=$(now_ms)
health_is() { [ "$(health_code "$1")" = "$2" ]; }
if wait_for 2 health_is 3 503; then
  pass "draining s3 answers /health 503"
else
  fail "draining s3 answers /health '$(health_code 3)', not 503"
fi
if wait_for 3 lb_is s3 DOWN; then
  pass "HAProxy marks draining s3 DOWN after $(($(now_ms) - t0)) ms ($(lb s3 check_status) $(lb s3 check_code))"
else
  fail "HAProxy shows draining s3 as '$(lb s3 status)' after 3 s"
fi
check "the drain is held open by the client (s3 still running)" kill -0 "${pid[3]}"
check "HAProxy's verdict is the 503 of /health" test "$(lb s3 check_code)" = 503

snapshot
run_bench draining -c 24 -P 4 -d 3 --verify
bench_ok "during the drain" draining $?
check "draining s3 gets no connection from HAProxy" test "$(lb s3 stot)" = "${before_conn[3]}"
check_drained "during the drain" 1 2

{ kill -KILL "$holder" && wait "$holder"; } 2>/dev/null
exited() { ! kill -0 "${pid[3]}" 2>/dev/null; }
if wait_for 10 exited; then
  wait "${pid[3]}"
  rc=$?
  check "s3 exits with status 0 once the client is gone (got $rc)" test $rc -eq 0
else
  fail "s3 still running 10 s after the holding client went"
fi

# ---- 6. The guide's drain: HAProxy's runtime API ----

if lb_cmd "set server slotd/s1 state drain" >"$work/lb-cmd.log" 2>&1 && wait_for 3 lb_is s1 DRAIN; then
  pass "'set server slotd/s1 state drain' through the runtime API: HAProxy shows s1 DRAIN"
else
  fail "s1 is '$(lb s1 status)' after 'set server slotd/s1 state drain' (see lb-cmd.log)"
fi
snapshot
run_bench lb_drain -c 12 -P 4 -d 2 --verify
bench_ok "with s1 in drain" lb_drain $?
check "s1 in drain gets no new connection" test "$(lb s1 stot)" = "${before_conn[1]}"
if lb_cmd "set server slotd/s1 state ready" >>"$work/lb-cmd.log" 2>&1 && wait_for 3 lb_is s1 UP; then
  pass "'set server slotd/s1 state ready': s1 UP again"
else
  fail "s1 is '$(lb s1 status)' after 'set server slotd/s1 state ready' (see lb-cmd.log)"
fi

[ $failed -eq 0 ]
