#!/usr/bin/env bash
# Installs what slotd needs, builds the daemon and its client, and starts
# the daemon with its defaults (sessions on 127.0.0.1:7070, admin HTTP on
# 127.0.0.1:7071).  Extra arguments go to the daemon: scripts/run.sh --threads 4
#
# It builds only the targets running needs (slotd and slotd-cli, in build/,
# as scripts/build.sh configures it), not the tests and benchmarks, and
# says what it is doing, one line per phase, on stderr.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "run.sh: $*" >&2; }

say "installing packages (scripts/deps.sh: apt-get, through sudo when not root)..."
scripts/deps.sh
say "configuring build/ (cmake, Release)..."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSANITIZER=none >/dev/null
say "building slotd and slotd-cli in build/ ($(nproc) jobs)..."
cmake --build build -j"$(nproc)" --target slotd slotd-cli >/dev/null

# The addresses the daemon will take: its flags win over its SLOTD_*
# variables, which win over its defaults (docs/operations.md, "Settings").
listen=${SLOTD_LISTEN:-127.0.0.1} port=${SLOTD_PORT:-7070}
admin_listen=${SLOTD_ADMIN_LISTEN:-127.0.0.1} admin_port=${SLOTD_ADMIN_PORT:-7071}
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  a=${args[i]} v=${args[i + 1]:-}
  case $a in --*=*) v=${a#*=} a=${a%%=*} ;; esac
  case $a in
    --listen) listen=$v ;;
    --port) port=$v ;;
    --admin-listen) admin_listen=$v ;;
    --admin-port) admin_port=$v ;;
  esac
done
addr() { # HOST PORT: host:port, [v6]:port, or "any free port" for 0
  local h=$1
  [[ $h == *:* ]] && h="[$h]"
  if [ "$2" = 0 ]; then echo "$h, any free port (logged below)"; else echo "$h:$2"; fi
}
say "starting build/server/slotd: sessions on $(addr "$listen" "$port"), admin HTTP on" \
  "$(addr "$admin_listen" "$admin_port"); client: build/server/slotd-cli; Ctrl-C stops it"
exec build/server/slotd "$@"
