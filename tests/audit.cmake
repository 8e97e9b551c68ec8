# The hardening of the daemon: the cache audit (--audit-rate), the
# test-only fault hooks, and the small fixes around them.
#
# test_hardening (unit) and test_integration_hardening run in every build;
# test_integration_audit needs the hooks (--fault-corrupt-after,
# --fault-wedge-after) and is built only with -DSLOTD_FAULT_INJECTION=ON,
# as the `plain` stage of scripts/test.sh configures it.  The integration
# entries reuse slotd_itest and the environment of integration.cmake.

slotd_check_test(test_hardening SOURCES test_hardening.c LIBS slotd_server)

set(_audit_itests test_integration_hardening)
if(SLOTD_FAULT_INJECTION)
  list(APPEND _audit_itests test_integration_audit)
endif()
foreach(_name IN LISTS _audit_itests)
  slotd_check_test(${_name} SOURCES ${_name}.c LIBS slotd_itest slotd_core cjson TIMEOUT 180)
  add_dependencies(${_name} slotd)
  set_tests_properties(${_name} PROPERTIES ENVIRONMENT "${_itest_env}" LABELS integration)
endforeach()
