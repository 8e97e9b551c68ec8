#!/usr/bin/env bash
# Configures and builds slotd.
#   scripts/build.sh [BUILD_DIR [SANITIZER [extra cmake args...]]]
# BUILD_DIR defaults to build/, SANITIZER to none (or address, thread).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
san=${2:-none}
shift $(( $# > 2 ? 2 : $# ))
type=Release
[ "$san" != none ] && type=Debug
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE="$type" -DSANITIZER="$san" "$@" >/dev/null
cmake --build "$dir" -j"$(nproc)"
