#!/usr/bin/env bash
# Installs what the tests need, builds slotd several ways and runs the whole
# suite in each:
#   plain     Debug build (assertions on, released cache memory poisoned)
#   address   ASan + UBSan
#   thread    TSan
#   valgrind  memcheck over the unit tests
#   fuzz      a short libFuzzer run of every parser (clang)
# Pick stages with STAGES="plain address" scripts/test.sh.  Exit status is
# non-zero if any stage fails; the last line counts the stages.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh --test || exit 1

jobs=$(nproc)
stages=${STAGES:-plain address thread valgrind fuzz}
passed=0
failed=0
failed_names=()

stage() {
  local name=$1; shift
  echo "=== stage $name ==="
  local t0=$SECONDS
  if "$@"; then
    passed=$((passed + 1)); echo "=== stage $name: ok ($((SECONDS - t0)) s) ==="
  else
    failed=$((failed + 1)); failed_names+=("$name"); echo "=== stage $name: FAILED ($((SECONDS - t0)) s) ==="
  fi
}

run_suite() { # dir sanitizer [ctest args...]
  local dir=$1 san=$2; shift 2
  scripts/build.sh "$dir" "$san" -DCMAKE_BUILD_TYPE=Debug >/dev/null || return 1
  ctest --test-dir "$dir" --output-on-failure -j"$jobs" "$@"
}

run_valgrind() {
  local dir=build-test-plain
  [ -d "$dir" ] || scripts/build.sh "$dir" none -DCMAKE_BUILD_TYPE=Debug >/dev/null || return 1
  CK_FORK=no ctest --test-dir "$dir" --output-on-failure -j"$jobs" -L unit \
    -T memcheck --overwrite MemoryCheckCommandOptions="--error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite,indirect --track-origins=no"
}

run_fuzz() {
  CC=clang scripts/build.sh build-fuzz none -DCMAKE_BUILD_TYPE=Debug -DSLOTD_FUZZ=ON >/dev/null || return 1
  tests/fuzz/run.sh build-fuzz "${FUZZ_SECONDS:-30}"
}

for s in $stages; do
  case $s in
    plain)    stage plain    run_suite build-test-plain none ;;
    address)  stage address  env ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
                              bash -c "$(declare -f run_suite); run_suite build-test-asan address" ;;
    thread)   stage thread   env TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
                              bash -c "$(declare -f run_suite); run_suite build-test-tsan thread" ;;
    valgrind) stage valgrind run_valgrind ;;
    fuzz)     stage fuzz     run_fuzz ;;
    *) echo "unknown stage $s" >&2; failed=$((failed + 1)); failed_names+=("$s") ;;
  esac
done

[ $failed -gt 0 ] && echo "failed stages: ${failed_names[*]}"
echo "stages: $passed passed, $failed failed"
[ $failed -eq 0 ]
