# server/: the session map, settings and the worker pool.  The daemon as a
# whole is tested over TCP by the integration suites.
slotd_check_test(test_session_map SOURCES test_session_map.c LIBS slotd_server)
slotd_check_test(test_config SOURCES test_config.c LIBS slotd_server)
slotd_check_test(test_sched SOURCES test_sched.c LIBS slotd_server)
slotd_check_test(test_tenants SOURCES test_tenants.c LIBS slotd_server)
slotd_check_test(test_worker SOURCES test_worker.c LIBS slotd_server PkgConfig::LIBUV)

# The layout rule of docs/design.md ("server/ layout"): inside server/,
# proto/ and cache/ the files call each other one way, with no circle of
# any length.  Read from the object files' symbol tables, so the test
# follows the code as built.
foreach(mod server proto cache)
  add_test(NAME layout_calls_${mod}
           COMMAND sh ${PROJECT_SOURCE_DIR}/scripts/callgraph.sh ${CMAKE_BINARY_DIR} ${mod})
  set_tests_properties(layout_calls_${mod} PROPERTIES TIMEOUT 60 LABELS layout)
endforeach()
# server/'s rooms call each other one way, and include only the one
# header a room shows (scripts/rooms.sh; docs/design.md, "server/ layout").
add_test(NAME layout_rooms
         COMMAND sh ${PROJECT_SOURCE_DIR}/scripts/rooms.sh ${CMAKE_BINARY_DIR} ${PROJECT_SOURCE_DIR})
set_tests_properties(layout_rooms PROPERTIES TIMEOUT 60 LABELS layout)
# A request line's walk through proto/ enters each file from one place
# (scripts/walk.sh; docs/design.md, "Parsing a request line").
add_test(NAME layout_walk_proto COMMAND sh ${PROJECT_SOURCE_DIR}/scripts/walk.sh ${CMAKE_BINARY_DIR})
set_tests_properties(layout_walk_proto PROPERTIES TIMEOUT 60 LABELS layout)
# A record's fields written only by the file that owns it (the table in
# scripts/writers.sh), and the layout checks' own test on fixtures
# (tests/layout/).
add_test(NAME layout_writers COMMAND sh ${PROJECT_SOURCE_DIR}/scripts/writers.sh ${PROJECT_SOURCE_DIR})
add_test(NAME layout_selftest COMMAND sh ${PROJECT_SOURCE_DIR}/tests/layout/selftest.sh ${PROJECT_SOURCE_DIR})
# No two functions of the product share a name, statics included.
add_test(NAME layout_names COMMAND sh ${PROJECT_SOURCE_DIR}/scripts/names.sh ${PROJECT_SOURCE_DIR})
# Every document and section a comment names exists.
add_test(NAME doc_refs COMMAND python3 ${PROJECT_SOURCE_DIR}/scripts/check_doc_refs.py ${PROJECT_SOURCE_DIR})
add_test(NAME layout_headers COMMAND sh ${PROJECT_SOURCE_DIR}/scripts/headers.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(layout_writers layout_selftest layout_names layout_headers doc_refs PROPERTIES TIMEOUT 60 LABELS layout)
