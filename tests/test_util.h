/*
 * test_util.h: small things several Check suites share.
 *
 * SLOTD_TEST_SCALED(n): an iteration count, cut to a tenth (at least 1)
 * when the test runs under valgrind, whose 20-50x slowdown would otherwise
 * push the heaviest randomized loops past their CTest timeouts.  The cases
 * kept are the same seeded sequence's first tenth, so a failure found under
 * valgrind reproduces natively.
 */
#ifndef SLOTD_TESTS_TEST_UTIL_H
#define SLOTD_TESTS_TEST_UTIL_H

#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#define SLOTD_UNDER_VALGRIND() (RUNNING_ON_VALGRIND != 0)
#endif
#endif
#ifndef SLOTD_UNDER_VALGRIND
#define SLOTD_UNDER_VALGRIND() 0
#endif

#define SLOTD_TEST_SCALED(n) (SLOTD_UNDER_VALGRIND() ? ((n) / 10 > 0 ? (n) / 10 : 1) : (n))

#endif
