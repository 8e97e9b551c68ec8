# server/: the session map, settings and the worker pool.  The daemon as a
# whole is tested over TCP by the integration suites.
slotd_check_test(test_session_map SOURCES test_session_map.c LIBS slotd_server)
slotd_check_test(test_config SOURCES test_config.c LIBS slotd_server)
slotd_check_test(test_sched SOURCES test_sched.c LIBS slotd_server)
slotd_check_test(test_tenants SOURCES test_tenants.c LIBS slotd_server)
slotd_check_test(test_worker SOURCES test_worker.c LIBS slotd_server PkgConfig::LIBUV)

# The layout rule of docs/design.md ("server/ layout"): inside server/,
# proto/ and cache/ no two files call each other both ways.  Read from the
# object files' symbol tables, so the test follows the code as built.
foreach(mod server proto cache)
  add_test(NAME layout_calls_${mod}
           COMMAND sh ${PROJECT_SOURCE_DIR}/scripts/callgraph.sh ${CMAKE_BINARY_DIR} ${mod})
  set_tests_properties(layout_calls_${mod} PROPERTIES TIMEOUT 60 LABELS layout)
endforeach()
