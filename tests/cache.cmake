# Tests of cache/: the slot pool's Check suite, and the pool under threads
# (meant to run under SANITIZER=thread as well).

slotd_check_test(test_cache SOURCES test_cache.c LIBS slotd_cache TIMEOUT 300)
slotd_check_test(test_pool_stress SOURCES test_pool_stress.c LIBS slotd_cache TIMEOUT 300)
