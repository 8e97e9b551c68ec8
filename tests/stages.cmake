# The stale-cache stages (tests/test_stages.c) against the real engine, and
# the proof that they can fail: the same binary run on the deliberately
# vulnerable engines of tests/vuln_cache.c.  An expect-fail entry passes
# only if Check reports that stage as an assertion failure carrying the
# stage's own tag: a crash, a timeout or a pass makes it fail.

slotd_check_test(test_stages
  SOURCES test_stages.c engine_real.c vuln_cache.c
  LIBS slotd_cache slotd_core)

# One process-wide cache, never reset or released: stages 1-4 catch it.
foreach(stage 1 2 3 4)
  add_test(NAME stage${stage}_vuln_expect_fail
           COMMAND test_stages --engine vuln --expect-fail ${stage})
  set_tests_properties(stage${stage}_vuln_expect_fail PROPERTIES TIMEOUT 120 LABELS unit)
endforeach()

# Correct results at the cost of the whole prefix per step: only stage 5
# catches it, and stages 1-4 must pass on it.
add_test(NAME stage5_recompute_expect_fail
         COMMAND test_stages --engine recompute --expect-fail 5)
add_test(NAME stages1to4_recompute_pass
         COMMAND test_stages --engine recompute --stage 1 --stage 2 --stage 3 --stage 4)
set_tests_properties(stage5_recompute_expect_fail stages1to4_recompute_pass
                     PROPERTIES TIMEOUT 120 LABELS unit)
