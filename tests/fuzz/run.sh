#!/bin/sh
# run.sh BUILD_DIR SECONDS: runs each libFuzzer harness (framer, request, admin, proxy) for SECONDS
# on a scratch copy of its seed corpus (plus the saved regressions), and
# exits non-zero if any of them finds a crash, a leak or a timeout.
#
# BUILD_DIR is a build configured with CC=clang -DSLOTD_FUZZ=ON and built
# with --target fuzz_framer fuzz_request fuzz_admin fuzz_proxy.  New inputs the fuzzer finds stay
# in the scratch directory (printed at the end); copy the interesting ones
# into tests/fuzz/corpus/<harness>/ and any crash into tests/fuzz/regressions/.
set -eu

if [ $# -ne 2 ]; then
    echo "usage: $0 BUILD_DIR SECONDS" >&2
    exit 2
fi
build=$1
seconds=$2
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/slotd-fuzz.XXXXXX")
status=0

for harness in framer request admin proxy; do
    exe=$build/tests/fuzz_$harness
    if [ ! -x "$exe" ]; then
        echo "run.sh: $exe not found: configure with CC=clang -DSLOTD_FUZZ=ON and build it" >&2
        exit 2
    fi
    mkdir -p "$work/$harness/corpus" "$work/$harness/artifacts"
    cp "$here/corpus/$harness/"* "$work/$harness/corpus/"
    dict=
    if [ -f "$here/$harness.dict" ]; then
        dict=-dict=$here/$harness.dict
    fi
    echo "== fuzz_$harness for ${seconds}s"
    # shellcheck disable=SC2086
    if ! "$exe" -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$work/$harness/artifacts/" $dict \
        "$work/$harness/corpus" "$here/regressions" >"$work/$harness/log" 2>&1; then
        status=1
        tail -n 60 "$work/$harness/log" >&2
        echo "run.sh: fuzz_$harness failed; inputs in $work/$harness/artifacts/" >&2
    else
        grep -E '^stat::number_of_executed_units|^stat::peak_rss_mb|cov:' "$work/$harness/log" |
            tail -n 3
    fi
done
echo "run.sh: scratch corpora and logs in $work"
exit $status
