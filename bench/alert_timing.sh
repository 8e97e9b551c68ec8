#!/usr/bin/env bash
# How long SlotdDown takes to reach the page receiver with the committed
# deploy/ files as they are (5 s scrape and evaluation, the rule's 30 s,
# the page route's group_wait and group_interval), and how long its
# "resolved" takes after the instance is back: one slotd, Prometheus and
# Alertmanager on copies of deploy/prometheus.yml and deploy/alertmanager.yml
# in which only the addresses change, and a webhook receiver that notes
# when each notification arrives.  Prints the figures; checks nothing.
# tests/scaleout.sh checks the same path with 1 s intervals.
#
#   bench/alert_timing.sh [BUILD_DIR]   (default build/; about 2 minutes)
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
slotd=${SLOTD_BIN:-$build/server/slotd}
. "$root/tests/lib.sh"
for t in prometheus prometheus-alertmanager python3 curl; do
  command -v $t >/dev/null || { echo "alert_timing: $t not installed (scripts/deps.sh --test)" >&2; exit 1; }
done
[ -x "$slotd" ] || { echo "alert_timing: no daemon at $slotd" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/slotd-alerts.XXXXXX") || exit 1
pids=()
daemon=""
cleanup() {
  [ -n "$daemon" ] && kill -KILL "$daemon" 2>/dev/null
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

port=$(free_port) && admin=$(free_port "$port") && am=$(free_port "$port" "$admin") &&
  prom=$(free_port "$port" "$admin" "$am") && hook=$(free_port "$port" "$admin" "$am" "$prom") ||
  { echo "alert_timing: no free port" >&2; exit 1; }
cp "$root/deploy/prometheus.yml" "$root/deploy/slotd_alerts.yml" "$root/deploy/alertmanager.yml" "$work/"
(umask 077 && echo alert-timing-token-0123456789 >"$work/slotd_token")
sed -i "s/- targets: \[\"127.0.0.1:7171\".*/- targets: [\"127.0.0.1:$admin\"]/;
        s/- targets: \[\"127.0.0.1:9093\"\]/- targets: [\"127.0.0.1:$am\"]/" "$work/prometheus.yml"
sed -i "s#http://127.0.0.1:9095/#http://127.0.0.1:$hook/#" "$work/alertmanager.yml"
grep -q "127.0.0.1:$admin" "$work/prometheus.yml" && grep -q "127.0.0.1:$hook" "$work/alertmanager.yml" ||
  { echo "alert_timing: the deploy/ files no longer have the example addresses" >&2; exit 1; }

# Each POST: the time it arrived (ms), the path, and the alert's status.
python3 -c '
import http.server, json, sys, time
class Hook(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        with open(sys.argv[2], "a") as f:
            for a in body.get("alerts", []):
                f.write("%d %s %s %s\n" % (time.time() * 1000, self.path, a["labels"].get("alertname"), a["status"]))
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Hook).serve_forever()
' "$hook" "$work/webhook.log" 2>"$work/webhook.err" &
pids+=("$!")
prometheus-alertmanager --config.file="$work/alertmanager.yml" --storage.path="$work/am" \
  --web.listen-address="127.0.0.1:$am" --cluster.listen-address= >"$work/am.log" 2>&1 &
pids+=("$!")
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$prom" >"$work/prom.log" 2>&1 &
pids+=("$!")

start() {
  SLOTD_PORT=$port SLOTD_ADMIN_PORT=$admin "$slotd" >>"$work/slotd.log" 2>&1 &
  daemon=$!
}
up() {
  curl -s -m 2 "http://127.0.0.1:$prom/api/v1/query" --data-urlencode "query=up{instance=\"127.0.0.1:$admin\"}" |
    grep -q '"value":\[[^]]*,"1"\]'
}
arrived() { grep -q " SlotdDown $1\$" "$work/webhook.log" 2>/dev/null; }
at() { awk -v s="$1" '$3 == "SlotdDown" && $4 == s { print $1; exit }' "$work/webhook.log"; }

start
wait_for 60 up || { echo "alert_timing: Prometheus never saw the instance up" >&2; exit 1; }
kill -KILL "$daemon"; wait "$daemon" 2>/dev/null
t_kill=$(now_ms)
daemon=""
wait_for 180 arrived firing || { echo "alert_timing: no SlotdDown firing within 180 s" >&2; exit 1; }
t_fire=$(at firing)
start
t_back=$(now_ms)
wait_for 600 arrived resolved || { echo "alert_timing: no SlotdDown resolved within 600 s" >&2; exit 1; }
t_res=$(at resolved)
awk -v k="$t_kill" -v f="$t_fire" -v b="$t_back" -v r="$t_res" 'BEGIN {
  printf "SlotdDown firing at the page receiver %.1f s after kill -9\n", (f - k) / 1000
  printf "SlotdDown resolved at the page receiver %.1f s after the restart (%.1f s after firing)\n", (r - b) / 1000, (r - f) / 1000 }'
