# Hardening: integration tests against the real daemon under memory
# pressure (test_integration_pressure), hostile clients
# (test_integration_hostile) and at the edges of a connection's life
# (test_integration_conn: --conn-timeout, running out of file descriptors,
# lingering closes in a drain; test_integration_handshake: connections before
# their auth, the PROXY protocol header), and the subset of the integration suite that
# scripts/test.sh's valgrind stage runs with the daemon under memcheck.
# Like the integration suite they get the daemon's path in SLOTD_BIN and run
# with `ctest -L integration`.

# Multiplies the CTest timeouts of the tests labelled valgrind (below), for
# a build directory whose tests run the daemon under valgrind; the tests
# read the factor for their own waits from the environment variable
# SLOTD_TIME_SCALE (see tests/itest.h).
set(SLOTD_TEST_TIME_SCALE 1 CACHE STRING "Multiplier of the CTest timeouts of the tests labelled valgrind")

set(_hostile_env "SLOTD_BIN=$<TARGET_FILE:slotd>")
foreach(theme pressure hostile conn handshake)
  set(_name test_integration_${theme})
  slotd_check_test(${_name} SOURCES ${_name}.c LIBS slotd_itest slotd_core cjson TIMEOUT 300)
  add_dependencies(${_name} slotd)
  set_tests_properties(${_name} PROPERTIES ENVIRONMENT "${_hostile_env}" LABELS integration)
endforeach()

# The valgrind subset: the integration suites of the protocol, lifetimes,
# admin port and shutdown, presets built on first use (their weights made
# on another thread, freed at exit), memory pressure and hostile clients
# (about 7.5 minutes of test time under memcheck, 4 minutes of wall time
# with -j2 on 2 cores, before the presets suite, which took 2 minutes alone
# on a loaded machine with its two fault-injection cases).  Left out: the scripts that start no daemon through itest.c
# (test_dockerfile, scaleout, test_config_env) and
# test_integration_hardening, new with the cache audit (about 30 s more).
set(_valgrind_itests
  test_integration_ops test_integration_cache test_integration_errors
  test_integration_malformed test_integration_lifetimes test_integration_admin
  test_integration_shutdown test_integration_pressure test_integration_hostile
  test_integration_presets test_integration_append test_integration_fork
  test_integration_tenants
  test_integration_onfull test_stages_evict)
foreach(_name IN LISTS _valgrind_itests)
  if(TEST ${_name})
    set_property(TEST ${_name} APPEND PROPERTY LABELS valgrind)
    if(SLOTD_TEST_TIME_SCALE GREATER 1)
      get_test_property(${_name} TIMEOUT _timeout)
      math(EXPR _timeout "${_timeout} * ${SLOTD_TEST_TIME_SCALE}")
      set_tests_properties(${_name} PROPERTIES TIMEOUT ${_timeout})
    endif()
  endif()
endforeach()
