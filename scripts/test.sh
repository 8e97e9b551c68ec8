#!/usr/bin/env bash
# Installs what the tests need, builds slotd several ways and runs the whole
# suite in each:
#   quick     not in the default list: the plain build below (once, into
#             the same directory) and every test but those labelled slow,
#             heavy or scaleout; the run to make before a commit
#   plain     Debug build (assertions on, released cache memory poisoned) with
#             the test-only fault hooks (-DSLOTD_FAULT_INJECTION=ON), so that
#             the audit's tests against real damage run too; the only stage
#             that runs the tests labelled heavy
#   address   ASan + UBSan
#   thread    TSan
#   valgrind  memcheck over the unit tests, then the integration tests
#             labelled valgrind with the daemon under memcheck
#   fuzz      a short libFuzzer run of every parser (clang)
#   image     the Dockerfile built with podman on a Debian 12 base made by
#             debootstrap, run, a session opened and its HEALTHCHECK
#             healthy (tests/test_image.sh; kept under build-image/)
# Pick stages with STAGES="plain address" scripts/test.sh or as arguments
# (scripts/test.sh quick).  Labels that stages leave out (tests/CMakeLists.txt):
# layout (checks of the sources and of the build's shape, the same under any
# sanitizer: run by plain and quick only), single (single-threaded by
# construction: nothing for TSan to see), slow (left out by quick only).
# Check tags that stages leave out (CK_EXCLUDE_TAGS; the tag's place says
# what it checks and which stages run it): memcheck_slow (valgrind),
# tsan_slow (thread): cases in one thread whose references are long.
# SLOTD_TEST_REPEATS=1 (address, thread, valgrind's integration part): a
# case that makes one check on several seeds or rounds makes it once
# (test_integration_pipeline's random mixes, test_integration_onfull's
# rounds of rebuilds, test_stages_evict's stage 4); the plain stage runs
# them all.
# Exit status is
# non-zero if any stage fails; a stage that this machine cannot run at all
# says why and is counted as skipped.  The last line counts the stages.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh --test || exit 1

jobs=$(nproc)
stages=${STAGES:-plain address thread valgrind fuzz image}
[ $# -gt 0 ] && stages=$*
passed=0
failed=0
skipped=0
failed_names=()

stage() {
  local name=$1; shift
  echo "=== stage $name ==="
  local t0=$SECONDS
  "$@"
  local rc=$?
  if [ $rc -eq 0 ]; then
    passed=$((passed + 1)); echo "=== stage $name: ok ($((SECONDS - t0)) s) ==="
  elif [ $rc -eq 77 ]; then
    skipped=$((skipped + 1)); echo "=== stage $name: SKIPPED, this machine cannot run it ($((SECONDS - t0)) s) ==="
  else
    failed=$((failed + 1)); failed_names+=("$name"); echo "=== stage $name: FAILED ($((SECONDS - t0)) s) ==="
  fi
}

# The plain build's extra configuration: the fault hooks exist only in
# test builds like this one, never in what scripts/build.sh makes by default.
plain_cmake_args=(-DSLOTD_FAULT_INJECTION=ON)

run_suite() { # dir sanitizer [cmake args...]
  local dir=$1 san=$2 skip=()
  shift 2
  scripts/build.sh "$dir" "$san" -DCMAKE_BUILD_TYPE=Debug "$@" >/dev/null || return 1
  # Tests labelled heavy (the batch kernels at every size, the long
  # prefills of `base`) are pure arithmetic, checked bit for bit in the
  # plain stage; a sanitizer's slowdown would make them hours.  The layout
  # checks read sources and symbol tables: a sanitizer changes nothing.
  # scaleout is the deployment (HAProxy, Prometheus, alerts) end to end:
  # 58 s of its own waits under any build, run alone (RUN_SERIAL).  Plain
  # and ASan run it; TSan would repeat it, its daemons seeing the kinds of
  # traffic (many clients, kill, drain) that the integration suites give
  # them under TSan already.
  case $san in
    none) ;;
    thread) skip=(-LE 'heavy|layout|single' -E '^scaleout$') ;;
    *) skip=(-LE 'heavy|layout') ;;
  esac
  # The sanitizer stages run this in a child bash, where $jobs is unset.
  ctest --test-dir "$dir" --output-on-failure -j"${jobs:-$(nproc)}" "${skip[@]}"
}

# The quick tier: the plain stage's build, brought up to date, and the
# tests that are neither slow nor heavy.
run_quick() {
  local dir=build-test-plain
  scripts/build.sh "$dir" none -DCMAKE_BUILD_TYPE=Debug "${plain_cmake_args[@]}" >/dev/null || return 1
  ctest --test-dir "$dir" --output-on-failure -j"$jobs" -LE 'slow|heavy|scaleout'
}

run_valgrind() {
  # The unit tests under memcheck reuse the plain stage's build (brought up
  # to date, which costs nothing after the plain stage).
  local dir=build-test-plain
  scripts/build.sh "$dir" none -DCMAKE_BUILD_TYPE=Debug "${plain_cmake_args[@]}" >/dev/null || return 1
  local rc=0
  # CK_EXCLUDE_TAGS: the Check cases too slow under memcheck (the
  # prefix cache's long references in test_cache), run by ASan and TSan.
  CK_FORK=no CK_EXCLUDE_TAGS=memcheck_slow ctest --test-dir "$dir" --output-on-failure -j"$jobs" -L unit \
    -T memcheck --overwrite MemoryCheckCommandOptions="--error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite,indirect --track-origins=no" || rc=1

  # The integration tests labelled valgrind (tests/hostile.cmake names
  # them), with the daemon under memcheck and the test itself native:
  # tests/itest.c puts SLOTD_WRAPPER before the daemon's command line and
  # fails a test whose daemon does not exit 0 (99: a memcheck error or a
  # definite or indirect leak), printing the valgrind log.  SLOTD_TIME_SCALE
  # stretches the tests' own waits, SLOTD_TEST_TIME_SCALE (a configure
  # option, hence a build directory of its own) their CTest timeouts.
  local vdir=build-test-valgrind
  scripts/build.sh "$vdir" none -DCMAKE_BUILD_TYPE=Debug -DSLOTD_TEST_TIME_SCALE=4 >/dev/null || return 1
  SLOTD_WRAPPER="valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite,indirect --track-origins=no --log-file=%q{SLOTD_ITEST_DIR}/valgrind.log" \
    SLOTD_TIME_SCALE=10 SLOTD_TEST_REPEATS=1 ctest --test-dir "$vdir" --output-on-failure -j"$jobs" -L valgrind || rc=1
  return $rc
}

run_fuzz() {
  # Only the four harnesses tests/fuzz/run.sh runs: the rest of the tree is
  # built and tested by the other stages.
  CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DSANITIZER=none -DSLOTD_FUZZ=ON >/dev/null &&
    cmake --build build-fuzz -j"$jobs" --target fuzz_framer fuzz_request fuzz_admin fuzz_proxy >/dev/null ||
    return 1
  tests/fuzz/run.sh build-fuzz "${FUZZ_SECONDS:-30}"
}

for s in $stages; do
  case $s in
    quick)    stage quick    run_quick ;;
    plain)    stage plain    run_suite build-test-plain none "${plain_cmake_args[@]}" ;;
    address)  stage address  env ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 SLOTD_TIME_SCALE=2 SLOTD_TEST_REPEATS=1 \
                              bash -c "$(declare -f run_suite); run_suite build-test-asan address" ;;
    thread)   stage thread   env TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 SLOTD_TIME_SCALE=4 CK_EXCLUDE_TAGS=tsan_slow SLOTD_TEST_REPEATS=1 \
                              bash -c "$(declare -f run_suite); run_suite build-test-tsan thread" ;;
    valgrind) stage valgrind run_valgrind ;;
    fuzz)     stage fuzz     run_fuzz ;;
    image)    stage image    tests/test_image.sh build-image ;;
    *) echo "unknown stage $s" >&2; failed=$((failed + 1)); failed_names+=("$s") ;;
  esac
done

[ $failed -gt 0 ] && echo "failed stages: ${failed_names[*]}"
echo "stages: $passed passed, $failed failed, $skipped skipped"
[ $failed -eq 0 ]
