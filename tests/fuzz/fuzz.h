/*
 * fuzz.h: what the fuzz harnesses of proto/ share with the replay driver.
 *
 * Each harness defines LLVMFuzzerTestOneInput().  Linked with
 * -fsanitize=fuzzer it is a libFuzzer target; linked with replay.c it runs
 * the saved corpora and regressions as a plain test.  A harness reports a
 * broken property with FUZZ_CHECK, which aborts: both drivers take that as
 * a crash.
 */
#ifndef SLOTD_TESTS_FUZZ_FUZZ_H
#define SLOTD_TESTS_FUZZ_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define FUZZ_CHECK(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);               \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/** Runs one input through the harness.  `data` is `size` bytes, valid
 * during the call.  Returns 0; a failed check aborts. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
