#!/usr/bin/env bash
# Installs what slotd needs from Debian 12's packages.
#   scripts/deps.sh          build and run the daemon, and the README's
#                            quick start (nc, curl)
#   scripts/deps.sh --test   also everything the test suite and benchmarks use
# The README, CI (.ci/run) and the Dockerfile all install through this script.
set -euo pipefail

pkgs=(build-essential cmake pkg-config libuv1-dev libcjson-dev check libhttp-parser-dev libedit-dev
      netcat-openbsd curl)
if [ "${1:-}" = "--test" ]; then
  pkgs+=(clang libclang-rt-14-dev valgrind python3 prometheus prometheus-alertmanager
         redis-server haproxy socat procps openssl
         systemd podman runc debootstrap)
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "deps.sh: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "deps.sh: installed ${missing[*]}"
