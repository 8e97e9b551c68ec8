# Integration tests: each executable starts the real daemon (the slotd
# target) on free loopback ports and talks to it over TCP, through the
# helpers of itest.c.  CTest hands them the daemon's path in SLOTD_BIN and
# promtool's in PROMTOOL (when found); `ctest -L integration` runs them.

find_program(PROMTOOL_EXECUTABLE promtool)

add_library(slotd_itest STATIC itest.c)
target_include_directories(slotd_itest PUBLIC ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(slotd_itest PUBLIC slotd_core cjson PkgConfig::CHECK PRIVATE slotd_flags)

set(_itest_env "SLOTD_BIN=$<TARGET_FILE:slotd>")
if(PROMTOOL_EXECUTABLE)
  list(APPEND _itest_env "PROMTOOL=${PROMTOOL_EXECUTABLE}")
endif()

foreach(theme ops cache errors messages malformed lifetimes admin shutdown auth presets append fork
              prefix)
  set(_name test_integration_${theme})
  slotd_check_test(${_name} SOURCES ${_name}.c LIBS slotd_itest slotd_core cjson TIMEOUT 90)
  add_dependencies(${_name} slotd)
  set_tests_properties(${_name} PROPERTIES ENVIRONMENT "${_itest_env}" LABELS integration)
endforeach()

# Pipelined against one-at-a-time runs: twenty fresh daemons, so a longer
# timeout than the others, for the sanitizer builds.
slotd_check_test(test_integration_pipeline SOURCES test_integration_pipeline.c
                 LIBS slotd_itest slotd_core cjson TIMEOUT 900)
add_dependencies(test_integration_pipeline slotd)
set_tests_properties(test_integration_pipeline PROPERTIES ENVIRONMENT "${_itest_env}"
                     LABELS integration)

# Batched steps (--max-batch): many sessions of mixed models stepping at
# once, every reply against the uncached reference; with the fault hooks,
# damage after a batched step caught by the audit.
slotd_check_test(test_integration_batch SOURCES test_integration_batch.c
                 LIBS slotd_itest slotd_core cjson TIMEOUT 900)
add_dependencies(test_integration_batch slotd)
set_tests_properties(test_integration_batch PROPERTIES ENVIRONMENT "${_itest_env}"
                     LABELS integration)

# Tenants (--tenants-file): identity, limits across connections, reloads,
# and fairness between tenants, asserted on counts of replies.
slotd_check_test(test_integration_tenants SOURCES test_integration_tenants.c
                 LIBS slotd_itest slotd_core cjson Threads::Threads TIMEOUT 600)
add_dependencies(test_integration_tenants slotd)
set_tests_properties(test_integration_tenants PROPERTIES ENVIRONMENT "${_itest_env}"
                     LABELS integration)

# The fair worker queue (docs/design.md, "Scheduler"): a light client beside
# a flood of base steps, asserted on counts of replies, never on time.
slotd_check_test(test_integration_sched SOURCES test_integration_sched.c
                 LIBS slotd_itest slotd_core cjson Threads::Threads TIMEOUT 600)
add_dependencies(test_integration_sched slotd)
set_tests_properties(test_integration_sched PROPERTIES ENVIRONMENT "${_itest_env}"
                     LABELS integration)

# A drain seen by clients that read late, keep writing, or pipeline deep
# (docs/operations.md, "Draining it").  The same deep pipeline through
# HAProxy on deploy/haproxy.cfg is an entry of its own, skipped (77) where
# haproxy is not installed.
slotd_check_test(test_integration_drain SOURCES test_integration_drain.c
                 LIBS slotd_itest slotd_core cjson TIMEOUT 120)
add_dependencies(test_integration_drain slotd)
target_compile_definitions(test_integration_drain PRIVATE
                           SLOTD_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
set_tests_properties(test_integration_drain PROPERTIES ENVIRONMENT "${_itest_env}"
                     LABELS integration)
add_test(NAME test_integration_drain_proxy COMMAND test_integration_drain proxy)
set_tests_properties(test_integration_drain_proxy PROPERTIES ENVIRONMENT "${_itest_env}"
                     TIMEOUT 120 SKIP_RETURN_CODE 77 LABELS integration)

# GET /sessions over 50,000 live sessions while the session port is used:
# a few hundred thousand lines, so a longer timeout for the sanitizer builds.
slotd_check_test(test_integration_listing SOURCES test_integration_listing.c
                 LIBS slotd_itest slotd_core cjson TIMEOUT 300)
add_dependencies(test_integration_listing slotd)
set_tests_properties(test_integration_listing PROPERTIES ENVIRONMENT "${_itest_env}"
                     LABELS integration)

# Long jobs in slices (docs/design.md, "Long jobs"): results against the
# reference, a light client served beside a long generate, /health kept at
# 200 by progress, a worker without progress still wedged, and a step run
# inside a long one observed once.
slotd_check_test(test_integration_long SOURCES test_integration_long.c
                 LIBS slotd_itest slotd_core cjson Threads::Threads TIMEOUT 600)
add_dependencies(test_integration_long slotd)
set_tests_properties(test_integration_long PROPERTIES ENVIRONMENT "${_itest_env}"
                     LABELS integration)

# Decoding controls (sample, stop, scores): greedy equivalents byte for
# byte, sampled steps batched against the same alone, stop tokens, scores,
# and every bad value refused with nothing changed.
slotd_check_test(test_integration_decode SOURCES test_integration_decode.c
                 LIBS slotd_itest slotd_core cjson TIMEOUT 300)
add_dependencies(test_integration_decode slotd)
set_tests_properties(test_integration_decode PROPERTIES ENVIRONMENT "${_itest_env}"
                     LABELS integration)

# When the pool is full (--on-full refuse|wait|evict, server/evict.c): each
# policy against a 2 MiB pool of `small` sessions, every step of an evicted
# session against the uncached reference; with the fault hooks (part
# "faults"), a session whose step is in flight is never evicted.
slotd_check_test(test_integration_onfull SOURCES test_integration_onfull.c
                 LIBS slotd_itest slotd_core cjson TIMEOUT 300)
add_dependencies(test_integration_onfull slotd)
set_tests_properties(test_integration_onfull PROPERTIES ENVIRONMENT "${_itest_env}"
                     LABELS integration)

# The seed stages (test_stages.c) against the real daemon under --on-full
# evict, its pool kept full (engine_daemon.c): every stage must evict, and
# stage 4 reads an evicted session as holding nothing (docs/protocol.md).
slotd_check_test(test_stages_evict
                 SOURCES test_stages.c engine_real.c vuln_cache.c engine_daemon.c
                 LIBS slotd_itest slotd_cache slotd_core cjson TIMEOUT 300)
target_compile_definitions(test_stages_evict PRIVATE STAGES_DAEMON=1)
add_dependencies(test_stages_evict slotd)
set_tests_properties(test_stages_evict PROPERTIES ENVIRONMENT "${_itest_env}"
                     LABELS integration)
