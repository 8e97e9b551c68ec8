# Tests of core/, the models: the Check suite, the reference's own check of
# the golden values, and the cross-check of the C library against that
# independent Python reference of docs/models.md.

slotd_check_test(test_core SOURCES test_core.c LIBS slotd_core TIMEOUT 120)
target_link_libraries(test_core PRIVATE slotd_fp_strict)

find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  add_executable(crosscheck_dump crosscheck_dump.c)
  target_include_directories(crosscheck_dump PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(crosscheck_dump PRIVATE slotd_core slotd_flags)

  add_test(NAME core_ref_golden
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/ref/slotd_ref.py)
  add_test(NAME core_crosscheck
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/crosscheck.py
                   $<TARGET_FILE:crosscheck_dump>)
  set_tests_properties(core_ref_golden PROPERTIES TIMEOUT 60 LABELS unit)
  set_tests_properties(core_crosscheck PROPERTIES TIMEOUT 120 LABELS unit)
endif()

# The batch calls against the single ones, on every SIMD variant the
# machine has.  The light cases are a unit test (valgrind runs them too);
# `heavy` adds base at every batch size that exercises a kernel's tiles
# and the long prefills, too slow for memcheck.
slotd_check_test(test_batch SOURCES test_batch.c LIBS slotd_core TIMEOUT 1200)
target_link_libraries(test_batch PRIVATE slotd_fp_strict)
add_test(NAME test_batch_heavy COMMAND test_batch heavy)
set_tests_properties(test_batch_heavy PROPERTIES TIMEOUT 1500 LABELS heavy)
