# Fuzzing of proto/: the line framer, the request parser and validator and the
# PROXY header reader
# (with the reply writers).
#
# Every build replays the seed corpora and the saved regressions through the
# harness code with a plain main() (tests fuzz_replay_*), so an input that
# crashed once stays a test.  With SLOTD_FUZZ=ON (clang only) the same
# harnesses are also built as libFuzzer targets fuzz_framer and fuzz_request;
# tests/fuzz/run.sh runs them.  The fuzz targets compile the proto sources
# (and core/error.c) themselves, so all of that code is instrumented.

option(SLOTD_FUZZ "Build the libFuzzer harnesses of proto/ (needs clang)" OFF)

set(SLOTD_FUZZ_DIR ${CMAKE_CURRENT_SOURCE_DIR}/fuzz)
set(SLOTD_FUZZ_HARNESSES framer request proxy)

foreach(harness ${SLOTD_FUZZ_HARNESSES})
  add_executable(fuzz_replay_${harness} fuzz/fuzz_${harness}.c fuzz/replay.c)
  target_include_directories(fuzz_replay_${harness} PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(fuzz_replay_${harness} PRIVATE slotd_proto cjson ${MATH_LIB} slotd_flags)
  add_test(NAME fuzz_replay_${harness}
           COMMAND fuzz_replay_${harness} ${SLOTD_FUZZ_DIR}/corpus/${harness}
                   ${SLOTD_FUZZ_DIR}/regressions)
  set_tests_properties(fuzz_replay_${harness} PROPERTIES TIMEOUT 120 LABELS unit)
endforeach()

if(SLOTD_FUZZ)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "SLOTD_FUZZ=ON needs clang (configure with CC=clang)")
  endif()
  if(SANITIZER STREQUAL "thread")
    message(FATAL_ERROR "SLOTD_FUZZ=ON builds with ASan; it cannot be combined with SANITIZER=thread")
  endif()
  # Every source of slotd_proto (proto/CMakeLists.txt), instrumented here.
  get_target_property(_fuzz_proto_names slotd_proto SOURCES)
  list(TRANSFORM _fuzz_proto_names PREPEND ${PROJECT_SOURCE_DIR}/proto/
       OUTPUT_VARIABLE _fuzz_proto_sources)
  set(_fuzz_flags -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
                  -fno-omit-frame-pointer)
  foreach(harness ${SLOTD_FUZZ_HARNESSES})
    add_executable(fuzz_${harness} fuzz/fuzz_${harness}.c
                   ${_fuzz_proto_sources}
                   ${PROJECT_SOURCE_DIR}/core/error.c)
    target_include_directories(fuzz_${harness} PRIVATE ${PROJECT_SOURCE_DIR})
    target_compile_options(fuzz_${harness} PRIVATE ${_fuzz_flags})
    target_link_options(fuzz_${harness} PRIVATE ${_fuzz_flags})
    target_link_libraries(fuzz_${harness} PRIVATE cjson ${MATH_LIB} slotd_flags slotd_fp_strict)
  endforeach()
endif()
