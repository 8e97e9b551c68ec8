# server/: the session map, settings and the worker pool.  The daemon as a
# whole is tested over TCP by the integration suites.
slotd_check_test(test_session_map SOURCES test_session_map.c LIBS slotd_server)
slotd_check_test(test_config SOURCES test_config.c LIBS slotd_server)
slotd_check_test(test_sched SOURCES test_sched.c LIBS slotd_server)
slotd_check_test(test_worker SOURCES test_worker.c LIBS slotd_server PkgConfig::LIBUV)
