# Admin port and metrics: their Check suites, the promtool check of the
# rendered exposition, and the admin_http fuzz harness with its corpus
# replay.

option(SLOTD_FUZZ "Build libFuzzer harnesses (clang)" OFF)

slotd_check_test(test_admin SOURCES test_admin.c LIBS slotd_server cjson)
slotd_check_test(test_metrics SOURCES test_metrics.c LIBS slotd_server)
set_tests_properties(test_admin test_metrics PROPERTIES LABELS unit)

# promtool lints what metrics_render() writes, with counters and right
# after start-up.  Skipped (exit 77) only when
# promtool is not installed.
add_test(NAME metrics_promtool
  COMMAND sh -c [[
    if ! command -v promtool >/dev/null 2>&1; then
      echo "SKIPPED: promtool not found (Debian package: prometheus)"
      exit 77
    fi
    "$1" --dump metrics.prom && "$1" --dump-fresh metrics-fresh.prom || exit 1
    promtool check metrics < metrics.prom || exit 1
    promtool check metrics < metrics-fresh.prom
  ]] sh $<TARGET_FILE:test_metrics>
  WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
set_tests_properties(metrics_promtool PROPERTIES TIMEOUT 60 SKIP_RETURN_CODE 77 LABELS unit)

# The fuzz harness with a plain main(): replays the seed corpus through the
# same checks in every build.
add_executable(fuzz_admin_replay fuzz_admin.c)
target_include_directories(fuzz_admin_replay PRIVATE ${PROJECT_SOURCE_DIR})
target_link_libraries(fuzz_admin_replay PRIVATE slotd_server slotd_flags)
add_test(NAME fuzz_admin_replay
  COMMAND fuzz_admin_replay ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/corpus/admin)
set_tests_properties(fuzz_admin_replay PROPERTIES TIMEOUT 120 LABELS unit)

# The libFuzzer build: the code under test is compiled into the harness
# with coverage and sanitizers.
if(SLOTD_FUZZ)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(WARNING "SLOTD_FUZZ needs clang (CC=clang); fuzz_admin is not built")
  else()
    get_target_property(_admin_proto_src slotd_proto SOURCES)
    get_target_property(_admin_proto_dir slotd_proto SOURCE_DIR)
    set(_admin_fuzz_src
      ${PROJECT_SOURCE_DIR}/server/admin/admin_http.c ${PROJECT_SOURCE_DIR}/server/admin/metrics.c
      ${PROJECT_SOURCE_DIR}/server/admin/procstat.c ${PROJECT_SOURCE_DIR}/server/base/auth.c
      ${PROJECT_SOURCE_DIR}/server/base/log.c)
    foreach(_src IN LISTS _admin_proto_src)
      if(NOT IS_ABSOLUTE ${_src})
        set(_src ${_admin_proto_dir}/${_src})
      endif()
      list(APPEND _admin_fuzz_src ${_src})
    endforeach()
    add_executable(fuzz_admin fuzz_admin.c ${_admin_fuzz_src})
    target_include_directories(fuzz_admin PRIVATE ${PROJECT_SOURCE_DIR})
    target_compile_definitions(fuzz_admin PRIVATE SLOTD_LIBFUZZER=1)
    target_compile_options(fuzz_admin PRIVATE
      -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
    target_link_options(fuzz_admin PRIVATE -fsanitize=fuzzer,address,undefined)
    target_link_libraries(fuzz_admin PRIVATE
      slotd_core slotd_http_parser PkgConfig::LIBUV cjson slotd_flags)
  endif()
endif()
