#!/usr/bin/env bash
# Installs what slotd needs, builds it, and starts the daemon with its
# defaults (sessions on 127.0.0.1:7070, admin HTTP on 127.0.0.1:7071).
# Extra arguments go to the daemon: scripts/run.sh --threads 4
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh build none >/dev/null
exec build/server/slotd "$@"
